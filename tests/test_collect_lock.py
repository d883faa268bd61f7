"""Two `ddpdeploy collect` into one --to at the same moment: one writes and completes, the
other is refused with one line (exit 2) before it writes anything; the folder never holds a
mix of the two runs' files, nor a temp file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from ddpdeploy import fs
from ddpdeploy.collect.checkpoint import payload_name, sidecar_name
from ddpdeploy.errors import UserError

PAYLOAD = 48 << 20  # long enough to copy that the other run reaches the lock meanwhile
DIAGNOSTICS = {"hang-rank0.txt": b"# ddpkit hang watchdog: rank 0 on h, pid 1\nThread 0x1\n"}

# A collect process that has imported all it needs, says so, and starts on stdin's end: two
# of them released together reach --to within milliseconds (a barrier, not a sleep).
CHILD = """
import sys
import ddpdeploy.checkpoints, ddpdeploy.cli, rich.progress
print("ready", flush=True)
sys.stdin.read()
ddpdeploy.cli.main(sys.argv[1:])
"""


def busy_line(to: Path) -> str:
    return (
        f"error: --to: another collect is writing {to}; wait for it to end, or collect into "
        "another folder"
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local run's folder of job `j`: big checkpoints at steps 1 and 2, and diagnostics
    (a flight recorder dump as big, so a --debug run holds --to as long)."""
    root = tmp_path_factory.mktemp("proj")
    folder = root / ".ddpdeploy" / "checkpoints" / "j"
    folder.mkdir(parents=True)
    for step in (1, 2):
        payload = os.urandom(PAYLOAD)
        (folder / payload_name(step)).write_bytes(payload)
        meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
        (folder / sidecar_name(step)).write_text(json.dumps(meta))
    for name, data in {**DIAGNOSTICS, "nccl_trace_rank_0": os.urandom(PAYLOAD // 2)}.items():
        (folder / name).write_bytes(data)
    return root


def expected(project: Path, args: list[str]) -> dict[str, bytes]:
    """What one collect with ``args`` leaves in --to: relative path -> bytes."""
    src = project / ".ddpdeploy" / "checkpoints" / "j"
    step = int(args[args.index("--step") + 1]) if "--step" in args else 2
    want = {n: (src / n).read_bytes() for n in (payload_name(step), sidecar_name(step))}
    if "--debug" in args:
        for name in (*DIAGNOSTICS, "nccl_trace_rank_0"):
            want[f"debug/{name}"] = (src / name).read_bytes()
    return want


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too: a temp file counts): path -> bytes."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() or path.is_symlink():
            out[str(path.relative_to(folder))] = path.read_bytes()
    return out


def race(project: Path, to: Path, *runs: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Each ``runs`` entry as `collect j --to TO ARGS`, all started at the same moment."""
    logs = [to.with_name(f"{to.name}.stderr{i}") for i in range(len(runs))]
    procs = []
    try:
        for args, log in zip(runs, logs, strict=True):
            with log.open("w") as err:  # a file: nobody need read it while they run
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", CHILD, "collect", "j", "--to", str(to), *args],
                        cwd=project,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                    )
                )
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()  # the barrier's release
        for proc in procs:
            proc.wait(timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    return [
        subprocess.CompletedProcess(args, proc.returncode, "", log.read_text())
        for proc, args, log in zip(procs, runs, logs, strict=True)
    ]


PAIRS = {
    "newest-vs-step": (["--from", "local"], ["--from", "local", "--step", "1"]),
    "debug-vs-debug": (
        ["--from", "local", "--debug"],
        ["--from", "local", "--debug", "--step", "1"],
    ),
    "plain-vs-debug": (["--from", "local"], ["--from", "local", "--debug", "--step", "1"]),
}


@pytest.mark.slow  # a dozen pairs of real collect processes, each copying 48 MiB
@pytest.mark.parametrize("pair", PAIRS, ids=list(PAIRS))
def test_two_collects_at_once_one_writes_the_other_is_one_line(project, tmp_path, pair):
    first, second = PAIRS[pair]
    for attempt in range(4):  # a race: run it a few times, half into a folder made by neither
        to = tmp_path / f"out{attempt}"
        if attempt % 2:
            to.mkdir()
        results = race(project, to, first, second)
        codes = [r.returncode for r in results]
        assert sorted(codes) == [0, 2], [r.stderr for r in results]
        winner, loser = results if codes[0] == 0 else results[::-1]
        assert loser.stderr.strip().splitlines() == [busy_line(to)], loser.stderr
        assert "Traceback" not in winner.stderr, winner.stderr
        assert winner.stderr.strip().splitlines()[0].startswith("collected ddpdeploy checkpoint")
        # Exactly the winner's files, whole: none of the loser's, no temp file.
        assert tree(to) == expected(project, list(winner.args)), (attempt, winner.args)


def test_a_folder_another_writer_holds_is_refused_before_anything_is_read(project, tmp_path):
    """The refusal itself, deterministically: the lock held here, as a collect holds it."""
    to = tmp_path / "out"
    to.mkdir()
    (to / "mine.txt").write_bytes(b"kept")
    with fs.FolderLock(to):
        out = run_cli("collect", "j", "--to", str(to), "--from", "local", "--debug", cwd=project)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [busy_line(to)]
    assert tree(to) == {"mine.txt": b"kept"}
    # Released (as a collect's is when it ends, or its process dies): the next one writes.
    again = run_cli("collect", "j", "--to", str(to), "--from", "local", "--step", "1", cwd=project)
    assert again.returncode == 0, again.stderr
    assert tree(to) == {"mine.txt": b"kept", **expected(project, ["--step", "1"])}


def test_a_lock_keeps_a_second_one_out_until_released(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    with fs.FolderLock(folder), pytest.raises(fs.FolderBusy):
        fs.FolderLock(folder)  # another open of the folder: another holder
    with fs.FolderLock(folder):  # released when the block ended
        pass
    assert list(folder.iterdir()) == []  # no lock file, nothing left behind


def test_a_folder_removed_under_its_lock_is_no_lock(tmp_path):
    """A holder that rolled back (removed the folder it made) leaves a lock on a folder
    nobody reaches; a new one made at that path is not held by it."""
    folder = tmp_path / "f"
    folder.mkdir()
    old = fs.FolderLock(folder)
    folder.rmdir()
    folder.mkdir()
    with fs.FolderLock(folder):  # the new folder: free
        pass
    old.release()
    old.release()  # idempotent
    with pytest.raises(UserError, match=r"cannot lock .*/gone: No such file"):
        fs.FolderLock(tmp_path / "gone")
