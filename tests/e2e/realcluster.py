"""The e2e cluster as the tests see it (plain module: test files import it; conftest.py holds
the fixtures): .ci/cluster.sh, the session's lock, fresh namespaces, and the stand-ins'
modules loaded under names of their own."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLUSTER_SH = ROOT / ".ci" / "cluster.sh"
SESSION_LOCK = Path("/run/lock/ddpdeploy-cluster.session.lock")


def load(name: str) -> ModuleType:
    """tests/e2e/<name>.py as module e2e_<name>: `operator` is the standard library's (which
    every interpreter has loaded before any test runs), so it is never imported by its name."""
    key = f"e2e_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@dataclass
class Cluster:
    kubeconfig: Path
    state: Path | None  # the cluster's state folder when .ci/cluster.sh made it

    @property
    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    def api(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))

    def log_tail(self, name: str, lines: int = 40) -> str:
        """The end of a component's log (operator, dns, kubelet, ...), for failure messages."""
        if self.state is None:
            return f"(no {name} log: this cluster was not brought up by .ci/cluster.sh)"
        path = self.state / "logs" / f"{name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(cannot read {path}: {exc})"


def cluster_sh(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def session_lock(wait: float) -> Iterator[bool]:
    """One test session's cluster at a time on this machine (two clones' sessions would
    otherwise take each other's cluster down)."""
    SESSION_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(SESSION_LOCK, "w") as fh:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(2)
        yield True


_namespaces = itertools.count()


@contextlib.contextmanager
def fresh_namespace(cluster: Cluster) -> Iterator[str]:
    """A new namespace, deleted afterwards (its jobs, pods and PVCs with it: the real
    namespace controller and garbage collector do that)."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    name = f"e2e-{os.getpid()}-{next(_namespaces)}"
    core.create_namespace({"metadata": {"name": name}})
    # Pods need the namespace's default ServiceAccount, which the controller-manager makes.
    deadline = time.monotonic() + 60
    while not core.list_namespaced_service_account(name).items:
        assert time.monotonic() < deadline, f"no default ServiceAccount in {name}"
        time.sleep(0.2)
    try:
        yield name
    finally:
        core.delete_namespace(name)
