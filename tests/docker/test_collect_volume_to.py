"""`ddpdeploy collect --from compose` into a --to that cannot take it. A disk that fills up:
the volume is staged beside --to (the same file system), so the staging or the copy out of it
runs out; either way one line naming the file and "No space left on device", exit 1, nothing
left behind. A --to another collect is writing: one line, exit 2, nothing left behind (the
race itself, two processes at once: tests/test_collect_lock.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fs_helpers import mount_tmpfs, tmpfs_mountpoint

from ddpdeploy.fs import FolderLock

pytestmark = [pytest.mark.docker, pytest.mark.slow]

mountpoint = tmpfs_mountpoint  # the fixture (unmounts in its finalizer), by the name used here

BIG = 1 << 20


def _fill(mount: Path, leave: int) -> Path:
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        while True:
            try:
                os.write(fd, b"\0" * (64 << 10))
            except OSError:
                break
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def volume(engine: Any, base_image: str) -> Iterator[str]:
    """A volume with one checkpoint (step 2, a 1 MiB payload) and a flight recorder dump."""
    name = f"ddpdeploy-test-collect-full-{os.getpid()}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    payload = os.urandom(BIG)
    meta = json.dumps({"step": 2, "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry, data in (
            ("ckpt-step-000000002.pt", payload),
            ("ckpt-step-000000002.json", meta),
            ("nccl_trace_rank_0", os.urandom(64 << 10)),
        ):
            info = tarfile.TarInfo(entry)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    try:
        assert writer.put_archive("/v", buf.getvalue())
        yield name
    finally:
        writer.remove(force=True)
        vol.remove(force=True)


# room left free -> where it runs out: the staging itself, or the copy into --to after it.
CASES = {
    "staging": (256 << 10, r"cannot stage .*/\.ddpdeploy-collect-[^/]+/ckpt-step-000000002\.pt"),
    "copy": (BIG + (512 << 10), r"cannot write .*/out/ckpt-step-000000002\.pt"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_full_disk_under_a_compose_collect_is_one_line(
    cli: Any, engine: Any, volume: str, mountpoint: Path, case: str
) -> None:
    mount_tmpfs(mountpoint, "size=3m")
    room, where = CASES[case]
    filler = _fill(mountpoint, room)
    to = mountpoint / "out"
    args = ["--from", "compose", "--volume", volume, "--to", str(to), "--debug"]

    def users() -> set[str]:  # the engine is shared: only our volume's containers
        return {c.id for c in engine.containers.list(all=True, filters={"volume": volume})}

    before = users()
    out = cli("collect", "job", *args)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert re.fullmatch(rf"error: --to: {where}: No space left on device", lines[0]), lines[0]
    assert [p.name for p in mountpoint.iterdir()] == ["filler"]  # no staging, no --to
    assert users() == before  # the reader container is removed
    filler.unlink()
    again = cli("collect", "job", *args)
    assert again.returncode == 0, again.stderr


def test_no_room_for_the_staging_folder_is_one_line_exit_1(
    cli: Any, volume: str, mountpoint: Path
) -> None:
    mount_tmpfs(mountpoint, "size=3m,nr_inodes=1")  # the root folder uses the only inode
    to = mountpoint / "out"
    out = cli("collect", "job", "--from", "compose", "--volume", volume, "--to", str(to))
    assert out.returncode == 1, out.stderr  # the system refused: not the user's input
    assert out.stderr.strip().splitlines() == [
        f"error: --to: cannot stage files in {mountpoint}: No space left on device"
    ]
    assert list(mountpoint.iterdir()) == []


def test_a_to_another_collect_holds_is_refused_and_the_staging_goes(
    cli: Any, engine: Any, volume: str, tmp_path: Path
) -> None:
    to = tmp_path / "out"
    to.mkdir()
    (to / "notes").write_bytes(b"mine")
    users = {c.id for c in engine.containers.list(all=True, filters={"volume": volume})}
    with FolderLock(to):  # as a collect into it holds it
        out = cli("collect", "job", "--from", "compose", "--volume", volume, "--to", str(to))
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: --to: another collect is writing {to}; wait for it to end, or collect into "
        "another folder"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the staging folder went
    assert [p.name for p in to.iterdir()] == ["notes"]
    assert {c.id for c in engine.containers.list(all=True, filters={"volume": volume})} == users
