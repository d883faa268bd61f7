"""`collect --from compose` (collect.volume): a compose run's named volume copied out
through a real Docker engine (docker_fixtures.py) by a container that is never started,
only its regular files staged beside --to; hostile entries said and skipped, a bounded file
staged no further than its bound; a --to that cannot take it (a disk that fills during the
staging or the copy, another collect holding it): one line, nothing left behind."""

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
from fs_helpers import mount_tmpfs

from ddpdeploy.collect.debug import MAX_DEBUG
from ddpdeploy.collect.volume import _extract_files
from ddpdeploy.fs import FolderLock

from .folders import fill


def test_the_compose_staging_writes_a_bounded_file_only_that_far(tmp_path):
    """What the engine's archive holds is staged on this disk: a bounded name no further
    than its bound (the rest of the stream is skipped), the others whole."""
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


# -- through the engine -------------------------------------------------------------------


def _link(tar: tarfile.TarFile, name: str, kind: bytes, target: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


def _checkpoint_tar(hostile: bool = False) -> bytes:
    """Steps 2 and 4 in the trainer's layout; step 4's payload fails its sha256. ``hostile``
    adds what a volume may hold and collect must neither follow nor crash on: symlinks
    (absolute, relative, one posing as step 6's payload), a FIFO, a hard link, a subfolder."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if hostile:
            _link(tar, "etc-passwd", tarfile.SYMTYPE, "/etc/passwd")
            _link(tar, "latest", tarfile.SYMTYPE, "ckpt-step-000000002.pt")
            _link(tar, "ckpt-step-000000006.pt", tarfile.SYMTYPE, "/etc/hostname")
            meta6 = {"step": 6, "sha256": "0" * 64}
            info = tarfile.TarInfo("ckpt-step-000000006.json")
            info.size = len(json.dumps(meta6))
            tar.addfile(info, io.BytesIO(json.dumps(meta6).encode()))
            _link(tar, "pipe", tarfile.FIFOTYPE)
            info = tarfile.TarInfo("sub/inner.pt")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        for step in (2, 4):
            payload = os.urandom(300_000)
            meta = {"step": step, "sha256": hashlib.sha256(payload).hexdigest()}
            meta["file"] = f"ckpt-step-{step:09d}.pt"
            if step == 4:
                payload = payload[:-1] + bytes([payload[-1] ^ 1])
            for name, data in (
                (meta["file"], payload),
                (f"ckpt-step-{step:09d}.json", json.dumps(meta).encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        if hostile:
            _link(tar, "hard", tarfile.LNKTYPE, "ckpt-step-000000002.json")
    return buf.getvalue()


@pytest.fixture(params=[False, True], ids=["plain", "hostile"])
def steps_volume(engine, base_image, request):
    """A named volume holding checkpoints, and the stopped container that wrote them (as a
    finished compose run leaves them)."""
    name = f"ddpdeploy-test-collect-{os.getpid()}-{int(request.param)}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    try:
        assert writer.put_archive("/v", _checkpoint_tar(request.param))
        yield name
    finally:
        writer.remove(force=True)
        vol.remove(force=True)


@pytest.mark.docker
@pytest.mark.slow
def test_collect_from_a_compose_volume(cli, engine, steps_volume, tmp_path):
    def users() -> set[str]:  # the engine is shared: look only at our volume's containers
        return {c.id for c in engine.containers.list(all=True, filters={"volume": steps_volume})}

    before = users()
    dest = tmp_path / "out"
    out = cli("collect", "job", "--from", "compose", "--volume", steps_volume, "--to", str(dest))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "warning: checkpoint at step 4 in volume" in out.stderr
    if steps_volume.endswith("-1"):  # the hostile one: each odd entry said in one line, skipped
        for entry in ("etc-passwd", "latest", "ckpt-step-000000006.pt", "pipe", "hard"):
            assert f"warning: skipping {entry} in volume {steps_volume}: a " in out.stderr
        assert "checkpoint at step 6 in volume" in out.stderr
    assert "step 2" in out.stderr.strip().splitlines()[-1]
    meta = json.loads((dest / "ckpt-step-000000002.json").read_text())
    payload = (dest / meta["file"]).read_bytes()
    assert hashlib.sha256(payload).hexdigest() == meta["sha256"]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [meta["file"], "ckpt-step-000000002.json"]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the staging folder is gone
    assert users() == before  # the reader container is removed
    missing = cli("collect", "job", "--from", "compose", "--volume", "no-such-vol", "--to", "x")
    assert missing.returncode == 2 and "no Docker volume named no-such-vol" in missing.stderr
    args = [
        "--volume",
        steps_volume,
        "--image",
        "ddpdeploy-test/no-such-image:1",
        "--to",
        str(dest),
    ]
    no_image = cli("collect", "job", "--from", "compose", *args)
    assert no_image.returncode == 2, no_image.stderr
    assert no_image.stderr.strip().splitlines() == [
        "error: --image: no local image ddpdeploy-test/no-such-image:1; name an image this "
        "engine has (`docker images`)"
    ]


@pytest.mark.docker
@pytest.mark.slow
def test_collect_plain_files_from_a_volume(cli, engine, base_image, tmp_path):
    """A script's own snapshot (no sidecars): copied as a plain file with SHA256SUMS."""
    name = f"ddpdeploy-test-collect-plain-{os.getpid()}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    payload = os.urandom(200_000)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("snapshot.pt")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    try:
        assert writer.put_archive("/v", buf.getvalue())
        dest = tmp_path / "out"
        out = cli("collect", "job", "--from", "compose", "--volume", name, "--to", str(dest))
        assert out.returncode == 0, out.stderr
        assert f"collected 1 plain file (with SHA256SUMS) from volume {name}" in out.stderr
        assert (dest / "snapshot.pt").read_bytes() == payload
        sums = (dest / "SHA256SUMS").read_text()
        assert sums == f"{hashlib.sha256(payload).hexdigest()}  snapshot.pt\n"
    finally:
        writer.remove(force=True)
        vol.remove(force=True)


@pytest.mark.docker
@pytest.mark.slow
def test_a_volume_of_only_folders_is_said_so_as_a_local_folder_is(
    cli, engine, base_image, tmp_path
):
    # Found by the fourth hostile pass: a volume whose folder held only checkpoint-500/ was
    # "the folder is empty" (local collect said "holds only folders" already).
    name = f"ddpdeploy-test-collect-folders-{os.getpid()}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("checkpoint-500/model.pt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    try:
        assert writer.put_archive("/v", buf.getvalue())
        dest = tmp_path / "out"
        out = cli("collect", "job", "--from", "compose", "--volume", name, "--to", str(dest))
        assert out.returncode == 1, out.stderr
        assert f"skipping checkpoint-500/ in volume {name}: a folder" in out.stderr
        assert "the folder holds only folders (checkpoint-500/)" in out.stderr
        assert "is empty" not in out.stderr
        assert not dest.exists()
    finally:
        writer.remove(force=True)
        vol.remove(force=True)


@pytest.mark.docker
@pytest.mark.slow
def test_collect_debug_from_a_volume(cli, engine, base_image, tmp_path):
    """--debug: the stacks, a dump and an NCCL log come into --to/debug/; a 40 MB stack is cut
    at the bound (and staged no further), a symlink posing as a stack is refused."""
    name = f"ddpdeploy-test-collect-debug-{os.getpid()}"
    vol = engine.volumes.create(name)
    writer = engine.containers.create(base_image, command=["true"], volumes={name: {"bind": "/v"}})
    files = {
        "hang-rank0.txt": b"# ddpkit hang watchdog: rank 0 on [red]n0[/]\nThread 0x1\n",
        "hang-rank1.txt": b"# ddpkit hang watchdog: rank 1 on n0\nThread 0x2\n",
        "nccl_trace_rank_1": os.urandom(4000),
        "ddpkit-nccl.n0.77.log": b"n0:77 NCCL INFO Bootstrap : Using eth0\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry, data in {**files, "hang-rank2.txt": b"# big\n" * (7 << 20)}.items():
            info = tarfile.TarInfo(entry)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        _link(tar, "hang-rank3.txt", tarfile.SYMTYPE, "/etc/passwd")
    try:
        assert writer.put_archive("/v", buf.getvalue())
        dest = tmp_path / "out"
        args = ["--from", "compose", "--volume", name, "--to", str(dest), "--debug"]
        out = cli("collect", "job", *args)
        assert out.returncode == 0, out.stderr
        err = out.stderr
        assert f"warning: skipping hang-rank3.txt in volume {name}: a symlink" in err
        assert f"hang-rank2.txt in volume {name} is over 32 MiB: cut there" in err
        assert f"no checkpoint in volume {name} yet: collected the diagnostics only" in err
        assert "hang stack: # ddpkit hang watchdog: rank 0 on [red]n0[/]" in err
        assert err.strip().splitlines()[-1] == (
            f"debug: 3 hang stacks, 1 flight recorder dump, 1 NCCL debug log into {dest}/debug"
        )
        got = {p.name: p.read_bytes() for p in (dest / "debug").iterdir()}
        cut = got.pop("hang-rank2.txt")
        assert got == files
        assert len(cut) > MAX_DEBUG and cut.startswith(b"# big\n") and b"cut here" in cut[-80:]
        assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the staging folder is gone
    finally:
        writer.remove(force=True)
        vol.remove(force=True)


# -- into a --to that cannot take it ------------------------------------------------------

BIG = 1 << 20


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
FULL_DISK = {
    "staging": (256 << 10, r"cannot stage .*/\.ddpdeploy-collect-[^/]+/ckpt-step-000000002\.pt"),
    "copy": (BIG + (512 << 10), r"cannot write .*/out/ckpt-step-000000002\.pt"),
}


@pytest.mark.parametrize("case", FULL_DISK, ids=list(FULL_DISK))
@pytest.mark.docker
@pytest.mark.slow
def test_a_full_disk_under_a_compose_collect_is_one_line(
    cli: Any, engine: Any, volume: str, mountpoint: Path, case: str
) -> None:
    mount_tmpfs(mountpoint, "size=3m")
    room, where = FULL_DISK[case]
    filler = fill(mountpoint, room)
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


@pytest.mark.docker
@pytest.mark.slow
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


@pytest.mark.docker
@pytest.mark.slow
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
