"""`ddpdeploy collect --debug`: the hang stacks, flight recorder dumps and NCCL debug logs a
run leaves beside its checkpoints, into --to/debug/, from a local folder and a pod (the
compose volume: tests/docker/test_collect_volume.py)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from cli_runner import run_cli
from reports import Recorded
from test_collect_pod import ExecHere

from ddpdeploy.collect.checkpoint import collect, payload_name, sidecar_name
from ddpdeploy.collect.debug import MAX_DEBUG
from ddpdeploy.collect.pod import PodSource
from ddpdeploy.collect.source import LocalSource, NoCheckpoint
from ddpdeploy.errors import UserError

NOTE = f"\n# ddpdeploy collect: cut here at {MAX_DEBUG} bytes; the file was longer\n".encode()


def put_checkpoint(folder: Path, step: int) -> bytes:
    payload = os.urandom(5000)
    (folder / payload_name(step)).write_bytes(payload)
    meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
    (folder / sidecar_name(step)).write_text(json.dumps(meta))
    return payload


def put_diagnostics(folder: Path) -> dict[str, bytes]:
    files = {
        "hang-rank0.txt": b"# ddpkit hang watchdog: rank 0 on h, pid 1, last step 4\nThread 0x1\n",
        "hang-rank1.txt": b"# ddpkit hang watchdog: rank 1 on h, pid 2, last step 4\nThread 0x2\n",
        "nccl_trace_rank_0": os.urandom(3000),  # a pickle, as torch writes it
        "ddpkit-nccl.node-1.4242.log": b"node-1:4242 NCCL INFO NET/Socket : Using [0]eth0\n",
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".ddpdeploy" / "checkpoints" / "j").mkdir(parents=True)
    return tmp_path


def run_folder(project: Path) -> Path:
    return project / ".ddpdeploy" / "checkpoints" / "j"


def test_the_checkpoint_and_every_diagnostics_file_come_home(project, tmp_path):
    folder = run_folder(project)
    payload = put_checkpoint(folder, 3)
    files = put_diagnostics(folder)
    (folder / "hang-rank0.txt.tmp").write_bytes(b"not a name of ours")
    (folder / "notes.txt").write_bytes(b"not a diagnostics file")
    to = tmp_path / "out"
    out = run_cli("collect", "j", "--to", str(to), "--debug", cwd=project)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.strip().splitlines()
    assert (
        lines[1] == f"collected ddpdeploy checkpoint step 3 from .ddpdeploy/checkpoints/j into {to}"
    )
    assert lines[2:] == [
        f"debug: {to}/debug/ddpkit-nccl.node-1.4242.log  49 bytes  NCCL debug log",
        f"debug: {to}/debug/hang-rank0.txt  67 bytes  hang stack: # ddpkit hang watchdog: "
        "rank 0 on h, pid 1, last step 4",
        f"debug: {to}/debug/hang-rank1.txt  67 bytes  hang stack: # ddpkit hang watchdog: "
        "rank 1 on h, pid 2, last step 4",
        f"debug: {to}/debug/nccl_trace_rank_0  2.9 KiB  flight recorder dump",
        f"debug: 2 hang stacks, 1 flight recorder dump, 1 NCCL debug log into {to}/debug",
    ]
    assert (to / payload_name(3)).read_bytes() == payload
    assert sorted(p.name for p in to.iterdir()) == sorted(
        ["debug", payload_name(3), sidecar_name(3)]
    )
    assert {p.name: p.read_bytes() for p in (to / "debug").iterdir()} == files


def test_no_diagnostics_file_is_one_line_and_exit_0_beside_a_checkpoint(project, tmp_path):
    put_checkpoint(run_folder(project), 1)
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), "--debug", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "debug: no diagnostics files in .ddpdeploy/checkpoints/j (hang-rank*.txt, "
        "nccl_trace_rank_*, ddpkit-nccl.*.log)"
    )
    assert not (tmp_path / "out" / "debug").exists()


def test_nothing_at_all_is_exit_1_and_one_line(project, tmp_path):
    (run_folder(project) / ".hidden.tmp").write_bytes(b"x")
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), "--debug", cwd=project)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: nothing to collect in .ddpdeploy/checkpoints/j: no checkpoint and no "
        "diagnostics files (hang-rank*.txt, nccl_trace_rank_*, ddpkit-nccl.*.log)"
    )
    assert not (tmp_path / "out").exists()


def test_hostile_entries_are_refused_or_cut_and_never_shown_as_markup(project, tmp_path):
    folder = run_folder(project)
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    (folder / "hang-rank0.txt").symlink_to(secret)
    os.mkfifo(folder / "hang-rank1.txt")
    with open(folder / "hang-rank2.txt", "wb") as f:  # 2 GB, sparse: cut at the bound
        f.write(b"# [bold red]rank 2[/] \x1b]0;owned\x07\x1b[2J\n")
        f.truncate(2 << 30)
    with open(folder / "nccl_trace_rank_3", "wb") as f:  # a dump that big is refused
        f.truncate(2 << 30)
    (folder / "hang-rank4.txt\x1b[31m").write_bytes(b"an escape in the name")
    (folder / "nccl_trace_rank_5\n").write_bytes(b"a line break in the name")
    (folder / "hang-rank6.txt").write_bytes(b"[link=file:///etc]x[/link]\n")
    to = tmp_path / "out"
    out = run_cli("collect", "j", "--to", str(to), "--debug", cwd=project, timeout=60)
    assert out.returncode == 0, out.stderr
    err = out.stderr
    assert "\x1b" not in err and "\x07" not in err and "Traceback" not in err
    assert "warning: skipping hang-rank0.txt in .ddpdeploy/checkpoints/j: a symlink" in err
    assert "warning: skipping hang-rank1.txt in .ddpdeploy/checkpoints/j: a special file" in err
    assert "hang-rank2.txt in .ddpdeploy/checkpoints/j is over 32 MiB: cut there" in err
    assert "skipping nccl_trace_rank_3 in .ddpdeploy/checkpoints/j: is over 32 MiB: refused" in err
    # Shown as the characters they are: markup not applied, escapes made U+FFFD.
    assert "hang stack (cut at 32 MiB): # [bold red]rank 2[/] \ufffd\ufffd" in err
    assert "hang stack: [link=file:///etc]x[/link]" in err
    assert "no checkpoint in .ddpdeploy/checkpoints/j yet: collected the diagnostics only" in err
    assert err.strip().splitlines()[-1] == (
        f"debug: 2 hang stacks, 0 flight recorder dumps, 0 NCCL debug logs into {to}/debug"
    )
    assert sorted(p.name for p in (to / "debug").iterdir()) == ["hang-rank2.txt", "hang-rank6.txt"]
    cut = to / "debug" / "hang-rank2.txt"
    assert cut.stat().st_size == MAX_DEBUG + len(NOTE)
    with open(cut, "rb") as f:
        f.seek(MAX_DEBUG)
        assert f.read() == NOTE
    assert secret.read_bytes() == b"not yours"
    # No SHA256SUMS of escaping names, no plain copy of the diagnostics either.
    assert sorted(p.name for p in to.iterdir()) == ["debug"]


def test_a_different_file_in_the_destination_is_refused_unless_overwrite(project, tmp_path):
    folder = run_folder(project)
    put_checkpoint(folder, 2)
    files = put_diagnostics(folder)
    to = tmp_path / "out"
    (to / "debug").mkdir(parents=True)
    (to / "debug" / "hang-rank1.txt").write_bytes(b"mine")
    out = run_cli("collect", "j", "--to", str(to), "--debug", cwd=project)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: --to: {to}/debug/hang-rank1.txt already exists and differs; pass "
        "--overwrite to replace it, or collect into another folder"
    )
    # Nothing half-written: the checkpoint copied before the refusal is gone again.
    assert sorted(p.relative_to(to).as_posix() for p in to.rglob("*")) == [
        "debug",
        "debug/hang-rank1.txt",
    ]
    assert (to / "debug" / "hang-rank1.txt").read_bytes() == b"mine"
    again = run_cli("collect", "j", "--to", str(to), "--debug", "--overwrite", cwd=project)
    assert again.returncode == 0, again.stderr
    assert (to / "debug" / "hang-rank1.txt").read_bytes() == files["hang-rank1.txt"]
    same = run_cli("collect", "j", "--to", str(to), "--debug", cwd=project)
    assert same.returncode == 0, same.stderr  # identical files are kept as they are


def test_ctrl_c_mid_copy_leaves_no_file_behind(project, tmp_path):
    folder = run_folder(project)
    put_checkpoint(folder, 1)
    put_diagnostics(folder)
    (folder / "hang-rank7.txt").write_bytes(os.urandom(3 << 20))  # several chunks
    to = tmp_path / "out"

    def interrupt(copied: float) -> None:
        if copied > 5000 + (1 << 20):  # inside hang-rank7.txt, after the first ones
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect(LocalSource(folder), to, report=Recorded(interrupt), debug=True)
    assert not to.exists()  # the checkpoint and the stacks already copied went too
    assert not [p for p in tmp_path.rglob("*ddpdeploy-tmp*")]


class LyingExec(ExecHere):
    """The exec stand-in, with a file that grows between collect's two reads of it."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder, self.reads, self.sent = folder, 0, 0

    def exec_stream(self, pod, namespace, container, argv):
        if "ddpdeploy-refused" in argv[2] and argv[4].endswith("hang-rank1.txt"):
            self.reads += 1
            if self.reads == 2:
                with open(self.folder / "hang-rank1.txt", "ab") as f:
                    f.write(b"more\n")
        for chunk in super().exec_stream(pod, namespace, container, argv):
            self.sent += len(chunk)
            yield chunk


def test_the_pod_source_brings_the_diagnostics_and_sends_no_more_than_the_bound(tmp_path):
    vol = tmp_path / "vol"
    vol.mkdir()
    files = put_diagnostics(vol)
    with open(vol / "hang-rank2.txt", "wb") as f:
        f.truncate(2 << 30)  # 2 GB: the pod's reader stops at 33 MiB
    (vol / "hang-rank3.txt").symlink_to("/etc/passwd")
    exec_ = LyingExec(vol)
    said = Recorded()
    warnings = said.warnings
    source = PodSource(exec_, "j-master-0", "ns", "pytorch", str(vol))
    got = collect(source, tmp_path / "out", report=said, debug=True)
    assert got.no_checkpoint and got.step is None
    assert sorted(f.name for f in got.debug or []) == [
        "ddpkit-nccl.node-1.4242.log",
        "hang-rank0.txt",
        "hang-rank2.txt",
        "nccl_trace_rank_0",
    ]
    assert got.debug_summary() == "2 hang stacks, 1 flight recorder dump, 1 NCCL debug log"
    text = "\n".join(warnings)
    assert "skipping hang-rank1.txt in pod j-master-0" in text and "changed between" in text
    assert "skipping hang-rank3.txt in pod j-master-0" in text and "a symlink" in text
    assert exec_.sent < 3 * 34 << 20  # the 2 GB file was read three times at most 33 MiB
    out = tmp_path / "out" / "debug"
    assert (out / "nccl_trace_rank_0").read_bytes() == files["nccl_trace_rank_0"]
    assert (out / "hang-rank2.txt").stat().st_size == MAX_DEBUG + len(NOTE)
    assert not (out / "hang-rank1.txt").exists()


def test_the_pod_reader_without_gnu_dd_bounds_too(tmp_path):
    """The busybox branch of the reader (no `dd iflag=nofollow`) with a bound."""
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(5 << 20)
    from ddpdeploy.collect.pod import READ

    program = READ.replace("iflag=nofollow status=none 2>/dev/null", "iflag=no-such-flag 2>&-")
    assert program != READ  # the probe for GNU dd now fails: the other branch runs
    res = subprocess.run(["sh", "-c", program, "sh", str(big), "2"], capture_output=True)
    assert res.returncode == 0 and len(res.stdout) == 2 << 20


def test_without_debug_a_run_with_only_stacks_is_plain_files_as_before(project, tmp_path):
    folder = run_folder(project)
    put_diagnostics(folder)
    got = collect(LocalSource(folder), tmp_path / "out")
    assert len(got.files) == 4 and got.debug is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoCheckpoint, match="no checkpoint and no diagnostics files"):
        collect(LocalSource(tmp_path / "empty"), tmp_path / "o2", debug=True)
    assert not (tmp_path / "o2").exists()


def test_step_with_debug_still_names_a_missing_step(project, tmp_path):
    folder = run_folder(project)
    put_checkpoint(folder, 1)
    put_diagnostics(folder)
    with pytest.raises(UserError, match="--step: no checkpoint at step 9"):
        collect(LocalSource(folder), tmp_path / "out", 9, debug=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # torchrun agents
def test_a_real_hang_then_collect_debug_brings_every_ranks_stacks(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "ddpdeploy.yaml").write_text(
        "name: hung\nnodes: 2\nprocs: 2\ncheckpoint: {claimName: local}\n"
        "command: {args: [--debug-hang-rank, '2:4', --hang-timeout-s, '3']}\n"
    )
    res = run_cli("smoke", "--local", "--steps", "500", cwd=tmp_path, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error: hang: hung at step 4" in res.stderr
    to = tmp_path / "out"
    out = run_cli("collect", "hung", "--to", str(to), "--debug", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    stacks = sorted((to / "debug").glob("hang-rank*.txt"))
    assert [p.name for p in stacks] == [f"hang-rank{r}.txt" for r in range(4)]
    host = socket.gethostname()
    for rank, path in enumerate(stacks):
        text = path.read_text()
        assert text.startswith(f"# ddpkit hang watchdog: rank {rank} on {host}, pid ")
        assert "most recent call first" in text
        line = f"debug: {path}  "
        assert any(ln.startswith(line) for ln in out.stderr.splitlines()), out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("debug: 4 hang stacks, 0 flight recorder dumps, 0 NCCL debug logs into ")
    )


def test_the_compose_staging_writes_a_bounded_file_only_that_far(tmp_path):
    """What the engine's archive holds is staged on this disk: a bounded name no further
    than its bound (the rest of the stream is skipped), the others whole."""
    import io
    import tarfile

    from ddpdeploy.collect.volume import _extract_files

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry, size in (("hang-rank0.txt", 5 << 20), ("after.pt", 3 << 20)):
            info = tarfile.TarInfo(entry)
            info.size = size
            tar.addfile(info, io.BytesIO(b"x" * size))
    buf.seek(0)
    with tarfile.open(fileobj=buf, mode="r|") as tar:
        others = _extract_files(tar, tmp_path, lambda n: 1000 if n.startswith("hang") else None)
    assert others == {}
    assert (tmp_path / "hang-rank0.txt").stat().st_size == 1000
    assert (tmp_path / "after.pt").stat().st_size == 3 << 20


def test_a_diagnostics_file_named_with_file_is_that_plain_file(project, tmp_path):
    folder = run_folder(project)
    files = put_diagnostics(folder)
    to = tmp_path / "out"
    got = collect(LocalSource(folder), to, files=["hang-rank0.txt"], debug=True)
    assert got.files == ["hang-rank0.txt"] and not got.no_checkpoint
    assert (to / "hang-rank0.txt").read_bytes() == files["hang-rank0.txt"]
    assert sorted(f.name for f in got.debug or []) == [
        "ddpkit-nccl.node-1.4242.log",
        "hang-rank1.txt",
        "nccl_trace_rank_0",
    ]
