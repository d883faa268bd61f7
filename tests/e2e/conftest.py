"""The e2e tier: ddpdeploy against a real single-node Kubernetes 1.20 (.ci/cluster.sh): real
control plane, kubelet, containers, CNI and volumes; the training operator played by
operator.py and cluster DNS by cluster_dns.py (docs/ci.md says exactly what is real).

The session's cluster is brought up once and taken down at the end, or one already up is
used as it is: DDPDEPLOY_CLUSTER_KUBECONFIG names any cluster's kubeconfig, and a cluster a
person brought up with `.ci/cluster.sh up` is found by itself. Without root, the binaries
(.ci/kube-build.sh) or dnslib the tests skip, saying why, except under
DDPDEPLOY_REQUIRE_CLUSTER=1 (CI), where that is a failure. A build CI started in the
background is waited for (tests/kube_build.py); these tests also run last (tests/conftest.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import base_images
import kube_build
import pytest
from cli_runner import run_cli
from realcluster import (
    ROOT,
    SESSION_LOCK,
    Cluster,
    cluster_sh,
    fresh_namespace,
    session_lock,
)

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs on the real single-node cluster (.ci/cluster.sh)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Whatever needs the cluster is e2e, and slow: the fixture closure says it.
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)


def _note(request: pytest.FixtureRequest, text: str) -> None:
    """A line on the terminal even under capture: bring-up and teardown take a while."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n[e2e] {text}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The real cluster, up for the whole session."""
    given = os.environ.get("DDPDEPLOY_CLUSTER_KUBECONFIG")
    if given:
        yield Cluster(Path(given), None)
        return
    require = os.environ.get("DDPDEPLOY_REQUIRE_CLUSTER") == "1"

    def unavailable(why: str) -> None:
        if require:
            pytest.fail(f"DDPDEPLOY_REQUIRE_CLUSTER=1 but {why}", pytrace=False)
        pytest.skip(why)

    if os.geteuid() != 0:
        unavailable("the e2e cluster needs root (a kubelet, a bridge, iptables rules)")
    if importlib.util.find_spec("dnslib") is None:
        unavailable("no dnslib for the cluster DNS (pip install -e '.[dev]')")
    if kube_build.build_finished(0) is False:
        _note(request, "waiting for .ci/kube-build.sh to finish ...")
    folder, why = kube_build.kube_bin()
    if folder is None:
        unavailable(why)
    env = {
        "DDPDEPLOY_KUBE_BIN": str(folder),
        "DDPDEPLOY_CLUSTER_PYTHON": sys.executable,
        "DDPDEPLOY_CLUSTER_BY": "pytest",
    }
    with session_lock(wait=900) as locked:
        if not locked:
            unavailable(f"another test session holds {SESSION_LOCK} (its cluster) for 15 min")
        status = cluster_sh("status", env=env, timeout=30)
        if status.stdout.startswith("up "):
            kubeconfig = Path(status.stdout.split(None, 1)[1].strip())
            by = kubeconfig.parent / "by"
            if not by.exists() or by.read_text().strip() != "pytest":
                # One a person brought up: used as it is, and left up.
                _note(request, f"using the cluster that is up already ({kubeconfig})")
                yield Cluster(kubeconfig, kubeconfig.parent)
                return
            # Else a killed session's: taken down below, and made afresh.
        if not status.stdout.startswith("down"):
            cluster_sh("down", env=env)  # a killed run's leftovers
        start = time.monotonic()
        up = cluster_sh("up", env=env)
        if up.returncode != 0:
            pytest.fail(f".ci/cluster.sh up failed:\n{up.stderr[-4000:]}", pytrace=False)
        kubeconfig = Path(up.stdout.strip().splitlines()[-1])
        _note(request, f"cluster up in {time.monotonic() - start:.1f}s ({kubeconfig})")
        try:
            yield Cluster(kubeconfig, kubeconfig.parent)
        finally:
            start = time.monotonic()
            down = cluster_sh("down", env=env)
            _note(request, f"cluster down in {time.monotonic() - start:.1f}s")
            if down.returncode != 0:
                pytest.fail(f".ci/cluster.sh down failed:\n{down.stderr[-4000:]}", pytrace=False)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster) as name:
        yield name


@pytest.fixture(scope="session")
def e2e_cli(cluster: Cluster) -> Any:
    """`python -m ddpdeploy ARGS` against the cluster (through KUBECONFIG)."""
    return functools.partial(run_cli, cwd=ROOT, env=cluster.env, timeout=900)


@pytest.fixture(scope="session")
def e2e_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workspace the job image is built from: no trainer of its own (the built-in one is
    in every image) and the users' scripts of tests/e2e/scripts; `smoke --local` of a
    script runs here too, so both runs start the same files."""
    ws = tmp_path_factory.mktemp("ws")
    (ws / "README.md").write_text("the built-in trainer and tests/e2e/scripts\n")
    for script in sorted((HERE / "scripts").glob("*.py")):
        shutil.copy(script, ws / script.name)
    return ws


@pytest.fixture(scope="session")
def trainer_image(
    request: pytest.FixtureRequest, cluster: Cluster, e2e_workspace: Path
) -> Iterator[str]:
    """`ddpdeploy build` of ``e2e_workspace`` on the local torch image
    (tests/docker/base_images.py), in the Docker engine the kubelet uses: with
    imagePullPolicy IfNotPresent, nothing is pulled."""
    import docker

    engine = docker.from_env()
    capture = request.config.pluginmanager.getplugin("capturemanager")
    start = time.monotonic()
    with capture.global_and_fixture_disabled():
        torch_image = base_images.ensure_images(engine)["torch"]
    repo = f"ddpdeploy-test/e2e-{os.getpid()}"
    res = run_cli(
        "build", "-w", str(e2e_workspace), "--image", repo, "--base-image", torch_image,
        "--network", "none", cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    _note(request, f"job image {res.stdout.strip()} in {time.monotonic() - start:.0f}s")
    yield res.stdout.strip()
    for image in engine.images.list(name=repo):
        for tag in image.tags:
            with contextlib.suppress(docker.errors.APIError):
                engine.images.remove(tag, force=True)


class CleanWeights:
    """The weights_sha256 of `smoke --local` for a spec's training (its nodes, procs and
    command): what a run on the cluster must end with, killed or not. Each distinct training
    runs once a session; ``start`` runs it in the background (beside a cluster job)."""

    def __init__(self, workspace: Path, tmp: pytest.TempPathFactory) -> None:
        self.workspace, self.tmp = workspace, tmp
        self.lock = threading.Lock()
        self.runs: dict[str, concurrent.futures.Future[str]] = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)

    @staticmethod
    def key(spec: dict[str, Any]) -> str:
        return json.dumps(
            [spec["nodes"], spec["procs"], spec.get("cpu"), spec["command"]], sort_keys=True
        )

    def start(self, spec: dict[str, Any]) -> None:
        with self.lock:
            key = self.key(spec)
            if key not in self.runs:
                self.runs[key] = self.pool.submit(self._smoke, spec)

    def __call__(self, spec: dict[str, Any]) -> str:
        self.start(spec)
        return self.runs[self.key(spec)].result(timeout=900)

    def _smoke(self, spec: dict[str, Any]) -> str:
        from e2ejob import smoke_weights, write_spec

        folder = self.tmp.mktemp("smoke")
        for script in self.workspace.glob("*.py"):
            shutil.copy(script, folder / script.name)
        # cpu too: each process's share of it is its OMP_NUM_THREADS, there as on the pods.
        keep = ("name", "nodes", "procs", "gpus", "cpu", "checkpoint", "command")
        spec_file = write_spec(folder, {k: v for k, v in spec.items() if k in keep})
        return smoke_weights(functools.partial(run_cli, timeout=900), spec_file, folder)


@pytest.fixture(scope="session")
def clean_weights(
    e2e_workspace: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CleanWeights]:
    weights = CleanWeights(e2e_workspace, tmp_path_factory)
    yield weights
    weights.pool.shutdown(wait=True, cancel_futures=True)
