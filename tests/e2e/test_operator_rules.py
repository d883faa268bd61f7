"""The operator stand-in's decisions, without a cluster: what training-operator v1.9 does for
a job and its pods (pkg/controller.v1/pytorch, pkg/controller.v1/common, pkg/util/status.go,
pkg/webhooks/pytorch), checked one rule at a time. Fast tier: pure functions only."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from realcluster import load

op = load("operator")
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
INIT = "init:1"


def job(
    name: str = "tj",
    master: bool = True,
    workers: int = 1,
    policy: str = "OnFailure",
    **spec: Any,
) -> dict[str, Any]:
    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": policy,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "pytorch",
                            "image": "img:1",
                            "env": [{"name": "OWN", "value": "1"}],
                            "ports": [{"name": "pytorchjob-port", "containerPort": 29500}],
                        }
                    ]
                },
            },
        }

    replicas = {"Master": replica(1)} if master else {}
    if workers:
        replicas["Worker"] = replica(workers)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1"},
        "spec": {"pytorchReplicaSpecs": replicas, **spec},
    }


def pod(
    name: str, rtype: str, index: int, phase: str, exit_code: int | None = None, uid: str = "uid-1"
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [
            {"name": "pytorch", "state": {"terminated": {"exitCode": exit_code}}}
        ]
    return {
        "metadata": {
            "name": f"{name}-{rtype}-{index}",
            "labels": {
                "training.kubeflow.org/job-name": name,
                "training.kubeflow.org/replica-type": rtype,
                "training.kubeflow.org/replica-index": str(index),
            },
            "ownerReferences": [{"controller": True, "uid": uid}],
        },
        "status": status,
    }


def conditions(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["type"], c["status"]) for c in status.get("conditions") or []]


def env_of(obj: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in obj["spec"]["containers"][0]["env"]}


def test_defaults_are_applied_in_memory_only() -> None:
    raw = job(policy="")
    del raw["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    raw["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"] = []
    before = copy.deepcopy(raw)
    out = op.defaulted(raw)
    assert raw == before
    assert out["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    assert out["spec"]["nprocPerNode"] == "auto"
    worker = out["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (1, "OnFailure")
    ports = worker["template"]["spec"]["containers"][0]["ports"]
    assert ports == [{"name": "pytorchjob-port", "containerPort": 23456}]


def test_a_new_job_gets_a_pod_and_a_headless_service_per_replica() -> None:
    plan = op.plan_reconcile(job(nprocPerNode="2"), [], [], NOW, INIT)
    assert conditions(plan.status) == [("Created", "True")]
    pods = {p["metadata"]["name"]: p for p in plan.create if p["kind"] == "Pod"}
    services = {s["metadata"]["name"]: s for s in plan.create if s["kind"] == "Service"}
    assert sorted(pods) == sorted(services) == ["tj-master-0", "tj-worker-0"]
    master, worker = pods["tj-master-0"], pods["tj-worker-0"]
    assert master["metadata"]["labels"] == {
        "app": "tj",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/job-name": "tj",
        "training.kubeflow.org/replica-type": "master",
        "training.kubeflow.org/replica-index": "0",
        "training.kubeflow.org/job-role": "master",
    }
    assert "training.kubeflow.org/job-role" not in worker["metadata"]["labels"]
    (ref,) = master["metadata"]["ownerReferences"]
    assert ref == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "tj",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    # The template's env first, then the operator's, in its order.
    assert [e["name"] for e in master["spec"]["containers"][0]["env"]] == [
        "OWN", "PYTHONUNBUFFERED", "MASTER_PORT", "PET_MASTER_PORT", "MASTER_ADDR",
        "PET_MASTER_ADDR", "WORLD_SIZE", "RANK", "PET_NODE_RANK", "PET_NPROC_PER_NODE",
        "PET_NNODES",
    ]  # fmt: skip
    assert env_of(worker) == {
        "OWN": "1",
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": "29500",
        "PET_MASTER_PORT": "29500",
        "MASTER_ADDR": "tj-master-0",
        "PET_MASTER_ADDR": "tj-master-0",
        "WORLD_SIZE": "4",
        "RANK": "1",  # a worker's index + 1
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_NNODES": "2",
    }
    assert env_of(master)["RANK"] == "0"
    assert "initContainers" not in master["spec"]
    (init,) = worker["spec"]["initContainers"]
    assert init["name"] == "init-pytorch" and init["image"] == INIT
    assert "getent hosts tj-master-0" in init["command"][-1]
    assert init["resources"]["limits"] == {"cpu": "100m", "memory": "20Mi"}
    assert worker["spec"]["restartPolicy"] == "OnFailure"
    svc = services["tj-worker-0"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [{"name": "pytorchjob-port", "port": 29500}]
    assert svc["spec"]["selector"] == {
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/job-name": "tj",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0",
    }


def test_auto_procs_count_one_process_per_replica_in_world_size() -> None:
    plan = op.plan_reconcile(job(workers=2), [], [], NOW, INIT)
    env = env_of(next(p for p in plan.create if p["metadata"]["name"] == "tj-worker-1"))
    assert (env["WORLD_SIZE"], env["PET_NPROC_PER_NODE"], env["RANK"]) == ("3", "auto", "2")


def test_elastic_jobs_get_the_rendezvous_env_and_no_master_env() -> None:
    raw = job(
        master=False,
        workers=2,
        nprocPerNode="4",
        elasticPolicy={
            "minReplicas": 1,
            "maxReplicas": 3,
            "maxRestarts": 5,
            "rdzvId": "run-1",
            "rdzvConf": [{"key": "join_timeout", "value": "600"}],
        },
    )
    plan = op.plan_reconcile(raw, [], [], NOW, INIT)
    worker0 = next(p for p in plan.create if p["metadata"]["name"] == "tj-worker-0")
    assert env_of(worker0) == {
        "OWN": "1",
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": "4",
        "PET_RDZV_ENDPOINT": "tj-worker-0:29500",
        "PET_RDZV_BACKEND": "c10d",
        "PET_NNODES": "1:3",
        "PET_MAX_RESTARTS": "5",
        "PET_RDZV_ID": "run-1",
        "PET_RDZV_CONF": "join_timeout=600",
    }
    # Without a Master: worker 0 has the master role, and no init container waits.
    assert worker0["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"
    assert "initContainers" not in worker0["spec"]


def status_after(raw: dict[str, Any], pods: list[dict[str, Any]], **kw: Any) -> Any:
    """Two reconciles: the first (no pods yet) makes the status the second starts from."""
    raw = copy.deepcopy(raw)
    raw["status"] = op.plan_reconcile(raw, [], [], NOW, INIT).status
    return op.plan_reconcile(raw, pods, [], NOW + timedelta(seconds=5), INIT, **kw)


def test_conditions_run_created_running_succeeded_with_running_turned_false() -> None:
    running = status_after(
        job(), [pod("tj", "master", 0, "Running"), pod("tj", "worker", 0, "Running")]
    )
    assert conditions(running.status) == [("Created", "True"), ("Running", "True")]
    raw = job()
    raw["status"] = running.status
    done = op.plan_reconcile(
        raw, [pod("tj", "master", 0, "Succeeded", 0), pod("tj", "worker", 0, "Running")], [],
        NOW + timedelta(seconds=9), INIT,
    )  # fmt: skip
    assert conditions(done.status) == [
        ("Created", "True"),
        ("Running", "False"),
        ("Succeeded", "True"),
    ]
    assert done.status["completionTime"] == "2026-01-02T03:04:14Z"
    assert done.status["replicaStatuses"]["Master"]["succeeded"] == 1


@pytest.mark.parametrize(
    ("clean", "deleted"),
    [
        ("None", set()),
        ("Running", {("Pod", "tj-worker-0"), ("Service", "tj-worker-0")}),
        ("All", {(k, n) for k in ("Pod", "Service") for n in ("tj-master-0", "tj-worker-0")}),
    ],
)
def test_clean_pod_policy_once_finished(clean: str, deleted: set[tuple[str, str]]) -> None:
    raw = job(runPolicy={"cleanPodPolicy": clean})
    raw["status"] = {"conditions": [{"type": "Succeeded", "status": "True", "reason": "x"}]}
    pods = [pod("tj", "master", 0, "Succeeded", 0), pod("tj", "worker", 0, "Running")]
    plan = op.plan_reconcile(raw, pods, [], NOW, INIT)
    assert set(plan.delete) == deleted
    assert not plan.create


@pytest.mark.parametrize(
    ("policy", "code", "restarts", "fails"),
    [
        ("ExitCode", 137, True, False),  # >= 128: retryable, the pod is made again
        ("ExitCode", 1, False, True),  # 1-127: a permanent error fails the job
        ("OnFailure", 1, True, False),
        ("Always", 2, True, False),
        ("Never", 137, False, True),
    ],
)
def test_a_failed_pod_restarts_or_fails_the_job(
    policy: str, code: int, restarts: bool, fails: bool
) -> None:
    pods = [pod("tj", "master", 0, "Running"), pod("tj", "worker", 0, "Failed", code)]
    plan = status_after(job(policy=policy), pods)
    assert (("Pod", "tj-worker-0") in plan.delete) == restarts
    types = dict(conditions(plan.status))
    assert (types.get("Restarting") == "True") == restarts
    assert (types.get("Failed") == "True") == fails
    if restarts:  # Restarting replaces Running
        assert "Running" not in types
    if policy == "ExitCode" and fails:
        # Once Failed, nothing changes any more.
        raw = job(policy=policy)
        raw["status"] = plan.status
        again = op.plan_reconcile(raw, [pod("tj", "master", 0, "Running")], [], NOW, INIT)
        assert conditions(again.status) == conditions(plan.status)
        assert again.create == [] and again.delete == []


def test_backoff_limit_counts_container_restarts() -> None:
    running = pod("tj", "worker", 0, "Running")
    running["status"]["containerStatuses"] = [{"name": "pytorch", "restartCount": 2}]
    plan = status_after(
        job(runPolicy={"backoffLimit": 2, "cleanPodPolicy": "All"}),
        [pod("tj", "master", 0, "Running"), running],
    )
    assert dict(conditions(plan.status))["Failed"] == "True"
    assert ("Pod", "tj-worker-0") in plan.delete  # cleanPodPolicy applies to the failure


def test_a_suspended_job_loses_its_pods_and_resumes() -> None:
    raw = job(runPolicy={"suspend": True})
    raw["status"] = status_after(job(), [pod("tj", "master", 0, "Running")]).status
    plan = op.plan_reconcile(raw, [pod("tj", "master", 0, "Running")], [], NOW, INIT)
    assert ("Pod", "tj-master-0") in plan.delete
    assert dict(conditions(plan.status)) == {
        "Created": "True",
        "Running": "False",
        "Suspended": "True",
    }
    raw["spec"]["runPolicy"]["suspend"] = False
    raw["status"] = plan.status
    resumed = op.plan_reconcile(raw, [], [], NOW, INIT)
    assert dict(conditions(resumed.status))["Suspended"] == "False"
    assert {p["metadata"]["name"] for p in resumed.create if p["kind"] == "Pod"} == {
        "tj-master-0",
        "tj-worker-0",
    }


def test_ttl_deletes_the_finished_job_when_due() -> None:
    raw = job(runPolicy={"ttlSecondsAfterFinished": 60})
    raw["status"] = {
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "x"}],
        "completionTime": "2026-01-02T03:04:05Z",
    }
    soon = op.plan_reconcile(raw, [], [], NOW + timedelta(seconds=20), INIT)
    assert not soon.delete_job and soon.requeue_after == 40
    assert op.plan_reconcile(raw, [], [], NOW + timedelta(seconds=60), INIT).delete_job


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda j: j["metadata"].update(name="a.b"), "metadata.name"),
        (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2), "must be 1"),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].pop("replicas"),
            "must be 1",
        ),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][
                0
            ].update(name="main"),
            "container with name pytorch",
        ),
        (lambda j: j["spec"].update(elasticPolicy={}, pytorchReplicaSpecs={}), "Worker"),
        (lambda j: j["spec"].update(runPolicy={"managedBy": "me"}), "managedBy"),
    ],
)
def test_the_webhook_refuses_what_the_real_one_refuses(edit: Any, message: str) -> None:
    raw = job()
    assert op.validate(raw) == ([], [])
    edit(raw)
    review = {"request": {"uid": "u1", "object": raw}}
    response = op.admission_response(review)["response"]
    assert response["uid"] == "u1" and response["allowed"] is False
    assert message in response["status"]["message"]


def test_pods_of_a_same_named_older_job_are_not_its_own() -> None:
    class Fake(op.Operator):
        def __init__(self) -> None:  # no API: only _owned is under test
            pass

    old = pod("tj", "master", 0, "Running", uid="uid-0")
    orphan = pod("tj", "worker", 0, "Running")
    orphan["metadata"]["ownerReferences"] = []
    assert Fake()._owned([old, orphan], "uid-1") == [orphan]
