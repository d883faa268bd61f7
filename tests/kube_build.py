"""Where .ci/kube-build.sh's Kubernetes binaries are, for the tests that run them (tests/kube
runs the apiserver, tests/e2e the whole cluster).

CI starts the build in the background and the suite at once (.ci/run), so these tests may
come while it still runs: they wait for it, up to a bound, on the build's own lock (it holds
an exclusive flock on $CACHE/kube-build.lock for as long as it builds).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

CACHE = Path(os.environ.get("DDPDEPLOY_KUBE_CACHE", "/var/cache/ddpdeploy-test"))
LOCK = CACHE / "kube-build.lock"
BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
    "pause",
)


def required() -> bool:
    """CI's flags: a missing binary fails instead of skipping, and a build under way is
    worth waiting for."""
    return "1" in (
        os.environ.get("DDPDEPLOY_REQUIRE_CLUSTER"),
        os.environ.get("DDPDEPLOY_REQUIRE_KUBE"),
    )


def wait_seconds() -> float:
    """How long to wait for a build under way: DDPDEPLOY_KUBE_BUILD_WAIT, else 40 minutes in
    CI (a cold build takes 15-30 on 2 cores) and not at all elsewhere."""
    if value := os.environ.get("DDPDEPLOY_KUBE_BUILD_WAIT"):
        return float(value)
    return 2400.0 if required() else 0.0


def complete(folder: Path) -> bool:
    return all(os.access(folder / b, os.X_OK) for b in BINARIES)


def newest() -> Path | None:
    folders = [p for p in CACHE.glob("kube-[0-9]*") if p.is_dir() and complete(p)]
    return max(folders, key=lambda p: p.stat().st_mtime) if folders else None


def build_finished(timeout: float) -> bool:
    """True once no build holds the lock (at once when none ever ran), within ``timeout``."""
    if not LOCK.exists():
        return True
    deadline = time.monotonic() + timeout
    with open(LOCK) as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fh, fcntl.LOCK_UN)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(min(1.0, max(0.1, deadline - time.monotonic())))


def kube_bin(wait: float | None = None) -> tuple[Path | None, str]:
    """(the binaries' folder, "") or (None, why not): $DDPDEPLOY_KUBE_BIN, else the newest
    complete build in the cache; a build under way is waited for first."""
    wait = wait_seconds() if wait is None else wait
    wanted = os.environ.get("DDPDEPLOY_KUBE_BIN")
    if wanted and complete(Path(wanted)):
        return Path(wanted), ""
    log = os.environ.get("DDPDEPLOY_KUBE_BUILD_LOG")
    if not build_finished(wait):
        where = f" (its log: {log})" if log else ""
        return None, f".ci/kube-build.sh is still building after {wait:.0f}s{where}"
    if wanted:
        if complete(Path(wanted)):
            return Path(wanted), ""
        return None, f"DDPDEPLOY_KUBE_BIN={wanted} lacks some of {', '.join(BINARIES)}"
    found = newest()
    if found:
        return found, ""
    where = f"; CI's build log: {log}" if log else ""
    return None, f"no Kubernetes binaries in {CACHE} (run .ci/kube-build.sh{where})"
