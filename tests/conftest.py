"""Test tiers: `python -m pytest -m "not slow"` is the fast inner loop; CI runs everything.

Tests that start torchrun, the wheel build or checkov carry `slow` in their own module.
Containers and the apiserver are marked here, by the fixtures that start them, so a test
in tests/docker or tests/kube that needs neither (a refusal before any engine is asked)
stays in the fast tier, and a new engine or apiserver test cannot forget the marker.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator

import pytest
from local_smoke import leftovers

# The engine's and the apiserver's fixtures, shared by every folder that needs them (set up
# once a session); the plain modules they live in are on pyproject.toml's `pythonpath`.
pytest_plugins = ["docker_fixtures", "kube_fixtures"]

# The fixtures that reach a Docker engine or start a kube-apiserver
# or a cluster (tests/docker/docker_fixtures.py, tests/kube/kube_fixtures.py,
# tests/kube/test_no_crd.py, tests/e2e/conftest.py).
SLOW_FIXTURES = frozenset({"engine", "control_plane", "bare_plane", "cluster"})


# Not trylast: `-m` deselects in the mark plugin's hook, which must run after this one. The
# folders' conftests (tests/kube, tests/e2e) are registered later, so their hooks run first.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # fixturenames is the closure: a fixture that uses `engine` counts too.
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # The tests that run .ci/kube-build.sh's binaries go last, e2e last of all: CI builds
    # them in the background while everything else runs (their fixtures wait for the build).
    items.sort(key=lambda item: 2 if item.get_closest_marker("e2e") else
               1 if item.get_closest_marker("kube") else 0)  # fmt: skip


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """A cluster command run in-process (cli.main) installs its SIGINT/SIGTERM handlers
    (signals.catch_signals), as the CLI process should; the next test in this process
    gets Python's own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def marker() -> Iterator[str]:
    """A fresh tag for a smoke run's processes (tests/local_smoke.py); whatever carries it at
    the end is killed, to keep the machine clean even when the test failed."""
    value = f"ddpdeploy-test-{uuid.uuid4().hex}"
    yield value
    for pid in leftovers(value):
        os.kill(pid, signal.SIGKILL)
