"""Which pod `logs --index N` and `up --follow` read (ddpdeploy.cluster.watch), on pods as
the Job and JobSet controllers make them: a random suffix, the completion index as a label."""

from __future__ import annotations

import pytest

from ddpdeploy.cluster.watch import node_pod, rank0_pod
from ddpdeploy.contract import COMPLETION_INDEX_KEY
from ddpdeploy.targets import layout_of


def job(target: str) -> dict:
    layout = layout_of(target)
    meta = {"name": "j", "namespace": "ns"}
    return {"apiVersion": layout.api_version, "kind": layout.kind, "metadata": meta}


def pods(n: int = 3) -> list[dict]:
    return [
        {"metadata": {"name": f"j-{i}-abc{i}", "labels": {COMPLETION_INDEX_KEY: str(i)}}}
        for i in reversed(range(n))
    ]


@pytest.mark.parametrize("target", ["trainjob", "indexed-job"])
def test_index_n_is_node_ns_pod(target):
    for index in range(3):
        assert node_pod(job(target), pods(), None, index) == f"j-{index}-abc{index}"
    assert node_pod(job(target), pods(), None, 7) is None
    assert node_pod(job(target), pods(), None, None) is None  # none named: rank 0's then


@pytest.mark.parametrize("target", ["trainjob", "indexed-job"])
def test_rank0_under_static_rendezvous_is_node_0_without_a_hostname(target):
    assert rank0_pod(None, job(target), pods()) == "j-0-abc0"  # type: ignore[arg-type]


def test_a_pytorchjob_names_its_pods_by_replica_and_index():
    assert node_pod(job("pytorchjob"), [], "worker", 1) == "j-worker-1"
    assert node_pod(job("pytorchjob"), [], None, 1) is None  # --index alone: rank 0's
