"""Which pod is which node, and what `logs` reads (cluster/podlogs.py), on pod objects as
the operator and JobSet label them; the reading itself is tested against a real apiserver
(tests/kube/test_logs_merged.py)."""

from __future__ import annotations

import pytest
from fakekube import FakeKube

from ddpdeploy.cluster.find import holds_its_name
from ddpdeploy.cluster.podlogs import (
    Followed,
    Run,
    Select,
    Source,
    attribute,
    made_for,
    next_runs,
    node_numbers,
    rank0_progress,
    run_of,
    sources,
)
from ddpdeploy.contract import COMPLETION_INDEX_KEY
from ddpdeploy.errors import UserError
from ddpdeploy.events import Progress
from ddpdeploy.targets import TARGETS


def operator_pod(replica: str, index: int, restarts: int = 0) -> dict:
    labels = {
        "training.kubeflow.org/replica-type": replica,
        "training.kubeflow.org/replica-index": str(index),
    }
    status = {"containerStatuses": [{"name": "pytorch", "restartCount": restarts}]}
    return {"metadata": {"name": f"j-{replica}-{index}", "labels": labels}, "status": status}


def pytorchjob(**replicas: int) -> dict:
    specs = {kind.capitalize(): {"replicas": n} for kind, n in replicas.items()}
    return {"kind": "PyTorchJob", "spec": {"pytorchReplicaSpecs": specs}}


STATIC = pytorchjob(master=1, worker=2)


def test_pytorchjob_master_is_node0_and_worker_i_node_i_plus_1():
    pods = [operator_pod("worker", 1), operator_pod("master", 0), operator_pod("worker", 0)]
    assert node_numbers(TARGETS["pytorchjob"], STATIC, pods) == {
        "j-master-0": 0, "j-worker-0": 1, "j-worker-1": 2,
    }  # fmt: skip
    # A worker being replaced does not move the others.
    gone = [operator_pod("master", 0), operator_pod("worker", 1)]
    assert node_numbers(TARGETS["pytorchjob"], STATIC, gone) == {"j-master-0": 0, "j-worker-1": 2}
    # Nor does the master (cluster3 F10: sized by the pods seen, worker-0 became node 0).
    no_master = [operator_pod("worker", 0), operator_pod("worker", 1)]
    assert node_numbers(TARGETS["pytorchjob"], STATIC, no_master) == {
        "j-worker-0": 1, "j-worker-1": 2,
    }  # fmt: skip
    elastic = [operator_pod("worker", 1), operator_pod("worker", 0)]
    assert node_numbers(TARGETS["pytorchjob"], pytorchjob(worker=2), elastic) == {
        "j-worker-0": 0, "j-worker-1": 1,
    }  # fmt: skip
    # A master beyond the job's one would take worker-0's number: left out.
    extra = [operator_pod("master", 1), operator_pod("worker", 0)]
    assert node_numbers(TARGETS["pytorchjob"], STATIC, extra) == {"j-worker-0": 1}


def test_indexed_pods_are_their_completion_index():
    pods = [
        {"metadata": {"name": f"j-{i}-x", "labels": {
            "batch.kubernetes.io/job-completion-index": str(i)}}}
        for i in (2, 0, 1)
    ]  # fmt: skip
    assert node_numbers(TARGETS["trainjob"], {"kind": "TrainJob"}, pods) == {
        "j-2-x": 2,
        "j-0-x": 0,
        "j-1-x": 1,
    }


ONE_WORKER = pytorchjob(master=1, worker=1)


def test_sources_previous_first_and_node_filter():
    pods = [operator_pod("worker", 0, restarts=2), operator_pod("master", 0)]
    got = sources(TARGETS["pytorchjob"], ONE_WORKER, pods, Select())
    assert got == [
        Source("j-worker-0", 1, previous=True), Source("j-master-0", 0), Source("j-worker-0", 1)
    ]  # fmt: skip
    assert sources(TARGETS["pytorchjob"], ONE_WORKER, pods, Select(nodes=frozenset({0}))) == [
        Source("j-master-0", 0)
    ]
    with pytest.raises(UserError, match="--node: the job has no pod for node 4; it has nodes 0-1"):
        sources(TARGETS["pytorchjob"], ONE_WORKER, pods, Select(nodes=frozenset({4})))


def test_attribute_reads_stamp_rank_and_keeps_the_rest():
    (line,) = attribute("2026-01-02T03:04:05.5Z [rank7]:[rank2]: x", Source("p", 3))
    assert (line.rank, line.node, line.text, line.when) == (7, 3, "[rank2]: x", 1767323045.5)
    (agent,) = attribute("torchrun says hi", Source("p", 1, previous=True))
    assert (agent.rank, agent.previous, agent.when) == (None, True, 0.0)
    assert not Select(ranks=frozenset({0})).keeps(agent) and Select().keeps(agent)


def test_a_partial_line_and_the_next_ranks_are_each_their_ranks_own():
    # torchrun's tee writes a rank's last write without its newline as it is, and the next
    # rank's line runs on from it: `logs --rank 0` shows rank 0's part, not rank 1's line.
    got = attribute("2026-01-02T03:04:05.5Z [rank1]:loading[rank0]:step 3", Source("p", 0))
    assert [(t.rank, t.text, t.when) for t in got] == [
        (1, "loading", 1767323045.5), (0, "step 3", 1767323045.5)
    ]  # fmt: skip
    assert [t.text for t in got if Select(ranks=frozenset({0})).keeps(t)] == ["step 3"]


def test_status_finds_rank0s_start_run_on_from_another_ranks_partial_line():
    # The start event is read from the log's head when the tail holds none; one that ran on
    # from rank 1's partial line is rank 0's all the same (else no total steps, no ETA).
    kube = FakeKube()
    start = '{"event": "start", "total_steps": 500}'
    steps = [f'[rank0]:{{"event": "step", "step": {i}}}' for i in range(1, 301)]
    kube.pod_logs["j-0-abc0"] = [f"[rank1]:partial[rank0]:{start}", *steps]
    job = {"apiVersion": TARGETS["trainjob"].api_version, "kind": TARGETS["trainjob"].kind,
           "metadata": {"name": "j", "namespace": "ns"}}  # fmt: skip
    pods = [{"metadata": {"name": "j-0-abc0", "labels": {COMPLETION_INDEX_KEY: "0"}}}]
    got = rank0_progress(kube, job, pods, now=0.0)
    assert isinstance(got, Progress) and (got.step, got.total_steps) == (300, 500)


# ---- following: which run of which pod to read next ------------------------------------

JOB = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
       "metadata": {"name": "j", "uid": "job-uid"}}  # fmt: skip
OURS = {"app.kubernetes.io/managed-by": "ddpdeploy", "app.kubernetes.io/instance": "j"}


def pod_run(replica: str, index: int, uid: str, restarts: int = 0, state: str = "running",
            labels: dict | None = None, owner: str | None = None) -> dict:  # fmt: skip
    pod = operator_pod(replica, index, restarts)
    pod["metadata"]["uid"] = uid
    pod["metadata"]["labels"].update(labels or {})
    if owner is not None:
        ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j", "uid": owner}
        pod["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
    (status,) = pod["status"]["containerStatuses"]
    status["state"] = {state: {}}
    return pod


def test_run_of_is_the_run_a_log_read_gets():
    assert run_of(pod_run("master", 0, "u1", restarts=2), "pytorch") == Run("u1", 2)
    assert run_of(pod_run("master", 0, "u1", state="waiting"), "pytorch") is None
    backoff = pod_run("master", 0, "u1", restarts=3, state="waiting")
    backoff["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 1}}
    assert run_of(backoff, "pytorch") == Run("u1", 3)  # the last run, until the next starts
    assert run_of(pod_run("master", 0, "u1"), "istio-proxy") is None
    assert run_of({"metadata": {"name": "p"}}, "pytorch") is None


def test_made_for_needs_our_labels_and_the_jobs_uid():
    assert made_for(pod_run("worker", 0, "u", labels=OURS, owner="job-uid"), JOB)
    # With our labels but no controller: made by hand, never read (it was, as a JobSet's).
    assert not made_for(pod_run("worker", 0, "u", labels=OURS), JOB)
    assert not made_for(pod_run("worker", 0, "u"), JOB)  # the operator's labels only
    assert not made_for(pod_run("worker", 0, "u", labels=OURS, owner="other-uid"), JOB)
    other = {**OURS, "app.kubernetes.io/instance": "k"}
    assert not made_for(pod_run("worker", 0, "u", labels=other, owner="job-uid"), JOB)
    # The job's uid under another name (cluster2 D1): the reference is not to this job.
    renamed = pod_run("worker", 0, "u", labels=OURS, owner="job-uid")
    renamed["metadata"]["ownerReferences"][0]["name"] = "other"
    assert not made_for(renamed, JOB)


def test_only_an_earlier_run_of_the_job_holds_its_name():
    # Found by the cluster2 pass: status counted another job's deleting pod (and one with
    # no controller) as an earlier run's, "2/2 pods running" of a 1-node job.
    def deleting(owner: str | None, name: str = "j") -> dict:
        pod = pod_run("worker", 5, "u", labels=OURS, owner=owner)
        pod["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
        if owner is not None:
            pod["metadata"]["ownerReferences"][0]["name"] = name
        return pod

    assert holds_its_name(deleting("old-uid"), JOB)
    assert not holds_its_name(deleting("job-uid"), JOB)  # this run's own, being deleted
    assert not holds_its_name(deleting("their-uid", name="theirs"), JOB)
    assert not holds_its_name(deleting(None), JOB)
    alive = deleting("old-uid")
    del alive["metadata"]["deletionTimestamp"]
    assert not holds_its_name(alive, JOB)


def _owned(pod: dict, *owners: dict) -> dict:
    pod["metadata"]["ownerReferences"] = list(owners)
    return pod


def test_a_trainjobs_pod_is_its_jobset_jobs():
    train = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
             "metadata": {"name": "j", "uid": "tj-uid"}}  # fmt: skip
    child = {"apiVersion": "batch/v1", "kind": "Job", "name": "j-node-0", "controller": True}
    assert made_for(_owned(pod_run("worker", 0, "u", labels=OURS), child), train)
    for wrong in (
        {**child, "name": "k-node-0"},  # another job's
        {**child, "name": "j-evil"},  # no Job of its JobSet (cluster2 D2)
        {**child, "name": "j-"},
        {**child, "name": "j-node-0x"},
        {**child, "kind": "ReplicaSet", "apiVersion": "apps/v1"},  # not a Job's
        {**child, "controller": False},  # an owner, not its controller
    ):
        assert not made_for(_owned(pod_run("worker", 0, "u", labels=OURS), wrong), train)
    # A batch Job as controller is no PyTorchJob's pod.
    assert not made_for(_owned(pod_run("worker", 0, "u", labels=OURS), child), JOB)
    twice = _owned(pod_run("worker", 0, "u", labels=OURS), child, {**child, "name": "j-x"})
    assert not made_for(twice, train)  # two controllers: no real pod has


def test_next_runs_restart_replace_new_and_never_twice():
    layout = TARGETS["pytorchjob"]
    seen = Followed({"j-master-0": Run("m", 0), "j-worker-0": Run("w", 0)}, set(), {"m", "w"})
    pods = [pod_run("master", 0, "m"), pod_run("worker", 0, "w")]
    assert next_runs(layout, JOB, pods, seen, None) == []  # nothing new
    pods = [
        pod_run("master", 0, "m", restarts=1),
        pod_run("worker", 0, "w2", labels=OURS, owner="job-uid"),
        pod_run("worker", 1, "w3", labels=OURS, owner="job-uid"),
        pod_run("worker", 2, "x", labels={}),  # a look-alike: never
    ]
    got = next_runs(layout, JOB, pods, seen, None)
    assert [(source, run) for source, run, _ in got] == [
        (Source("j-master-0", 0), Run("m", 1)),
        (Source("j-worker-0", 1), Run("w2", 0)),
        (Source("j-worker-1", 2), Run("w3", 0)),
    ]
    assert [line for *_, line in got] == [
        "[node0] container restarted (restart 1); following the new one",
        "[node1] pod j-worker-0 replaced (a new pod); following it",
        "[node2] new pod j-worker-1; following it",
    ]
    # A stream still open is waited for; --node keeps to its nodes.
    busy = Followed(dict(seen.shown), {"j-master-0"}, seen.known)
    assert [s.pod for s, *_ in next_runs(layout, JOB, pods, busy, frozenset({0, 2}))] == [
        "j-worker-1"
    ]
    # A pod of the first list whose container had not started: its first run, trusted.
    late = Followed({}, set(), {"m"})
    (only,) = next_runs(layout, JOB, [pod_run("master", 0, "m")], late, None)
    assert only[2] == "[node0] container started; following it"


# Found by the third hostile pass: the 1.20 kubelet answers a gone container's log with its
# own error (HTTP 200), which was shown as the pod's line; such a body alone is
# LogUnavailable, and the same words written by the pod itself stay its lines.
def test_the_kubelets_own_error_as_a_log_is_log_unavailable():
    from ddpdeploy.adapters.kube import kubelet_checked
    from ddpdeploy.errors import LogUnavailable

    gone = [
        "unable to retrieve container logs for docker://ec1c" + "0" * 60,
        "Unable to retrieve container logs for containerd://ab12",
        "rpc error: code = Unknown desc = Error: No such container: ec1c0f",
        "rpc error: code = NotFound desc = an error occurred when try to find container "
        '"ab12": not found',
        'failed to try resolving symlinks in path "/var/log/pods/x/0.log": lstat x: no such file',
    ]
    for body in gone:
        for stamps in (False, True):
            with pytest.raises(LogUnavailable, match=r"^the log of pod p is unavailable \(the"):
                list(kubelet_checked(iter([body]), stamps, "the log of pod p"))
    stamp = "2026-01-01T00:00:00.000000001Z "
    # Read with timestamps, a bare line after the log is the kubelet's: dropped.
    assert list(kubelet_checked(iter([stamp + "a", gone[2]]), True, "x")) == [stamp + "a"]
    # The pod's own lines in those words: stamped, or not alone.
    assert list(kubelet_checked(iter([stamp + gone[0]]), True, "x")) == [stamp + gone[0]]
    assert list(kubelet_checked(iter([gone[0], "more"]), False, "x")) == [gone[0], "more"]
    assert list(kubelet_checked(iter(["a", gone[0]]), False, "x")) == ["a", gone[0]]
    assert list(kubelet_checked(iter(["rpc error: code = Unknown desc = boom"]), False, "x")) == [
        "rpc error: code = Unknown desc = boom"
    ]
