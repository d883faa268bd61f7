"""Which pod is which node, and what `logs` reads (cluster/podlogs.py), on pod objects as
the operator and JobSet label them; the reading itself is tested against a real apiserver
(tests/kube/test_logs_merged.py)."""

from __future__ import annotations

import pytest

from ddpdeploy.cluster.podlogs import Select, Source, attribute, node_numbers, sources
from ddpdeploy.errors import UserError
from ddpdeploy.targets import TARGETS


def operator_pod(replica: str, index: int, restarts: int = 0) -> dict:
    labels = {
        "training.kubeflow.org/replica-type": replica,
        "training.kubeflow.org/replica-index": str(index),
    }
    status = {"containerStatuses": [{"name": "pytorch", "restartCount": restarts}]}
    return {"metadata": {"name": f"j-{replica}-{index}", "labels": labels}, "status": status}


def test_pytorchjob_master_is_node0_and_worker_i_node_i_plus_1():
    pods = [operator_pod("worker", 1), operator_pod("master", 0), operator_pod("worker", 0)]
    assert node_numbers(TARGETS["pytorchjob"], pods) == {
        "j-master-0": 0, "j-worker-0": 1, "j-worker-1": 2,
    }  # fmt: skip
    # A worker being replaced does not move the others.
    gone = [operator_pod("master", 0), operator_pod("worker", 1)]
    assert node_numbers(TARGETS["pytorchjob"], gone) == {"j-master-0": 0, "j-worker-1": 2}
    elastic = [operator_pod("worker", 1), operator_pod("worker", 0)]
    assert node_numbers(TARGETS["pytorchjob"], elastic) == {"j-worker-0": 0, "j-worker-1": 1}


def test_indexed_pods_are_their_completion_index():
    pods = [
        {"metadata": {"name": f"j-{i}-x", "labels": {
            "batch.kubernetes.io/job-completion-index": str(i)}}}
        for i in (2, 0, 1)
    ]  # fmt: skip
    assert node_numbers(TARGETS["trainjob"], pods) == {"j-2-x": 2, "j-0-x": 0, "j-1-x": 1}


def test_sources_previous_first_and_node_filter():
    pods = [operator_pod("worker", 0, restarts=2), operator_pod("master", 0)]
    got = sources(TARGETS["pytorchjob"], pods, Select())
    assert got == [
        Source("j-worker-0", 1, previous=True), Source("j-master-0", 0), Source("j-worker-0", 1)
    ]  # fmt: skip
    assert sources(TARGETS["pytorchjob"], pods, Select(nodes=frozenset({0}))) == [
        Source("j-master-0", 0)
    ]
    with pytest.raises(UserError, match="--node: the job has no pod for node 4; it has nodes 0-1"):
        sources(TARGETS["pytorchjob"], pods, Select(nodes=frozenset({4})))


def test_attribute_reads_stamp_rank_and_keeps_the_rest():
    line = attribute("2026-01-02T03:04:05.5Z [rank7]:[rank2]: x", Source("p", 3))
    assert (line.rank, line.node, line.text, line.when) == (7, 3, "[rank2]: x", 1767323045.5)
    agent = attribute("torchrun says hi", Source("p", 1, previous=True))
    assert (agent.rank, agent.previous, agent.when) == (None, True, 0.0)
    assert not Select(ranks=frozenset({0})).keeps(agent) and Select().keeps(agent)
