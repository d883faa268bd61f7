"""Which pod `logs --index N` and `up --follow` read (ddpdeploy.cluster.watch), on pods as
the Job and JobSet controllers make them: a random suffix, the completion index as a label."""

from __future__ import annotations

import pytest
from fakekube import FakeKube

from ddpdeploy.cluster.saved import with_saved_spec
from ddpdeploy.cluster.watch import check_named, node_pod, rank0_pod, wait
from ddpdeploy.contract import COMPLETION_INDEX_KEY
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import layout_of, render_objects


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
    assert node_pod(job("pytorchjob"), [], None, None) is None  # none named: rank 0's


def pytorchjob(**replicas: int) -> dict:
    specs = {kind: {"replicas": n} for kind, n in replicas.items()}
    return {**job("pytorchjob"), "spec": {"pytorchReplicaSpecs": specs}}


# Found by the third hostile pass: `logs j1 --index 7`, `--index 0` and `--index 1` on a
# c10d PyTorchJob all printed the rank-0 pod's log; --index N is node N's pod on every
# target (worker-N under c10d), and a node or replica the job has not is refused, exit 2.
def test_index_alone_is_node_n_of_a_pytorchjob():
    c10d, static = pytorchjob(Worker=2), pytorchjob(Master=1, Worker=2)
    assert [node_pod(c10d, [], None, i) for i in (0, 1)] == ["j-worker-0", "j-worker-1"]
    assert [node_pod(static, [], None, i) for i in (0, 1, 2)] == [
        "j-master-0", "j-worker-0", "j-worker-1"
    ]  # fmt: skip
    for index in (0, 1):
        check_named(c10d, None, index)
        check_named(c10d, "worker", index)
    with pytest.raises(
        UserError, match=r"^--index: PyTorchJob ns/j has no node 7; its nodes are 0-1 "
    ):
        check_named(c10d, None, 7)
    with pytest.raises(
        UserError, match=r"^--index: PyTorchJob ns/j has no node 3; its nodes are 0-2 "
    ):
        check_named(static, None, 3)
    with pytest.raises(
        UserError, match=r"^--index: .* has no worker 2; its worker replicas are 0-1$"
    ):
        check_named(c10d, "worker", 2)


def test_a_replica_the_job_has_not_is_refused():
    # Found by the third hostile pass: `logs --replica master` on a c10d job (Worker
    # replicas only) read j1-master-0 and failed with the API's 404, exit 1.
    with pytest.raises(
        UserError, match=r"^--replica: PyTorchJob ns/j has worker replicas only \(c10d rendezvous\)"
    ):
        check_named(pytorchjob(Worker=2), "master", None)
    with pytest.raises(UserError, match=r"has master replicas only \(static rendezvous\)"):
        check_named(pytorchjob(Master=1), "Worker", 0)
    check_named(pytorchjob(Master=1, Worker=1), "MASTER", None)


def test_a_timeout_on_a_state_without_a_reason_adds_no_empty_brackets():
    # Found by the fifth hostile pass: `up --queue q --wait` timed out with "it is
    # Suspended ();": a Suspended job has no reason to show.
    kube = FakeKube()
    spec = JobSpec.model_validate({"image": "r.invalid/t:1", "name": "j", "namespace": "ns"})
    (job,) = [o for o in with_saved_spec(render_objects(spec), spec) if o["kind"] == "PyTorchJob"]
    job["status"] = {"conditions": [{"type": "Suspended", "status": "True"}]}
    kube.add(job)
    with pytest.raises(OperationError) as err:
        wait(kube, "j", "ns", lambda snap: None, timeout=0.1)
    assert "; it is Suspended; `ddpdeploy status j -n ns` shows it" in str(err.value)
