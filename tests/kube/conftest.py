"""Every test in this folder needs etcd and a kube-apiserver binary: marked `kube` here (the
fixtures that start the apiserver: kube_fixtures.py, registered by tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(pytest.mark.kube)
