"""The tree stays ruff-clean (rules in pyproject.toml)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# This interpreter's ruff (the dev extra), not whatever is first on PATH.
RUFF = [sys.executable, "-m", "ruff"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return subprocess.run([*RUFF, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_is_clean():
    res = _ruff("check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format_is_clean():
    res = _ruff("format", "--check", ".")
    assert res.returncode == 0, res.stdout + res.stderr
