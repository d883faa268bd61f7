"""Run the real CLI as a subprocess, as users do.

A plain module, not conftest.py: tests/docker has a conftest of its own, and two modules
named `conftest` cannot both be imported by that name."""

from __future__ import annotations

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
