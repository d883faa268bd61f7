"""status, list, down, scale and resume against a real kube-apiserver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from actors import create_pods, get_job, res, set_job_conditions, set_pod_status

IMAGE = "registry.invalid/train:v1"


@pytest.fixture
def up(kube_cli, namespace, tmp_path: Path):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")

    def run(name: str, *more: str) -> None:
        args = ["up", "--image", IMAGE, "--name", name, "-n", namespace, "-f", str(spec)]
        out = kube_cli(*args, "--no-wait", *more)
        assert out.returncode == 0, out.stderr

    return run


def pvcs(admin, ns: str) -> list[str]:
    """PVCs not being deleted (pvc-protection's finalizer keeps a deleted claim listed until
    a controller, absent here, sees that no pod uses it)."""
    items = res(admin, "v1", "PersistentVolumeClaim").get(namespace=ns).to_dict()["items"]
    return [p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")]


def test_status_shows_state_and_pods(kube_cli, admin, namespace, up):
    up("j", "--nodes", "2")
    pods = create_pods(admin, get_job(admin, namespace, "j"))
    set_pod_status(admin, namespace, pods[0], {"phase": "Running"})
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Running", "running"))
    out = kube_cli("status", "j", "-n", namespace, "-o", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["state"] == "Running"
    assert [(p["name"], p["phase"]) for p in doc["pods"]] == [
        ("j-worker-0", "Running"),
        ("j-worker-1", "Pending"),
    ]
    assert yaml.safe_load(kube_cli("status", "j", "-n", namespace, "-o", "yaml").stdout) == doc
    table = kube_cli("status", "j", "-n", namespace)
    assert "PyTorchJob j: Running" in table.stdout and "j-worker-0" in table.stdout
    missing = kube_cli("status", "nope", "-n", namespace)
    assert missing.returncode == 1 and "no job nope" in missing.stderr


def test_list_shows_only_ours(kube_cli, admin, namespace, up):
    up("ours", "--nodes", "3", "--gpus", "0")
    foreign = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "theirs"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
            "containers": [{"name": "pytorch", "image": IMAGE}]}}}}},
    }  # fmt: skip
    res(admin, "kubeflow.org/v1", "PyTorchJob").create(namespace=namespace, body=foreign)
    out = kube_cli("list", "-n", namespace, "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["name"], r["nodes"], r["gpus"], r["state"]) for r in rows] == [
        ("ours", 3, 0, "Pending")
    ]
    table = kube_cli("list", "-n", namespace).stdout
    assert "ours" in table and "3×0" in table and "theirs" not in table


def test_list_gives_a_job_the_state_status_gives_it(kube_cli, admin, namespace, up):
    # Found by the fifth hostile pass: `list` read the job's conditions alone and said
    # Pending where `status` said Unschedulable; one rule (the pods' too) for both.
    up("stuck", "--gpus", "0")
    up("fine", "--gpus", "0")
    (pod,) = create_pods(admin, get_job(admin, namespace, "stuck"))
    sched = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient cpu.",
    }
    set_pod_status(admin, namespace, pod, {"phase": "Pending", "conditions": [sched]})
    out = kube_cli("list", "-n", namespace, "-o", "json")
    assert out.returncode == 0, out.stderr
    states = {r["name"]: r["state"] for r in json.loads(out.stdout)}
    assert states == {"stuck": "Unschedulable", "fine": "Pending"}
    status = kube_cli("status", "stuck", "-n", namespace, "-o", "json")
    assert json.loads(status.stdout)["state"] == "Unschedulable"


def test_list_shows_the_kinds_it_may_list_and_names_the_refused(kube_cli, admin, namespace, up):
    # Found by the fifth hostile pass: a user who may list PyTorchJobs but not batch Jobs
    # (the indexed-job target's) got the Jobs' forbidden line alone, exit 1: no job listed.
    up("ours", "--gpus", "0")
    rules = [{"apiGroups": ["kubeflow.org"], "resources": ["*"], "verbs": ["get", "list"]}]
    res(admin, "rbac.authorization.k8s.io/v1", "Role").create(
        namespace=namespace, body={"metadata": {"name": "jobs-only"}, "rules": rules}
    )
    user = {"kind": "User", "name": "limited", "apiGroup": "rbac.authorization.k8s.io"}
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "jobs-only"}
    res(admin, "rbac.authorization.k8s.io/v1", "RoleBinding").create(
        namespace=namespace,
        body={"metadata": {"name": "limited-jobs"}, "roleRef": role, "subjects": [user]},
    )
    out = kube_cli("list", "-n", namespace, "--context", "limited", "-o", "json")
    assert out.returncode == 1, out.stderr
    assert [r["name"] for r in json.loads(out.stdout)] == ["ours"]
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: could not list ") and "Jobs: listing Job: forbidden: " in line
    assert 'User "limited" cannot list resource "jobs"' in line
    every = kube_cli("list", "-A", "--context", "limited")  # no kind may be listed anywhere
    assert every.returncode == 1 and every.stdout == "", every.stdout
    assert every.stderr.startswith("error: could not list PyTorchJobs: listing PyTorchJob: ")


def test_down_keeps_the_pvc_unless_purge(kube_cli, admin, namespace, up):
    up("j")
    out = kube_cli("down", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert get_job(admin, namespace, "j") is None
    assert pvcs(admin, namespace) == ["j-checkpoints"]
    assert "kept PersistentVolumeClaim" in out.stderr
    again = kube_cli("down", "j", "-n", namespace)
    assert again.returncode == 1 and "nothing deleted" in again.stderr
    purge = kube_cli("down", "j", "-n", namespace, "--purge")
    assert purge.returncode == 0, purge.stderr
    assert pvcs(admin, namespace) == []


def test_scale_respects_min_max(kube_cli, admin, namespace, up):
    up("e", "--nodes", "2", "--elastic", "1:3")
    out = kube_cli("scale", "e", "--nodes", "3", "-n", namespace)
    assert out.returncode == 0, out.stderr
    job = get_job(admin, namespace, "e")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    refused = kube_cli("scale", "e", "--nodes", "4", "-n", namespace)
    assert refused.returncode == 2
    assert refused.stderr.strip() == "error: --nodes: 4 is outside the job's elastic range 1:3"
    assert get_job(admin, namespace, "e")["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    up("s", "--nodes", "2")
    static = kube_cli("scale", "s", "--nodes", "2", "-n", namespace)
    assert static.returncode == 2 and "not elastic" in static.stderr


def test_resume_recreates_a_failed_and_a_deleted_job(kube_cli, admin, namespace, up):
    up("e", "--nodes", "2", "--elastic", "1:3")
    assert kube_cli("scale", "e", "--nodes", "3", "-n", namespace).returncode == 0
    running = kube_cli("resume", "e", "-n", namespace)
    assert running.returncode == 1 and "nothing to resume" in running.stderr
    set_job_conditions(admin, namespace, "e", ("Created", ""), ("Failed", "boom"))
    first = get_job(admin, namespace, "e")
    out = kube_cli("resume", "e", "-n", namespace)
    assert out.returncode == 0, out.stderr
    again = get_job(admin, namespace, "e")
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert not (again.get("status") or {}).get("conditions")
    # The saved spec carries the scaled size; the PVC is the same one.
    assert again["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert kube_cli("down", "e", "-n", namespace).returncode == 0
    out = kube_cli("resume", "e", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert get_job(admin, namespace, "e")["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert pvcs(admin, namespace) == ["e-checkpoints"]
    none = kube_cli("resume", "never", "-n", namespace)
    assert none.returncode == 1 and "no saved spec for never" in none.stderr


def test_collect_from_cluster_cleans_up_its_helper_pod(kube_cli, admin, namespace, up, tmp_path):
    # No kubelet here: the helper pod never runs, so collect must give up, say why, and
    # leave no pod behind. (Reading through exec needs a kubelet; see tests/test_collect.py
    # for the checksum and atomic-write logic on a real run's checkpoints.)
    up("j")
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Succeeded", "done"))
    dest = tmp_path / "out"
    args = ["collect", "j", "--from", "cluster", "--to", str(dest), "-n", namespace]
    out = kube_cli(*args, "--timeout", "2")
    assert out.returncode == 1
    assert "helper pod j-collect-" in out.stderr and "has been deleted" in out.stderr
    pods = res(admin, "v1", "Pod").get(namespace=namespace).to_dict()["items"]
    assert pods == []
    assert not dest.exists()


# Left by the fifth hostile pass: the helper's fixed 64Mi request and 256Mi limit were refused
# by the API server under a LimitRange with a higher min (or a lower max), and collect could
# not read the volume at all.
@pytest.mark.parametrize(
    "item",
    [
        {"type": "Container", "min": {"memory": "512Mi", "cpu": "250m"}},
        {"type": "Container", "max": {"memory": "128Mi"}, "maxLimitRequestRatio": {"cpu": "1"}},
    ],
    ids=["min", "max-ratio"],
)
def test_collects_helper_pod_fits_the_namespaces_limit_range(
    kube_cli, admin, namespace, up, tmp_path, item
):
    up("j")
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Succeeded", "done"))
    body = {"metadata": {"name": "lr"}, "spec": {"limits": [item]}}
    res(admin, "v1", "LimitRange").create(namespace=namespace, body=body)
    args = ["collect", "j", "--from", "cluster", "--to", str(tmp_path / "out"), "-n", namespace]
    out = kube_cli(*args, "--timeout", "2")
    # Taken by the API server (no kubelet here runs it): it gives up after --timeout.
    assert out.returncode == 1
    assert "helper pod j-collect-" in out.stderr and "is Pending after 2s" in out.stderr, out.stderr
    # Two bounds no pod can keep together: named before anything is made.
    res(admin, "v1", "LimitRange").delete(name="lr", namespace=namespace)
    res(admin, "v1", "LimitRange").create(namespace=namespace, body={
        "metadata": {"name": "pod-min"},
        "spec": {"limits": [{"type": "Pod", "min": {"memory": "1Gi"}},
                            {"type": "Container", "max": {"memory": "512Mi"}}]},
    })  # fmt: skip
    out = kube_cli(*args, "--timeout", "2")
    assert out.returncode == 1
    assert out.stderr.startswith(f"error: LimitRange {namespace}/pod-min bounds memory per pod "), (
        out.stderr
    )
    assert res(admin, "v1", "Pod").get(namespace=namespace).to_dict()["items"] == []


def test_resume_onto_a_new_pvc_says_it_starts_from_step_0(kube_cli, admin, namespace, up):
    up("j")
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Failed", "boom"))
    claims = res(admin, "v1", "PersistentVolumeClaim")
    claims.delete(name="j-checkpoints", namespace=namespace)
    # No controller here removes pvc-protection's finalizer: do it, so the claim is gone.
    claims.patch(
        name="j-checkpoints",
        namespace=namespace,
        body={"metadata": {"finalizers": None}},
        content_type="application/merge-patch+json",
    )
    assert pvcs(admin, namespace) == []
    out = kube_cli("resume", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert (
        f"PersistentVolumeClaim {namespace}/j-checkpoints was missing and is new: no "
        "checkpoint exists, the job starts from step 0"
    ) in out.stderr
    assert pvcs(admin, namespace) == ["j-checkpoints"]
