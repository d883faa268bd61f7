"""The cluster tests' fixtures: a real kube-apiserver (with etcd) on 127.0.0.1, for every
test that needs one (tests/kube, tests/collect's cluster tests); a plugin that
tests/conftest.py registers, so the control plane starts once a session.

Without the binaries the tests skip, saying why, unless DDPDEPLOY_REQUIRE_KUBE=1 (CI), where
a missing binary is a failure: CI must not go green by skipping.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import LIMITED_NAMESPACE, ControlPlane, find_binaries
from cli_runner import run_cli
from kubelet import Kubelet

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "tests" / "schemas" / "kubeflow.org_pytorchjobs.yaml"
TRAINJOB_CRD = ROOT / "tests" / "schemas" / "trainer.kubeflow.org_trainjobs.yaml"


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
        admin = plane.admin_client()
        plane.install_crd(CRD_FILE)
        plane.install_crd(_for_old_apiservers(TRAINJOB_CRD, plane.workdir))
        _grant_limited_user(admin)
        yield plane
    finally:
        plane.stop()


def _for_old_apiservers(crd_file: Path, workdir: Path) -> Path:
    """The CRD with its schema's `default: ""` on names turned into `required`: kube-apiserver
    1.20 refuses those defaults. The renders are checked against the unchanged CRD in
    tests/test_targets.py; here only up/status/list/down are under test."""
    import yaml

    def strip(node: Any) -> Any:
        if isinstance(node, list):
            return [strip(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: strip(v) for k, v in node.items() if not (k == "default" and v == "")}
        # A list-map key must have a default or be required: required, then.
        emptied = [k for k, p in (node.get("properties") or {}).items() if p.get("default") == ""]
        if emptied:
            out["required"] = sorted({*out.get("required", []), *emptied})
        return out

    out = workdir / crd_file.name
    out.write_text(yaml.safe_dump(strip(yaml.safe_load(crd_file.read_text()))))
    return out


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
    return control_plane.admin_client()


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
    env = {
        "KUBECONFIG": str(control_plane.kubeconfig),
        "XDG_CACHE_HOME": str(control_plane.workdir / "cache"),  # discovery cache
    }
    return functools.partial(run_cli, cwd=ROOT, env=env, timeout=120)


@pytest.fixture
def kubelet(admin: Any, tmp_path: Path) -> Iterator[Kubelet]:
    """A kubelet stand-in with its Node registered: pods created on ``kubelet.node_name``
    have logs the real apiserver proxies to it."""
    stand_in = Kubelet(tmp_path).start()
    stand_in.register(admin)
    try:
        yield stand_in
    finally:
        stand_in.stop()
        stand_in.unregister(admin)
