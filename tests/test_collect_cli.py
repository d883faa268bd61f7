"""`ddpdeploy collect` as users run it: the source is chosen explicitly, NAME is validated on
every job verb, and every destination error is one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

JOB_VERBS = [
    ["collect", "--to", "out", "--from", "local"],
    ["status"],
    ["logs"],
    ["down"],
    ["scale", "--nodes", "2"],
    ["resume"],
]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder where a local run of job `j` left checkpoints at steps 1 and 2."""
    folder = tmp_path / "proj" / ".ddpdeploy" / "checkpoints" / "j"
    folder.mkdir(parents=True)
    for step in (1, 2):
        payload = os.urandom(2000)
        (folder / f"ckpt-step-{step:09d}.pt").write_bytes(payload)
        meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
        (folder / f"ckpt-step-{step:09d}.json").write_text(json.dumps(meta))
    return tmp_path / "proj"


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("verb", JOB_VERBS, ids=[v[0] for v in JOB_VERBS])
@pytest.mark.parametrize("name", ["../../../other", "a,b=c", "UPPER", "x" * 64, ""])
def test_name_is_validated_on_every_job_verb(tmp_path, monkeypatch, capsys, verb, name):
    from ddpdeploy.cli import main  # in-process: 30 cases, each stops at parsing

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([verb[0], name, *verb[1:]])
    assert stop.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: Invalid value for 'NAME': ") and "DNS-1035 label" in line
    assert list(tmp_path.iterdir()) == []


def test_a_bad_name_is_refused_before_any_cluster_call(tmp_path):
    out = run_cli("down", "a,b=c", env={"KUBECONFIG": str(tmp_path / "none")})
    assert out.returncode == 2
    assert one_line(out.stderr).startswith("error: Invalid value for 'NAME': 'a,b=c' must be")


def test_a_local_run_folder_is_taken_and_said(project, tmp_path):
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), cwd=project)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [
        "collect: reading the local run's folder .ddpdeploy/checkpoints/j (--from local)",
        "collected ddpdeploy checkpoint step 2 from .ddpdeploy/checkpoints/j into "
        f"{tmp_path / 'out'}",
    ]


def test_no_local_folder_and_no_from_never_turns_to_the_cluster(tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "would-be-read")}
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), cwd=tmp_path, env=env)
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert "no local run's folder .ddpdeploy/checkpoints/j" in line
    assert "--from cluster" in line and "--from compose --volume" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_plain_files_say_which_format(tmp_path):
    folder = tmp_path / ".ddpdeploy" / "checkpoints" / "s"
    folder.mkdir(parents=True)
    (folder / "snapshot.pt").write_bytes(b"weights")
    (folder / "[bold]x\x1b]0;t").write_bytes(b"a name with markup and an escape")
    (folder / "[red]link").symlink_to(folder / "snapshot.pt")
    out = run_cli("collect", "s", "--to", "out", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (
        out.stderr.strip().splitlines()[-1]
        == "collected 1 plain file (with SHA256SUMS) from .ddpdeploy/checkpoints/s into out"
    )
    assert "skipping [red]link" in out.stderr and "[bold]x\\x1b]0;t" in out.stderr
    assert "\x1b" not in out.stderr
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "out")
    assert check.returncode == 0


def test_an_existing_different_file_is_refused_by_name(project, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "ckpt-step-000000002.pt").write_bytes(b"mine")
    out = run_cli("collect", "j", "--to", str(dest), cwd=project)
    assert out.returncode == 2
    assert "ckpt-step-000000002.pt already exists and differs; pass --overwrite" in out.stderr
    assert (dest / "ckpt-step-000000002.pt").read_bytes() == b"mine"
    assert sorted(p.name for p in dest.iterdir()) == ["ckpt-step-000000002.pt"]
    again = run_cli("collect", "j", "--to", str(dest), "--overwrite", cwd=project)
    assert again.returncode == 0, again.stderr
    assert (dest / "ckpt-step-000000002.pt").read_bytes() != b"mine"


def _unshare_ok() -> bool:
    if not (shutil.which("unshare") and hasattr(os, "geteuid") and os.geteuid() == 0):
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(
    not _unshare_ok(), reason="needs root and mount namespaces (unshare -m) for a real mount"
)


def _collect_under_mount(project: Path, mount: Path, options: str, to: Path):
    """collect, run inside a private mount namespace with a tmpfs at ``mount``."""
    script = (
        f'mount -t tmpfs -o {options} none {mount} && exec "$0" -m ddpdeploy collect j --to {to}'
    )
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, sys.executable],
        cwd=project,
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
    )


@needs_mounts
def test_a_read_only_mount_is_one_line(project, tmp_path):
    (tmp_path / "ro").mkdir()
    out = _collect_under_mount(project, tmp_path / "ro", "ro,size=1m", tmp_path / "ro" / "x")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("collect: reading the local run's folder")
    assert lines[1].startswith("error: --to: ") and "read-only file system" in lines[1]


@needs_mounts
def test_a_full_disk_is_one_line_and_leaves_nothing(project, tmp_path):
    (tmp_path / "small").mkdir()
    out = _collect_under_mount(project, tmp_path / "small", "size=4k", tmp_path / "small" / "x")
    # The system refused, not the user's input: exit 1, as for every writer (fs).
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: --to: cannot write ")
    assert "No space left on device" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(
    not (shutil.which("setpriv") and hasattr(os, "geteuid") and os.geteuid() == 0),
    reason="root bypasses file permissions; setpriv drops that",
)
def test_a_folder_without_write_permission_is_one_line(project, tmp_path):
    dest = tmp_path / "locked"
    dest.mkdir(mode=0o555)
    args = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable]
    for to in (dest, dest / "sub"):
        out = subprocess.run(
            [*args, "-m", "ddpdeploy", "collect", "j", "--to", str(to)],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("error: --to: ") and "permission denied" in last
        assert list(dest.iterdir()) == []
