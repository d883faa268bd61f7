"""Read by mypy --strict only (tests/test_fakekube.py): FakeKube is a KubeApi as the product
declares it, signatures included (isinstance on the runtime-checkable protocol sees only
the names)."""

from __future__ import annotations

from fakekube import FakeKube

from ddpdeploy.adapters.kube import KubeApi

FAKE: KubeApi = FakeKube()
