"""Where a collect lands (collect.destination): `--to` checked before anything is read,
nothing in it replaced unless asked (identical files kept), each file written atomically,
put back as it was on any failure (Ctrl-C, a disk that fills, after `--overwrite` replaced
files: the old ones come back), locked against a second collect; each refusal one line. The
compose form (staged beside --to): test_volume.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli, run_main
from fs_helpers import mount_tmpfs
from reports import Recorded

from ddpdeploy import fs
from ddpdeploy.collect.checkpoint import collect, payload_name, sidecar_name
from ddpdeploy.collect.destination import _write_atomic
from ddpdeploy.collect.source import LocalSource
from ddpdeploy.errors import UserError

from .folders import RUN, fill, listing, put_checkpoint, put_diagnostics, run


def test_nothing_in_to_is_replaced_without_overwrite(src, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / payload_name(1)).write_bytes(b"my own file")
    with pytest.raises(UserError, match=rf"--to: .*{payload_name(1)} already exists and differs"):
        run(src, dest)
    assert listing(dest) == [payload_name(1)]
    assert (dest / payload_name(1)).read_bytes() == b"my own file"
    got, _ = run(src, dest, overwrite=True)
    assert got.step == 1 and (dest / payload_name(1)).read_bytes() == b"step one"
    again, _ = run(src, dest)  # identical files are fine: a second collect is a no-op
    assert again.step == 1 and listing(dest) == [sidecar_name(1), payload_name(1)]
    (dest / sidecar_name(1)).unlink()
    (dest / sidecar_name(1)).mkdir()
    with pytest.raises(UserError, match="exists and is not a regular file"):
        run(src, dest, overwrite=True)


@pytest.mark.parametrize("where", ["a-file", "/dev/full", "/dev/full/x", "a-file/sub"])
def test_to_that_cannot_be_a_folder_is_one_line(src, tmp_path, where):
    (tmp_path / "a-file").write_text("x")
    dest = Path(where) if where.startswith("/") else tmp_path / where
    with pytest.raises(UserError, match="^--to: .* not a folder"):
        run(src, dest)
    assert (tmp_path / "a-file").read_text() == "x"


def test_the_writer_removes_its_temp_file_on_failure(tmp_path):
    def fill(out: Any) -> None:
        out.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        _write_atomic(tmp_path / "f", fill)
    assert listing(tmp_path) == []
    assert _write_atomic(tmp_path / "f", b"one") is True
    assert _write_atomic(tmp_path / "f", b"one") is False  # identical: kept
    with pytest.raises(UserError, match="already exists and differs"):
        _write_atomic(tmp_path / "f", b"two")
    assert listing(tmp_path) == ["f"] and (tmp_path / "f").read_bytes() == b"one"


def test_an_existing_different_file_is_refused_by_name(local_run, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "ckpt-step-000000002.pt").write_bytes(b"mine")
    out = run_main("collect", "j", "--to", str(dest), cwd=local_run)
    assert out.returncode == 2
    assert "ckpt-step-000000002.pt already exists and differs; pass --overwrite" in out.stderr
    assert (dest / "ckpt-step-000000002.pt").read_bytes() == b"mine"
    assert sorted(p.name for p in dest.iterdir()) == ["ckpt-step-000000002.pt"]
    again = run_main("collect", "j", "--to", str(dest), "--overwrite", cwd=local_run)
    assert again.returncode == 0, again.stderr
    assert (dest / "ckpt-step-000000002.pt").read_bytes() != b"mine"


def test_a_different_file_in_the_destination_is_refused_unless_overwrite(
    project, run_folder, tmp_path
):
    put_checkpoint(run_folder, 2)
    files = put_diagnostics(run_folder)
    to = tmp_path / "out"
    (to / "debug").mkdir(parents=True)
    (to / "debug" / "hang-rank1.txt").write_bytes(b"mine")
    out = run_main("collect", "j", "--to", str(to), "--debug", cwd=project)
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
    again = run_main("collect", "j", "--to", str(to), "--debug", "--overwrite", cwd=project)
    assert again.returncode == 0, again.stderr
    assert (to / "debug" / "hang-rank1.txt").read_bytes() == files["hang-rank1.txt"]
    same = run_main("collect", "j", "--to", str(to), "--debug", cwd=project)
    assert same.returncode == 0, same.stderr  # identical files are kept as they are


# -- put back as it was -------------------------------------------------------------------


def test_ctrl_c_mid_copy_leaves_no_file_behind(run_folder, tmp_path):
    put_checkpoint(run_folder, 1)
    put_diagnostics(run_folder)
    (run_folder / "hang-rank7.txt").write_bytes(os.urandom(3 << 20))  # several chunks
    to = tmp_path / "out"

    def interrupt(copied: float) -> None:
        if copied > 5000 + (1 << 20):  # inside hang-rank7.txt, after the first ones
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect(LocalSource(run_folder), to, report=Recorded(interrupt), debug=True)
    assert not to.exists()  # the checkpoint and the stacks already copied went too
    assert not [p for p in tmp_path.rglob("*ddpdeploy-tmp*")]


def test_ctrl_c_after_overwrite_puts_the_old_files_back(tmp_path: Path) -> None:
    src = tmp_path / "run"
    payload = put_checkpoint(src, 3)
    (src / "hang-rank0.txt").write_bytes(os.urandom(3 << 20))  # several chunks
    to = tmp_path / "out"
    to.mkdir()
    mine = {payload_name(3): b"an older step 3", sidecar_name(3): b"{}", "notes": b"kept"}
    for name, data in mine.items():
        (to / name).write_bytes(data)

    def interrupt(copied: float) -> None:
        if copied > 5000 + (1 << 20):  # inside the stack, the checkpoint replaced
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect(LocalSource(src), to, report=Recorded(interrupt), overwrite=True, debug=True)
    assert {p.name: p.read_bytes() for p in to.iterdir()} == mine  # no debug/, no temp file
    got = collect(LocalSource(src), to, overwrite=True, debug=True)  # and nothing in its way
    assert got.step == 3 and (to / payload_name(3)).read_bytes() == payload
    assert sorted(p.name for p in to.iterdir()) == sorted([*mine, "debug"])


# -- a disk that fills or refuses (a real tmpfs) ------------------------------------------

BIG = 1 << 20  # the file that does not fit


ROOM = 256 << 10  # what is left free on the tmpfs: the rest of the copy fits, BIG does not


def contents(folder: Path) -> dict[str, bytes]:
    """Every entry under ``folder``, hidden ones too (a temp file counts): path -> bytes
    (b"/" for a folder)."""
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): b"/" if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


FULL_DISK = {
    # The payload runs out of room; step 1, collected before, stays as it was.
    "checkpoint": ([], "ckpt-step-000000002.pt"),
    # The checkpoint fits, then debug/ is made and the flight recorder dump runs out.
    "debug": (["--debug"], "debug/nccl_trace_rank_0"),
    # No checkpoint yet: the diagnostics only, into a --to made by this run.
    "debug-only": (["--debug"], "debug/nccl_trace_rank_0"),
    # --to's own step 2 differs: replaced, then the dump runs out: the old one comes back.
    "overwrite": (["--debug", "--overwrite"], "debug/nccl_trace_rank_0"),
}


@pytest.mark.parametrize("case", FULL_DISK, ids=list(FULL_DISK))
def test_a_disk_that_fills_during_the_copy_leaves_to_as_it_was(
    mountpoint, project, run_folder, case
):
    mount_tmpfs(mountpoint, "size=2m")
    args, runs_out = FULL_DISK[case]
    src = run_folder
    to = mountpoint / "out"
    if case != "debug-only":
        put_checkpoint(src, 1, size=2000)
        put_checkpoint(src, 2, size=BIG if case == "checkpoint" else 5000)
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
    before = contents(to)
    filler = fill(mountpoint, ROOM)
    out = run_main("collect", "j", "--to", str(to), "--from", "local", *args, cwd=project)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: --to: cannot write {to / runs_out}: No space left on device"
    ]
    assert contents(to) == before  # nothing of this run: no temp file, no debug/, no new folder
    assert sorted(p.name for p in mountpoint.iterdir()) == sorted(
        ["filler", *(["out"] if case != "debug-only" else [])]
    )
    # With room again the same collect completes: nothing left behind stands in its way.
    filler.unlink()
    again = run_main("collect", "j", "--to", str(to), "--from", "local", *args, cwd=project)
    assert again.returncode == 0, again.stderr
    assert (to / runs_out).read_bytes() == (src / Path(runs_out).name).read_bytes()


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
def test_a_read_only_mount_is_one_line(local_run, tmp_path):
    (tmp_path / "ro").mkdir()
    out = _collect_under_mount(local_run, tmp_path / "ro", "ro,size=1m", tmp_path / "ro" / "x")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("collect: reading the local run's folder")
    assert lines[1].startswith("error: --to: ") and "read-only file system" in lines[1]


@needs_mounts
def test_a_full_disk_is_one_line_and_leaves_nothing(local_run, tmp_path):
    (tmp_path / "small").mkdir()
    out = _collect_under_mount(local_run, tmp_path / "small", "size=4k", tmp_path / "small" / "x")
    # The system refused, not the user's input: exit 1, as for every writer (fs).
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: --to: cannot write ")
    assert "No space left on device" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(
    not (shutil.which("setpriv") and hasattr(os, "geteuid") and os.geteuid() == 0),
    reason="root bypasses file permissions; setpriv drops that",
)
def test_a_folder_without_write_permission_is_one_line(local_run, tmp_path):
    dest = tmp_path / "locked"
    dest.mkdir(mode=0o555)
    args = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable]
    for to in (dest, dest / "sub"):
        out = subprocess.run(
            [*args, "-m", "ddpdeploy", "collect", "j", "--to", str(to)],
            cwd=local_run,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("error: --to: ") and "permission denied" in last
        assert list(dest.iterdir()) == []


# -- the lock: one collect at a time into a --to ------------------------------------------

PAYLOAD = 48 << 20  # long enough to copy that the other run reaches the lock meanwhile


DIAGNOSTICS = {"hang-rank0.txt": b"# ddpkit hang watchdog: rank 0 on h, pid 1\nThread 0x1\n"}


# A collect process that has imported all it needs, says so, and starts on stdin's end: two
# of them released together reach --to within milliseconds (a barrier, not a sleep).
CHILD = """
import sys
import ddpdeploy.cli, ddpdeploy.collect.checkpoint, ddpdeploy.commands.collect, rich.progress
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
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project where a local run of job `j` left big checkpoints at steps 1 and 2, and
    diagnostics (a flight recorder dump as big, so a --debug run holds --to as long)."""
    root = tmp_path_factory.mktemp("proj")
    for step in (1, 2):
        put_checkpoint(root / RUN, step, size=PAYLOAD)
    for name, data in {**DIAGNOSTICS, "nccl_trace_rank_0": os.urandom(PAYLOAD // 2)}.items():
        (root / RUN / name).write_bytes(data)
    return root


def expected(project: Path, args: list[str]) -> dict[str, bytes]:
    """What one collect with ``args`` leaves in --to: relative path -> bytes."""
    src = project / RUN
    step = int(args[args.index("--step") + 1]) if "--step" in args else 2
    want = {n: (src / n).read_bytes() for n in (payload_name(step), sidecar_name(step))}
    if "--debug" in args:
        for name in (*DIAGNOSTICS, "nccl_trace_rank_0"):
            want[f"debug/{name}"] = (src / name).read_bytes()
    return want


def files(folder: Path) -> dict[str, bytes]:
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
def test_two_collects_at_once_one_writes_the_other_is_one_line(big_run, tmp_path, pair):
    first, second = PAIRS[pair]
    overlapped = 0
    for attempt in range(4):  # a race: run it a few times, half into a folder made by neither
        to = tmp_path / f"out{attempt}"
        if attempt % 2:
            to.mkdir()
        results = race(big_run, to, first, second)
        codes = [r.returncode for r in results]
        if codes == [0, 0]:
            # On a loaded machine one may end before the other starts: two whole collects
            # one after the other, which is no race (seen in CI beside the cluster tests).
            for r in results:
                assert r.stderr.startswith("collected ddpdeploy checkpoint"), r.stderr
            continue
        overlapped += 1
        assert sorted(codes) == [0, 2], [r.stderr for r in results]
        winner, loser = results if codes[0] == 0 else results[::-1]
        assert loser.stderr.strip().splitlines() == [busy_line(to)], loser.stderr
        assert "Traceback" not in winner.stderr, winner.stderr
        assert winner.stderr.strip().splitlines()[0].startswith("collected ddpdeploy checkpoint")
        # Exactly the winner's files, whole: none of the loser's, no temp file.
        assert files(to) == expected(big_run, list(winner.args)), (attempt, winner.args)
    assert overlapped, "no attempt of four ran the two collects at once"


def test_a_folder_another_writer_holds_is_refused_before_anything_is_read(local_run, tmp_path):
    """The refusal itself, deterministically: the lock held here, as a collect holds it."""
    to = tmp_path / "out"
    to.mkdir()
    (to / "mine.txt").write_bytes(b"kept")
    with fs.FolderLock(to):
        out = run_cli("collect", "j", "--to", str(to), "--from", "local", "--debug", cwd=local_run)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [busy_line(to)]
    assert files(to) == {"mine.txt": b"kept"}
    # Released (as a collect's is when it ends, or its process dies): the next one writes.
    again = run_cli(
        "collect", "j", "--to", str(to), "--from", "local", "--step", "1", cwd=local_run
    )
    assert again.returncode == 0, again.stderr
    assert files(to) == {"mine.txt": b"kept", **expected(local_run, ["--step", "1"])}


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


@pytest.mark.parametrize("name", ["a" * 255, "é" * 125 + ".bin"])  # 255 and 254 bytes
def test_a_name_as_long_as_the_file_system_allows_is_collected(tmp_path, name):
    # Found by the second hostile pass: the temp file beside it was named .NAME.<hex>.
    # ddpdeploy-tmp, 32 bytes longer than NAME: 'File name too long', blamed on --to (exit 2).
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / name).write_bytes(b"one")
    dest = tmp_path / "out"
    got, _ = run(folder, dest)
    assert got.files == [name] and (dest / name).read_bytes() == b"one"
    (folder / name).write_bytes(b"two")  # --overwrite keeps the old one under a temp name
    run(folder, dest, overwrite=True)
    assert (dest / name).read_bytes() == b"two"
    assert sorted(p.name for p in dest.iterdir()) == sorted([name, "SHA256SUMS"])


@pytest.mark.parametrize(
    ("to", "source"),
    [
        (RUN, "local"),
        (f"{RUN}/", "local"),
        (f"./{RUN}/../j", "local"),
        # Found by the third hostile pass: a folder inside it was taken, and the next
        # smoke --local emptied the copy with its checkpoint folder.
        (f"{RUN}/sub", "local"),
        (".ddpdeploy/checkpoints/other", "compose"),
        (".ddpdeploy", "cluster"),
    ],
)
def test_to_inside_ddpdeploys_own_folder_is_refused(local_run, to, source):
    # Found by the second hostile pass: collected "into" itself, writing SHA256SUMS or
    # RUN.json into the run's own checkpoint folder.
    before = listing(local_run / ".ddpdeploy")
    volume = ["--volume", "v"] if source == "compose" else []
    out = run_main("collect", "j", "--to", to, "--from", source, *volume, cwd=local_run)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        f"error: --to: {Path(to)} is inside ddpdeploy's own folder .ddpdeploy, which smoke "
        "--local empties; collect into a folder outside it (e.g. --to ./ckpt)\n"
    )
    assert listing(local_run / ".ddpdeploy") == before
