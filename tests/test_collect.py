"""`ddpdeploy collect --from local` on the checkpoints of a real `smoke --local` run."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from cli_runner import run_cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A folder in which a 1-node smoke run left checkpoints at steps 2, 4 and 6."""
    path = tmp_path_factory.mktemp("smoke")
    (path / "ddpdeploy.yaml").write_text(
        "name: c\ncheckpoint: {claimName: local}\n"
        "command: {args: [--checkpoint-every, '2', --keep, '3']}\n"
    )
    out = run_cli("smoke", "--local", "--procs", "1", "--steps", "6", cwd=path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return path


def _check(dest, step):
    meta = json.loads((dest / f"ckpt-step-{step:09d}.json").read_text())
    payload = (dest / meta["file"]).read_bytes()
    assert hashlib.sha256(payload).hexdigest() == meta["sha256"]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [f"ckpt-step-{step:09d}.json", meta["file"]]
    )  # nothing else: no temp files, no half checkpoint


def test_collects_the_newest_then_skips_a_corrupt_one(run_dir, tmp_path):
    out = run_cli("collect", "c", "--to", str(tmp_path / "a"), cwd=run_dir)
    assert out.returncode == 0, out.stderr
    assert "step 6" in out.stderr
    _check(tmp_path / "a", 6)
    picked = run_cli("collect", "c", "--to", str(tmp_path / "b"), "--step", "2", cwd=run_dir)
    assert picked.returncode == 0, picked.stderr
    _check(tmp_path / "b", 2)
    # Corrupt the newest payload: it is skipped with a warning, the next one is taken.
    src = run_dir / ".ddpdeploy" / "checkpoints" / "c"
    newest = json.loads((src / "ckpt-step-000000006.json").read_text())["file"]
    data = bytearray((src / newest).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (src / newest).write_bytes(bytes(data))
    out = run_cli("collect", "c", "--to", str(tmp_path / "c"), cwd=run_dir)
    assert out.returncode == 0, out.stderr
    assert "warning: checkpoint at step 6" in out.stderr and "corrupt" in out.stderr
    _check(tmp_path / "c", 4)
    named = run_cli("collect", "c", "--to", str(tmp_path / "d"), "--step", "6", cwd=run_dir)
    assert named.returncode == 1 and "no intact checkpoint" in named.stderr
    assert list((tmp_path / "d").iterdir()) == []
    missing = run_cli("collect", "c", "--to", str(tmp_path / "e"), "--step", "99", cwd=run_dir)
    assert missing.returncode == 2 and "--step: no checkpoint at step 99" in missing.stderr
    other = run_cli("collect", "nope", "--to", str(tmp_path / "f"), "--from", "local", cwd=run_dir)
    assert other.returncode == 2 and "no checkpoint folder" in other.stderr


class _ExecFromFolder:
    """Stands in for the exec API (which needs a kubelet): runs `ls`/`cat` on a local
    folder and hands the bytes back in small, uneven chunks, as a websocket does."""

    def __init__(self, folder):
        self.folder = folder

    def exec_stream(self, pod, namespace, container, argv):
        import subprocess

        data = subprocess.run(argv, cwd=self.folder, capture_output=True, check=True).stdout
        for i in range(0, len(data), 7):
            yield data[i : i + 7]


def test_pod_source_reads_through_exec_chunks(tmp_path):
    from ddpdeploy.checkpoints import collect
    from ddpdeploy.clustercollect import PodSource

    folder = tmp_path / "vol"
    folder.mkdir()
    for step in (3, 5):
        payload = bytes(range(256)) * (step * 10)
        (folder / f"ckpt-step-{step:09d}.pt").write_bytes(payload)
        meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
        meta["file"] = f"ckpt-step-{step:09d}.pt"
        (folder / f"ckpt-step-{step:09d}.json").write_text(json.dumps(meta))
    (folder / "ckpt-step-000000007.pt").write_bytes(b"no sidecar: not a checkpoint")
    source = PodSource(_ExecFromFolder(folder), "j-worker-0", "ns", "pytorch", str(folder))
    warnings: list[str] = []
    assert collect(source, tmp_path / "out", None, warnings.append) == 5
    assert warnings == []
    _check(tmp_path / "out", 5)


def _checkpoint(folder, step, payload=None, **meta):
    payload = payload if payload is not None else f"weights at {step}".encode() * 100
    (folder / f"ckpt-step-{step:09d}.pt").write_bytes(payload)
    sidecar = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
    sidecar["file"] = f"ckpt-step-{step:09d}.pt"
    (folder / f"ckpt-step-{step:09d}.json").write_text(json.dumps({**sidecar, **meta}))
    return payload


def test_local_source_trusts_no_file_it_reads(tmp_path):
    """The payload's name comes from the step (not the sidecar's `file`), a payload swapped
    for a symlink is refused, a missing one falls back to the one before."""
    from ddpdeploy.checkpoints import LocalSource, collect

    src = tmp_path / "src"
    src.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    _checkpoint(src, 2)
    _checkpoint(src, 4, file="../../../.bashrc")  # a hostile `file`: ignored
    _checkpoint(src, 6)
    (src / "ckpt-step-000000006.pt").unlink()  # vanished since the sidecar was written
    _checkpoint(src, 8, payload=b"not yours")
    (src / "ckpt-step-000000008.pt").unlink()
    (src / "ckpt-step-000000008.pt").symlink_to(secret)  # sha256 matches the link's target
    warnings: list[str] = []
    dest = tmp_path / "to"
    assert collect(LocalSource(src), dest, None, warnings.append) == 4
    assert [w.split(" in ")[0] for w in warnings] == [
        "checkpoint at step 8",
        "checkpoint at step 6",
    ]
    _check(dest, 4)
    assert json.loads((dest / "ckpt-step-000000004.json").read_text())["file"] == (
        "ckpt-step-000000004.pt"
    )
    assert not (tmp_path / ".bashrc").exists()


def test_a_destination_that_is_a_file_is_one_line(tmp_path):
    src = tmp_path / "run" / ".ddpdeploy" / "checkpoints" / "c"
    src.mkdir(parents=True)
    _checkpoint(src, 2)
    (tmp_path / "taken").write_text("x")
    res = run_cli("collect", "c", "--to", str(tmp_path / "taken"), cwd=tmp_path / "run")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    # lstrip: the progress bar, stopped on the way out, leaves an empty line (commands/collect)
    line = res.stderr.lstrip("\n")
    assert line.startswith(f"error: --to: cannot write {tmp_path / 'taken'}: File exists")
    assert line.count("\n") == 1


@pytest.mark.parametrize("taken", ["ckpt-step-000000002.pt", "ckpt-step-000000002.json"])
def test_nothing_in_to_is_replaced(tmp_path, taken):
    from ddpdeploy.checkpoints import LocalSource, collect
    from ddpdeploy.errors import UserError

    src = tmp_path / "src"
    src.mkdir()
    _checkpoint(src, 2)
    dest = tmp_path / "to"
    assert collect(LocalSource(src), dest, None, print) == 2
    assert collect(LocalSource(src), dest, None, print) == 2  # the same again: fine
    _check(dest, 2)
    (dest / taken).write_bytes(b"the user's own file")
    with pytest.raises(UserError, match=f"--to: {dest / taken} already exists and is not"):
        collect(LocalSource(src), dest, None, print)
    assert (dest / taken).read_bytes() == b"the user's own file"
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]  # no temp left


def test_no_replace_commit_never_replaces(tmp_path):
    from ddpdeploy.adapters.files import Staged

    (tmp_path / "a").write_bytes(b"old")
    with Staged(tmp_path / "a") as out:
        out.write(b"new")
        with pytest.raises(FileExistsError):
            out.commit(replace=False)
    assert (tmp_path / "a").read_bytes() == b"old" and os.listdir(tmp_path) == ["a"]
