"""`ddpdeploy collect` (and `--debug`) onto a disk that fills during the copy: one line
naming the file and "No space left on device", exit 1 (the system refused, as for every
writer), and --to as it was: no temp file, no half checkpoint, no debug/ folder, what was
there before untouched. A real tmpfs of 2 MiB, filled so that the copy runs out midway."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest
from cli_runner import run_cli
from fs_helpers import mount_tmpfs, tmpfs_mountpoint

from ddpdeploy.collect.checkpoint import payload_name, sidecar_name

mountpoint = tmpfs_mountpoint  # the fixture (unmounts in its finalizer), by the name used here

BIG = 1 << 20  # the file that does not fit
ROOM = 256 << 10  # what is left free on the tmpfs: the rest of the copy fits, BIG does not


def put_checkpoint(folder: Path, step: int, size: int) -> None:
    payload = os.urandom(size)
    (folder / payload_name(step)).write_bytes(payload)
    meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
    (folder / sidecar_name(step)).write_text(json.dumps(meta))


def fill(mount: Path, leave: int) -> Path:
    """Fill the tmpfs up, then free ``leave`` bytes of it."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        block = b"\0" * (64 << 10)
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return filler


def tree(folder: Path) -> dict[str, bytes]:
    """Every entry under ``folder``, hidden ones too (a temp file counts): path -> bytes
    (b"/" for a folder)."""
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): b"/" if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "proj" / ".ddpdeploy" / "checkpoints" / "j").mkdir(parents=True)
    return tmp_path / "proj"


def source(project: Path) -> Path:
    return project / ".ddpdeploy" / "checkpoints" / "j"


CASES = {
    # The payload runs out of room; step 1, collected before, stays as it was.
    "checkpoint": ([], "ckpt-step-000000002.pt"),
    # The checkpoint fits, then debug/ is made and the flight recorder dump runs out.
    "debug": (["--debug"], "debug/nccl_trace_rank_0"),
    # No checkpoint yet: the diagnostics only, into a --to made by this run.
    "debug-only": (["--debug"], "debug/nccl_trace_rank_0"),
    # --to's own step 2 differs: replaced, then the dump runs out: the old one comes back.
    "overwrite": (["--debug", "--overwrite"], "debug/nccl_trace_rank_0"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_disk_that_fills_during_the_copy_leaves_to_as_it_was(mountpoint, project, case):
    mount_tmpfs(mountpoint, "size=2m")
    args, runs_out = CASES[case]
    src = source(project)
    to = mountpoint / "out"
    if case != "debug-only":
        put_checkpoint(src, 1, 2000)
        put_checkpoint(src, 2, BIG if case == "checkpoint" else 5000)
        # What was there before: the user's file and step 1 from an earlier collect.
        to.mkdir()
        (to / "notes.txt").write_bytes(b"mine")
        for name in (payload_name(1), sidecar_name(1)):
            (to / name).write_bytes((src / name).read_bytes())
        if case == "overwrite":
            (to / payload_name(2)).write_bytes(b"an older step 2")
            (to / sidecar_name(2)).write_bytes(b"{}")
    if args:
        (src / "hang-rank0.txt").write_bytes(b"# ddpkit hang watchdog: rank 0\nThread 0x1\n")
        (src / "nccl_trace_rank_0").write_bytes(os.urandom(BIG))
    before = tree(to)
    filler = fill(mountpoint, ROOM)
    out = run_cli("collect", "j", "--to", str(to), "--from", "local", *args, cwd=project)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: --to: cannot write {to / runs_out}: No space left on device"
    ]
    assert tree(to) == before  # nothing of this run: no temp file, no debug/, no new folder
    assert sorted(p.name for p in mountpoint.iterdir()) == sorted(
        ["filler", *(["out"] if case != "debug-only" else [])]
    )
    # With room again the same collect completes: nothing left behind stands in its way.
    filler.unlink()
    again = run_cli("collect", "j", "--to", str(to), "--from", "local", *args, cwd=project)
    assert again.returncode == 0, again.stderr
    assert (to / runs_out).read_bytes() == (src / Path(runs_out).name).read_bytes()
