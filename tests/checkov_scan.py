"""checkov for the tests that scan rendered objects with it (tests/test_checkov.py,
tests/collect/test_pod.py): where it is, and the allowlist of the checks our objects may fail
(tests/checkov/allowlist.yaml, each entry with its reason and the cases it covers)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

ALLOWLIST = Path(__file__).resolve().parent / "checkov" / "allowlist.yaml"


def checkov_path() -> str:
    path = os.environ.get("DDPDEPLOY_CHECKOV") or shutil.which("checkov")
    if path and os.access(path, os.X_OK):
        return path
    reason = 'checkov not found: export DDPDEPLOY_CHECKOV="$(bash .ci/checkov-setup.sh)"'
    if os.environ.get("DDPDEPLOY_REQUIRE_CHECKOV") == "1":
        pytest.fail(f"DDPDEPLOY_REQUIRE_CHECKOV=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def allowlist() -> dict[str, Any]:
    entries = yaml.safe_load(ALLOWLIST.read_text())
    for check, entry in entries.items():
        assert entry.get("reason") and entry.get("cases"), f"{check}: needs reason and cases"
    return entries
