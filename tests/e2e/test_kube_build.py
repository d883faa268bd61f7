"""tests/kube_build.py: the cluster tests find .ci/kube-build.sh's binaries, and wait for a
build under way (CI starts it in the background) by its lock, up to a bound."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import kube_build
import pytest


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(kube_build, "CACHE", tmp_path)
    monkeypatch.setattr(kube_build, "LOCK", tmp_path / "kube-build.lock")
    monkeypatch.delenv("DDPDEPLOY_KUBE_BIN", raising=False)
    monkeypatch.delenv("DDPDEPLOY_KUBE_BUILD_LOG", raising=False)
    return tmp_path


def built(folder: Path) -> Path:
    folder.mkdir()
    for name in kube_build.BINARIES:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_the_newest_complete_build_is_found(cache: Path) -> None:
    folder, why = kube_build.kube_bin(0)
    assert folder is None and "run .ci/kube-build.sh" in why
    older = built(cache / "kube-1.20-aaa")
    (cache / "kube-1.20-ccc").mkdir()  # a build that never finished: no binaries
    newer = built(cache / "kube-1.20-bbb")
    assert kube_build.kube_bin(0) == (newer, "")
    (newer / "kubelet").unlink()
    assert kube_build.kube_bin(0) == (older, "")


def test_a_build_holding_the_lock_is_waited_for(cache: Path) -> None:
    folder = cache / "kube-1.20-key"
    lock = cache / "kube-build.lock"
    lock.touch()
    # A build: holds the lock (as .ci/kube-build.sh does with flock), then leaves its
    # binaries and lets go.
    script = (
        f"exec 9>{lock}; flock 9; echo locked; sleep 1.5; mkdir {folder}; "
        f"for b in {' '.join(kube_build.BINARIES)}; do printf '' > {folder}/$b; "
        f"chmod +x {folder}/$b; done"
    )
    build = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert build.stdout and build.stdout.readline() == "locked\n"
        folder_now, why = kube_build.kube_bin(0.2)
        assert folder_now is None and "still building" in why
        start = time.monotonic()
        assert kube_build.kube_bin(30) == (folder, "")
        assert time.monotonic() - start < 10
    finally:
        build.wait(timeout=30)


def test_ci_waits_and_elsewhere_nothing_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "DDPDEPLOY_KUBE_BUILD_WAIT",
        "DDPDEPLOY_REQUIRE_CLUSTER",
        "DDPDEPLOY_REQUIRE_KUBE",
    ):
        monkeypatch.delenv(name, raising=False)
    assert kube_build.wait_seconds() == 0
    monkeypatch.setenv("DDPDEPLOY_REQUIRE_CLUSTER", "1")
    assert kube_build.wait_seconds() == 2400
    monkeypatch.setenv("DDPDEPLOY_KUBE_BUILD_WAIT", "5")
    assert kube_build.wait_seconds() == 5
