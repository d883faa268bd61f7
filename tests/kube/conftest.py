"""Fixtures for the cluster tests: a real kube-apiserver (with etcd) on 127.0.0.1.

Without the binaries the tests skip, saying why, unless DDPDEPLOY_REQUIRE_KUBE=1 (CI), where
a missing binary is a failure: CI must not go green by skipping.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # apiserver.py and actors.py, plain modules beside these tests
sys.path.insert(0, str(HERE.parent))  # cli_runner, shared with the other CLI tests

from apiserver import LIMITED_NAMESPACE, ControlPlane, find_binaries  # noqa: E402
from cli_runner import run_cli  # noqa: E402

CRD_FILE = ROOT / "tests" / "schemas" / "kubeflow.org_pytorchjobs.yaml"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(pytest.mark.kube)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kube: needs etcd and a kube-apiserver binary")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    apiserver, etcd, missing = find_binaries()
    if missing:
        reason = f"no {missing}"
        if os.environ.get("DDPDEPLOY_REQUIRE_KUBE") == "1":
            pytest.fail(f"DDPDEPLOY_REQUIRE_KUBE=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    assert apiserver and etcd
    plane = ControlPlane(tmp_path_factory.mktemp("kube"), apiserver, etcd)
    try:
        plane.start()
        admin = _admin_client(plane)
        _install_crd(admin)
        _grant_limited_user(admin)
        yield plane
    finally:
        plane.stop()


def _admin_client(plane: ControlPlane) -> Any:
    from kubernetes import config, dynamic

    api = config.new_client_from_config(str(plane.kubeconfig), context="admin")
    return dynamic.DynamicClient(api, cache_file=str(plane.workdir / "discovery.json"))


def _install_crd(admin: Any) -> None:
    """A plain create: 1.20 prunes the CRD's x-kubernetes-validations, which it does not
    know, while a server-side apply of the same CRD is refused."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    crds = admin.resources.get(
        api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
    )
    crds.create(body=crd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = crds.get(name=crd["metadata"]["name"]).to_dict().get("status") or {}
        established = any(
            c["type"] == "Established" and c["status"] == "True"
            for c in status.get("conditions") or []
        )
        if established:
            break
        time.sleep(0.2)
    # The custom endpoints answer 404 for a moment after Established.
    while time.monotonic() < deadline:
        try:
            admin.resources.get(api_version="kubeflow.org/v1", kind="PyTorchJob").get(
                namespace="default"
            )
            return
        except Exception:
            admin.resources.invalidate_cache()
            time.sleep(0.2)
    raise RuntimeError("the PyTorchJob CRD never became served")


def _grant_limited_user(admin: Any) -> None:
    """The limited user may do anything, PyTorchJobs included, in one namespace only."""
    ns = admin.resources.get(api_version="v1", kind="Namespace")
    ns.create(body={"metadata": {"name": LIMITED_NAMESPACE}})
    roles = admin.resources.get(api_version="rbac.authorization.k8s.io/v1", kind="Role")
    roles.create(
        namespace=LIMITED_NAMESPACE,
        body={
            "metadata": {"name": "all"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        },
    )
    bindings = admin.resources.get(api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding")
    bindings.create(
        namespace=LIMITED_NAMESPACE,
        body={
            "metadata": {"name": "limited-all"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "all"},
            "subjects": [
                {"kind": "User", "name": "limited", "apiGroup": "rbac.authorization.k8s.io"}
            ],
        },
    )


@pytest.fixture(scope="session")
def admin(control_plane: ControlPlane) -> Any:
    """A dynamic client with system:masters rights, for the tests' operator/kubelet roles."""
    return _admin_client(control_plane)


_ns_counter = itertools.count()


@pytest.fixture
def namespace(admin: Any) -> str:
    """A fresh namespace per test (no controller manager would empty a deleted one)."""
    name = f"t{os.getpid()}-{next(_ns_counter)}"
    admin.resources.get(api_version="v1", kind="Namespace").create(
        body={"metadata": {"name": name}}
    )
    return name


@pytest.fixture(scope="session")
def kube_cli(control_plane: ControlPlane) -> Any:
    """`python -m ddpdeploy ARGS` against the test apiserver (through KUBECONFIG)."""
    env = {"KUBECONFIG": str(control_plane.kubeconfig)}
    return functools.partial(run_cli, cwd=ROOT, env=env, timeout=120)
