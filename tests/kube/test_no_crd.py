"""`up` on a cluster without the training operator: one line saying how to install it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from apiserver import ControlPlane, find_binaries
from cli_runner import run_cli


@pytest.fixture(scope="module")
def bare_plane(control_plane: ControlPlane, tmp_path_factory) -> Iterator[ControlPlane]:
    """A second control plane, without the PyTorchJob CRD (the CRD is cluster-wide)."""
    apiserver, etcd, _ = find_binaries()
    assert apiserver and etcd
    plane = ControlPlane(tmp_path_factory.mktemp("bare"), apiserver, etcd)
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


def test_missing_crd_says_how_to_install_the_operator(bare_plane):
    env = {
        **os.environ,
        "KUBECONFIG": str(bare_plane.kubeconfig),
        "XDG_CACHE_HOME": str(bare_plane.workdir),
    }
    out = run_cli("up", "--image", "t:1", "--no-wait", env=env)
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert "the PyTorchJob CRD (kubeflow.org/v1) is not installed" in line
    assert "kubectl apply --server-side -k" in line
    # Jobs of the other targets may still be there: list skips the kinds not served.
    listed = run_cli("list", "-o", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "[]"
