"""`ddpdeploy build` on hostile input: every failure is one line and the right exit code,
the engine is asked before any workspace file is read, and memory stays bounded whatever
the workspace holds.

No test here builds an image: each stops before the engine's first step or at its FROM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_main
from fs_helpers import without_dac_override

ABSENT_BASE = "ddpdeploy-test/absent-base:nope"  # fails at FROM: nothing is built
REPO = f"ddpdeploy-test/build-errors-{os.getpid()}"
ROOT = Path(__file__).resolve().parents[2]


def one_error_line(result: Any, code: int) -> str:
    """The single `error:` line of a failed run, after checking nothing else was said."""
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def final_error(result: Any, code: int) -> str:
    """The `error:` line that ends a run which got as far as the engine's build steps
    (their progress lines come first on a non-terminal)."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0]), result.stderr
    return errors[0]


def unprivileged(unreadable: Path) -> list[str]:
    """A command prefix under which the mode-000 file ``unreadable`` really is unreadable
    (tests run as root); skips where that cannot be arranged."""
    return without_dac_override(unreadable)


def run_as(prefix: list[str], *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "ddpdeploy", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "host", ["tcp://256.0.0.1:99999", "tcp://::", "http://[::1", "tcp://host:port"]
)
def test_malformed_docker_host_is_bad_input(tmp_path: Path, host: str) -> None:
    result = run_main("build", "-w", str(tmp_path), cwd=ROOT, env={"DOCKER_HOST": host})
    line = one_error_line(result, 2)
    assert line.startswith(f"error: DOCKER_HOST={host!r} is not an engine address")


def test_dead_engine_is_reported_before_any_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"x")
    (tmp_path / "secret.bin").chmod(0)
    prefix = unprivileged(tmp_path / "secret.bin")
    dead = f"unix://{tmp_path}/dead.sock"
    result = run_as(prefix, "build", "-w", str(tmp_path), env={"DOCKER_HOST": dead})
    assert one_error_line(result, 1).startswith(f"error: cannot reach the Docker engine at {dead}")


@pytest.mark.docker
def test_unreadable_workspace_paths_are_named(engine: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "locked").mkdir(parents=True)
    (ws / "secret.bin").write_bytes(b"x")
    (ws / "secret.bin").chmod(0)
    prefix = unprivileged(ws / "secret.bin")
    (ws / "locked").chmod(0)
    args = ("build", "-w", str(ws), "--image", REPO, "--base-image", ABSENT_BASE)
    try:
        line = one_error_line(run_as(prefix, *args), 2)
        assert f"cannot list {ws / 'locked'} (Permission denied)" in line
        assert ".dockerignore" in line  # the fix
        (ws / ".dockerignore").write_text("locked\n")
        line = one_error_line(run_as(prefix, *args), 2)
        assert f"cannot read {ws / 'secret.bin'} (Permission denied)" in line
        # Ignored, it is never opened: the build goes on to the engine (and its FROM).
        (ws / ".dockerignore").write_text("locked\nsecret.bin\n")
        line = final_error(run_as(prefix, *args), 1)
        assert f"base image {ABSENT_BASE} is not available" in line
    finally:
        (ws / "locked").chmod(0o755)
        Path(line.rsplit("(full log: ", 1)[-1].rstrip(")")).unlink(missing_ok=True)


def _non_utf8_name(ws: Path) -> str:
    os.close(os.open(os.fsencode(ws) + b"/bad\xff.py", os.O_CREAT | os.O_WRONLY))
    return "is not valid UTF-8; rename it or list it in .dockerignore"


def _non_utf8_dockerignore(ws: Path) -> str:
    (ws / ".dockerignore").write_bytes(b"\xff\xfe*.bin\n")
    return ".dockerignore is not UTF-8 text"


def _invalid_pattern(ws: Path) -> str:
    (ws / ".dockerignore").write_text("[z-a]\n")
    return ".dockerignore: a pattern is invalid (bad character range"


def _dockerignore_folder(ws: Path) -> str:
    (ws / ".dockerignore").mkdir()
    return ".dockerignore is not a regular file"


def _endless_requirements(ws: Path) -> str:
    (ws / "requirements.txt").symlink_to("/dev/zero")  # would be read forever
    return "requirements.txt is a link to /dev/zero, outside the workspace"


def _fifo_requirements(ws: Path) -> str:
    os.mkfifo(ws / "reqs")  # would block the read
    (ws / "requirements.txt").symlink_to("reqs")
    return "requirements.txt is not a regular file"


def _huge_requirements(ws: Path) -> str:
    with (ws / "requirements.txt").open("wb") as fh:
        fh.truncate(64 << 20)
    return "requirements.txt is larger than 1024 KiB"


@pytest.mark.docker
@pytest.mark.parametrize(
    "make",
    [
        _non_utf8_name,
        _non_utf8_dockerignore,
        _invalid_pattern,
        _dockerignore_folder,
        _endless_requirements,
        _fifo_requirements,
        _huge_requirements,
    ],
)
def test_hostile_workspace_is_one_line(
    engine: Any, cli: Callable[..., Any], tmp_path: Path, make: Callable[[Path], str]
) -> None:
    expected = make(tmp_path)
    result = cli("build", "-w", str(tmp_path), "--image", REPO, "--base-image", ABSENT_BASE)
    assert expected in one_error_line(result, 2)


@pytest.mark.docker
def test_deeply_nested_workspace_is_one_line(
    engine: Any, cli: Callable[..., Any], tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        fd = os.open(ws, os.O_RDONLY)
        for _ in range(1500):  # past the SDK walk's recursion (one frame per level)
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
            os.close(parent)
        os.close(fd)
        result = cli("build", "-w", str(ws), "--image", REPO, "--base-image", ABSENT_BASE)
        assert "has folders nested too deeply to walk" in one_error_line(result, 2)
    finally:
        # pytest's clean-up of old temp dirs (shutil.rmtree) recurses once per level too,
        # and would crash a later session on this tree; GNU rm does not recurse.
        subprocess.run(["rm", "-rf", str(ws)], check=True)


@pytest.mark.docker
def test_bad_base_image_is_bad_input(engine: Any, cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("build", "-w", str(tmp_path), "--image", REPO, "--base-image", "Not Valid")
    assert one_error_line(result, 2).startswith("error: --base-image: 'Not Valid' is not an image")


@pytest.mark.docker
def test_large_files_keep_memory_bounded(engine: Any, tmp_path: Path) -> None:
    """A 2 GB ignored file is never read, a 200 MB kept one is streamed: the CLI's peak
    memory stays far below either (it held the whole file before)."""
    big = 200 << 20
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    (ws / "main.py").write_text("print('hi')\n")
    (ws / ".dockerignore").write_text("data/\n")
    for path, size in ((ws / "data" / "ignored.bin", 10 * big), (ws / "kept.bin", big)):
        with path.open("wb") as fh:
            fh.truncate(size)  # sparse: no disk, but every byte reads back
    # A fresh interpreter, so RUSAGE_CHILDREN sees the CLI alone, not this session's others.
    measure = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stderr.write(r.stderr); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    cli_args = ["-m", "ddpdeploy", "build", "-w", str(ws), "--image", REPO]
    out = subprocess.run(
        [sys.executable, "-c", measure, sys.executable, *cli_args, "--base-image", ABSENT_BASE],
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, peak_kib = map(int, out.stdout.split())
    # The whole context reached the engine, which stopped at FROM.
    result = subprocess.CompletedProcess(cli_args, code, "", out.stderr)
    line = final_error(result, 1)
    assert f"base image {ABSENT_BASE} is not available" in line
    Path(line.rsplit("(full log: ", 1)[-1].rstrip(")")).unlink(missing_ok=True)
    assert peak_kib * 1024 < big / 2, f"peak RSS {peak_kib / 1024:.0f} MiB"


@pytest.mark.parametrize("packages", ["git; rm -rf /", "*", "$(id)", "git\\ vim"])
def test_system_packages_must_be_package_names(tmp_path: Path, packages: str) -> None:
    dead = f"unix://{tmp_path}/dead.sock"  # refused before the engine is even asked
    args = ["build", "-w", str(tmp_path), "--system-packages", packages]
    result = run_main(*args, cwd=ROOT, env={"DOCKER_HOST": dead})
    assert one_error_line(result, 2).startswith("error: --system-packages: ")
