"""The one atomic writer, the one safe reader, the one checksum and the one docker connection,
against real folders, mounts, device nodes and sockets."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from cli_runner import run_cli, run_cli_into, run_main
from fs_helpers import mount_tmpfs, tmpfs_mountpoint, without_dac_override

from ddpdeploy import fs
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.streams import ChunkReader

mountpoint = tmpfs_mountpoint  # the fixture, under the name the tests ask for

COMPOSE = ["compose", "--image", "t:1", "--nodes", "2"]


def one_line_error(res: subprocess.CompletedProcess[str], code: int, text: str) -> str:
    assert res.returncode == code, res.stderr
    assert not res.stdout  # "" captured, None when it went to a file
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], res.stderr
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(fs.TEMP_SUFFIX))


# -- the writer ------------------------------------------------------------------------------


def test_writes_new_and_replaces_keeping_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "a.yaml"
    fs.write_atomic(target, b"one\n")
    umask = os.umask(0)
    os.umask(umask)
    assert target.read_bytes() == b"one\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    target.chmod(0o600)
    inode = target.stat().st_ino
    fs.write_atomic(target, b"two\n")
    assert target.read_bytes() == b"two\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.stat().st_ino != inode  # renamed in, not written in place
    assert leftovers(tmp_path) == []


def test_a_symlink_at_the_destination_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    link = tmp_path / "c.yaml"
    link.symlink_to(victim)
    line = one_line_error(run_main(*COMPOSE, "--out", str(link)), 2, f"--out: {link} is not a")
    assert "(a symlink)" in line
    assert victim.read_text() == "keep\n" and link.is_symlink()
    assert leftovers(tmp_path) == []


def test_a_symlink_at_a_temp_name_is_never_followed(tmp_path: Path, monkeypatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    # The old fixed temp name, planted by someone else: not ours to touch, never written.
    (tmp_path / ".c.yaml.tmp").symlink_to(victim)
    res = run_main(*COMPOSE, "--out", str(tmp_path / "c.yaml"))
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "keep\n" and (tmp_path / ".c.yaml.tmp").is_symlink()
    assert "services:" in (tmp_path / "c.yaml").read_text()
    # A random name guessed right (here: forced) is skipped, not followed: O_EXCL|O_NOFOLLOW.
    names = iter(["guessed", "guessed", "fresh"])
    monkeypatch.setattr(fs.secrets, "token_hex", lambda n: next(names))
    planted = tmp_path / f".d.yaml.guessed{fs.TEMP_SUFFIX}"
    planted.symlink_to(victim)
    fs.write_atomic(tmp_path / "d.yaml", b"mine\n")
    assert (tmp_path / "d.yaml").read_bytes() == b"mine\n"
    assert victim.read_text() == "keep\n" and planted.is_symlink()


def test_a_device_node_is_not_turned_into_a_file() -> None:
    before = os.stat("/dev/null")
    line = one_line_error(run_cli(*COMPOSE, "--out", "/dev/null"), 2, "--out: /dev/null")
    assert "is not a regular file (a device)" in line
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_fifo_or_folder_in_the_place_is_refused(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "c.yaml"
    os.mkfifo(target) if kind == "fifo" else target.mkdir()
    word = "a FIFO" if kind == "fifo" else "a folder"
    one_line_error(run_cli(*COMPOSE, "--out", str(target)), 2, f"not a regular file ({word})")
    assert leftovers(tmp_path) == []


def test_a_missing_folder_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot write .*/nope/a: No such file") as info:
        fs.write_atomic(tmp_path / "nope" / "a", b"x", "--out")
    assert info.value.exit_code == 2 and str(info.value).startswith("--out: ")


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temp(mountpoint: Path) -> None:
    mount_tmpfs(mountpoint, "size=64k")
    target = mountpoint / "c.yaml"
    target.write_text("old\n")
    fd = os.open(mountpoint / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError, match="No space"):
            while True:  # fill what is left
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    res = run_cli(*COMPOSE, "--out", str(target), "--force")  # "old" is not a compose file
    one_line_error(res, 1, f"--out: cannot write {target}: No space left on device")
    assert target.read_text() == "old\n" and leftovers(mountpoint) == []
    (mountpoint / "filler").unlink()
    with pytest.raises(OperationError, match="No space left on device"):
        fs.write_atomic(target, b"x" * (128 << 10), "--out")  # larger than the disk
    assert target.read_text() == "old\n" and leftovers(mountpoint) == []


def test_a_read_only_folder_is_one_line_exit_1(mountpoint: Path) -> None:
    mount_tmpfs(mountpoint, "ro")
    target = mountpoint / "c.yaml"
    one_line_error(run_main(*COMPOSE, "--out", str(target)), 1, "Read-only file system")


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        (["render", "--image", "t:1", "--name", "j", "--out-dir"], "deploy"),
        ([*COMPOSE, "--out"], "c.yaml"),
    ],
)
def test_no_permission_is_one_line_exit_1(tmp_path: Path, flags: list[str], name: str) -> None:
    """Root ignores file modes; without CAP_DAC_OVERRIDE it is refused like anyone else.
    (`render --out-dir` creates the folder, `compose --out` the temp file.)"""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    res = run_cli_into("/dev/null", *flags, str(locked / name), prefix=without_dac_override())
    one_line_error(res, 1, f"{flags[-1]}: cannot write {locked}/{name}: Permission denied")
    assert list(locked.iterdir()) == []


def test_an_interrupt_between_write_and_rename_keeps_the_old_file(
    tmp_path: Path, monkeypatch
) -> None:
    """A real SIGINT, delivered while the new content is being synced (written, not yet
    renamed): Python's handler raises KeyboardInterrupt there."""
    target = tmp_path / "c.yaml"
    target.write_text("old\n")
    real_fsync = os.fsync
    renamed: list[str] = []

    def fsync_then_sigint(fd: int) -> None:
        real_fsync(fd)
        os.kill(os.getpid(), signal.SIGINT)

    real_replace = os.replace
    monkeypatch.setattr(os, "fsync", fsync_then_sigint)
    monkeypatch.setattr(os, "replace", lambda *a: renamed.append("!") or real_replace(*a))
    # Python's own handler, whatever this process inherited (pytest started with SIGINT
    # ignored, from a script in the background, keeps it ignored); restored afterwards.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            fs.write_atomic(target, b"new\n" * 1000)
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert renamed == []
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []


def test_staged_without_commit_leaves_nothing(tmp_path: Path) -> None:
    with fs.Staged(tmp_path / "a") as out:
        out.write(b"half")
        assert len(leftovers(tmp_path)) == 1
    assert list(tmp_path.iterdir()) == []


# -- standard output -------------------------------------------------------------------------


@pytest.mark.parametrize("args", [COMPOSE, ["schema"]])
def test_full_stdout_is_one_line_exit_1(args: list[str], tmp_path: Path) -> None:
    res = run_cli_into("/dev/full", *args, cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr == "error: cannot write to standard output: No space left on device\n"


# -- the reader and the checksum -------------------------------------------------------------


def test_reader_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_bytes(b"data")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert fs.read_regular(link, "x") == b"data"  # followed where the caller allows
    with pytest.raises(fs.NotRegularFile, match=r"x: .*link is not a regular file \(a sym"):
        fs.read_regular(link, "x", follow_symlinks=False)
    os.mkfifo(tmp_path / "fifo")  # no writer: an open that waited would hang here
    with pytest.raises(fs.NotRegularFile, match=r"fifo is not a regular file \(a FIFO\)"):
        fs.read_regular(tmp_path / "fifo")
    with pytest.raises(fs.NotRegularFile, match=r"/dev/zero is not a regular file"):
        fs.read_regular("/dev/zero")
    with pytest.raises(fs.NotRegularFile, match="a folder"):
        fs.read_regular(tmp_path)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(fs.NotRegularFile, match="symlink to a missing file"):
        fs.read_regular(tmp_path / "dangling")
    with pytest.raises(FileNotFoundError):
        fs.read_regular(tmp_path / "nowhere")
    with pytest.raises(UserError, match="real is larger than 0 KiB; fix it"):
        fs.read_regular(real, limit=3, hint="fix it")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        with pytest.raises(fs.NotRegularFile, match=r"\(a socket\)"):
            fs.read_regular(tmp_path / "sock")


def test_checksum_streams_in_chunks(tmp_path: Path) -> None:
    data = os.urandom(3 * fs.CHUNK + 5)
    (tmp_path / "f").write_bytes(data)
    assert fs.sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    seen: list[int] = []
    with open(tmp_path / "f", "rb") as fh:
        digest = fs.sha256_stream(fh, lambda b: seen.append(len(b)), chunk=1 << 20)
    assert digest == hashlib.sha256(data).hexdigest() and seen == [1 << 20] * 3 + [5]


def test_chunk_reader_joins_uneven_chunks() -> None:
    data = os.urandom(10_000)
    reader = fs.chunk_reader(data[i : i + 7] for i in range(0, len(data), 7))
    assert reader.read(3) + reader.read() == data


# -- the docker connection -------------------------------------------------------------------


def test_an_engine_that_never_answers_is_one_line_not_a_hang(monkeypatch) -> None:
    from ddpdeploy.adapters import docker_engine
    from ddpdeploy.smoke.composerun import engine

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # the kernel accepts; nobody ever answers
        host = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        monkeypatch.setenv("DOCKER_HOST", host)
        monkeypatch.setattr(docker_engine, "CONNECT_TIMEOUT", 0.5)
        for connect, tail in [(docker_engine.connect, "running one"), (engine, "smoke --local")]:
            with pytest.raises(OperationError) as info:
                connect()
            text = str(info.value)
            assert text.startswith(f"cannot reach the Docker engine at {host} (")
            assert "\n" not in text and text.endswith(tail) and info.value.exit_code == 1


def test_a_dead_socket_gives_the_same_line_everywhere(tmp_path: Path, monkeypatch) -> None:
    from ddpdeploy.adapters import docker_engine
    from ddpdeploy.collect import volume as docker_volume

    dead = f"unix://{tmp_path}/dead.sock"
    monkeypatch.setenv("DOCKER_HOST", dead)
    with pytest.raises(OperationError) as direct:
        docker_engine.connect()
    with pytest.raises(OperationError) as volume:
        docker_volume.copy_out("v", ".", tmp_path)
    assert str(direct.value) == str(volume.value)
    assert str(direct.value).startswith(f"cannot reach the Docker engine at {dead} (")


def test_read_at_most_sees_past_the_limit_through_short_reads() -> None:
    data = os.urandom(100)
    assert fs.read_at_most(fs.chunk_reader(iter([data[:7], data[7:]]), 1), 1000) == data
    raw = ChunkReader(data[i : i + 3] for i in range(0, 100, 3))  # 3 bytes a read
    assert fs.read_at_most(raw, 10) == data[:11]


def test_a_malformed_docker_host_is_bad_input_for_every_caller(monkeypatch) -> None:
    from ddpdeploy.adapters import docker_engine
    from ddpdeploy.smoke.composerun import engine

    monkeypatch.setenv("DOCKER_HOST", "tcp://host:port")
    for connect in (docker_engine.connect, engine):
        with pytest.raises(UserError) as info:
            connect()
        assert info.value.exit_code == 2
        assert str(info.value).startswith("DOCKER_HOST='tcp://host:port' is not an engine address")
