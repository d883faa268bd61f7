"""Run the real CLI as a subprocess, as users do.

A plain module, not conftest.py: tests/docker has a conftest of its own, and two modules
named `conftest` cannot both be imported by that name."""

from __future__ import annotations

import os
import subprocess
import sys
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
