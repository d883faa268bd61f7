"""Run the real CLI: as a subprocess, as users do (`run_cli`), or in this process
(`run_main`) where the process itself is not under test.

`run_cli` is for what a fresh interpreter shows: its exit code and its streams as a shell
sees them, what it imports, a full stdout, signals, privileges dropped, logging left to
Python's defaults. `run_main` runs `ddpdeploy.cli.main(argv)` here, the same parsing,
validation, rendering and refusals in a few milliseconds instead of a new interpreter's
startup: for the many cases of a behaviour that one `run_cli` test already shows end to
end. Both hand back a CompletedProcess (returncode, stdout, stderr)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m ddpdeploy ARGS` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "ddpdeploy", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli_into(
    stdout_path: str, *args: str, cwd: Path | None = None, prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """`python -m ddpdeploy ARGS` with stdout opened on ``stdout_path`` (e.g. /dev/full),
    stderr captured; ``prefix`` runs it under another command (e.g. setpriv)."""
    with open(stdout_path, "w") as out:
        return subprocess.run(
            [*prefix, sys.executable, "-m", "ddpdeploy", *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )


def run_main(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`ddpdeploy ARGS` through cli.main in this process: stdout and stderr captured, the exit
    code taken from SystemExit, ``cwd`` and ``env`` (added to this process's) set for the
    call and put back after. An exception that would have been a traceback propagates."""
    from ddpdeploy.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    code: int
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
                code = 0  # main always exits; kept for the type checker
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (1 if exc.code else 0)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["ddpdeploy", *args], code, out.getvalue(), err.getvalue())
