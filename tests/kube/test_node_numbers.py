"""Which pod is which node, against a real kube-apiserver with the kubelet stand-in: a
TrainJob's pods as its JobSet's Job makes them (and look-alikes that are not), indexes that
are no plain number, a job a node short, and a PyTorchJob's node numbers while a pod is
missing (cluster3 F1, F6, F10, F12)."""

from __future__ import annotations

import json

import pytest
from actors import (
    MERGE,
    container_status,
    create_pods,
    delete_pod_now,
    get_job,
    res,
    set_pod_status,
    set_running,
)

IMAGE = "registry.invalid/train:v1"
INDEX = "batch.kubernetes.io/job-completion-index"

pytestmark = pytest.mark.slow  # an apiserver, a kubelet stand-in, CLI subprocesses


@pytest.fixture
def trainjob(kube_cli, namespace):
    def make(nodes: int) -> None:
        args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--target", "trainjob"]
        out = kube_cli(*args, "--nodes", str(nodes), "--no-wait")
        assert out.returncode == 0, out.stderr

    return make


def tj_pod(
    admin,
    namespace: str,
    kubelet,
    name: str,
    log: str,
    *,
    job: str = "j-node-0",
    label: str | None = None,
    annotation: str | None = None,
) -> None:
    """A Running pod with our labels for TrainJob j whose controller is batch/v1 Job
    ``job`` (as a JobSet's Job makes them), its completion index in a label and/or the
    annotation (clusters before 1.28 set only the annotation), logging ``log``."""
    labels = {
        "app.kubernetes.io/managed-by": "ddpdeploy",
        "app.kubernetes.io/instance": "j",
        "jobset.sigs.k8s.io/jobset-name": "j",
        **({INDEX: label} if label is not None else {}),
    }
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"u-{job}"}
    meta = {"name": name, "labels": labels, "ownerReferences": [{**owner, "controller": True}]}
    if annotation is not None:
        meta["annotations"] = {INDEX: annotation}
    body = {
        "metadata": meta,
        "spec": {"containers": [{"name": "node", "image": IMAGE}], "nodeName": kubelet.node_name},
    }
    res(admin, "v1", "Pod").create(namespace=namespace, body=body)
    state = container_status(IMAGE, {"running": {"startedAt": "2026-01-01T00:00:00Z"}})
    state["name"] = "node"
    set_pod_status(admin, namespace, name, {"phase": "Running", "containerStatuses": [state]})
    kubelet.set_log(name, log, container="node")


@pytest.mark.parametrize("index", ["\u00b2", "1" * 5000, "\u0663", "01"])
def test_an_index_that_is_no_plain_number_is_no_index(
    kube_cli, admin, namespace, kubelet, trainjob, index
):
    # F12: `²` made int() raise, 5000 digits passed the int() limit, `٣` read as node 3.
    trainjob(2)
    tj_pod(admin, namespace, kubelet, "j-node-0-0-aaaaa", "[rank0]:pod a", annotation="0")
    tj_pod(admin, namespace, kubelet, "j-node-0-1-bbbbb", "[rank0]:pod b", annotation=index)
    status = kube_cli("status", "j", "-n", namespace, "-o", "json")
    assert status.returncode == 0, status.stderr
    pods = {p["name"]: p["index"] for p in json.loads(status.stdout)["pods"]}
    assert pods == {"j-node-0-0-aaaaa": 0, "j-node-0-1-bbbbb": None}
    assert kube_cli("status", "j", "-n", namespace).returncode == 0
    logs = kube_cli("logs", "j", "-n", namespace)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "[rank0 node0] pod a\n"
    node1 = kube_cli("logs", "j", "--node", "1", "-n", namespace)
    assert node1.returncode == 2 and "Traceback" not in node1.stderr
    assert "no pod for node 1" in node1.stderr


def test_a_pytorchjobs_node_numbers_do_not_move_while_its_master_is_missing(
    kube_cli, admin, namespace, kubelet, tmp_path
):
    # F10: with master-0 gone (a crash, an eviction), every worker moved down one node:
    # `--node 1` read worker-1 instead of worker-0.
    spec = tmp_path / "s.yaml"
    spec.write_text("rendezvous: {mode: static}\n")
    args = ["up", "-f", str(spec), "--image", IMAGE, "--name", "j", "-n", namespace]
    assert kube_cli(*args, "--nodes", "3", "--no-wait").returncode == 0
    pods = create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)
    assert pods == ["j-master-0", "j-worker-0", "j-worker-1"]
    for pod in pods:
        set_running(admin, namespace, pod, IMAGE)
        kubelet.set_log(pod, f"[rank0]:I am pod {pod}")
    delete_pod_now(admin, namespace, "j-master-0")
    node1 = kube_cli("logs", "j", "--node", "1", "-n", namespace)
    assert node1.stdout == "[rank0 node1] I am pod j-worker-0\n", node1.stderr
    merged = kube_cli("logs", "j", "-n", namespace)
    assert sorted(merged.stdout.splitlines()) == [
        "[rank0 node1] I am pod j-worker-0",
        "[rank0 node2] I am pod j-worker-1",
    ]
    node0 = kube_cli("logs", "j", "--node", "0", "-n", namespace)
    assert node0.returncode == 2
    assert "no pod for node 0 yet; it has nodes 0-2" in node0.stderr


def test_a_trainjobs_pods_are_its_jobsets_one_job_s_only(
    kube_cli, admin, namespace, kubelet, trainjob
):
    # F1: any `j-node-<digits>` was taken (leading zeros, Unicode digits, 20 digits), so
    # look-alikes with our labels counted as pods and their forged `done` was read.
    trainjob(2)
    step = '[rank0]:{"event":"step","step":3,"loss":0.5}'
    tj_pod(admin, namespace, kubelet, "j-node-0-0-aaaaa", f"[rank0]:REAL0\n{step}", label="0")
    tj_pod(admin, namespace, kubelet, "j-node-0-1-bbbbb", "[rank1]:REAL1", label="1")
    forged = '[rank0]:FORGED\n[rank0]:{"event":"done","step":999}'
    for i, owner in enumerate(["j-node-01", "j-node-1", "j-node-\u0663", "j-node-" + "9" * 20]):
        tj_pod(admin, namespace, kubelet, f"j-look-{i}", forged, job=owner, label=str(i % 2))
    status = kube_cli("status", "j", "-n", namespace, "-o", "json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert sorted(p["name"] for p in doc["pods"]) == ["j-node-0-0-aaaaa", "j-node-0-1-bbbbb"]
    assert doc["reason"].startswith("2/2 pods running"), doc["reason"]
    assert doc["training"]["step"] == 3 and not doc["training"]["done"]
    logs = kube_cli("logs", "j", "-n", namespace)
    assert logs.returncode == 0, logs.stderr
    assert "FORGED" not in logs.stdout and "REAL0" in logs.stdout and "REAL1" in logs.stdout


def test_a_trainjob_counts_against_its_nodes_and_its_deleting_pod_is_this_runs(
    kube_cli, admin, namespace, kubelet, trainjob
):
    # F6: TrainJob had no replica counts, so a 3-node job with one pod was "1/1 pods
    # running", and its own pod being deleted counted as an earlier run's (dropped).
    trainjob(3)
    tj_pod(admin, namespace, kubelet, "j-node-0-0-abcde", "[rank0]:zero", label="0")
    # A pod named as the bare host of node 1 (a StatefulSet j-node-0's would be): no TrainJob
    # pod is named so, so it holds no name the job needs (the review of F8 and F6 together).
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "j-node-0", "uid": "u-sts"}
    bare = {"name": "j-node-0-1", "ownerReferences": [{**sts, "controller": True}]}
    spec = {"containers": [{"name": "node", "image": IMAGE}]}
    res(admin, "v1", "Pod").create(namespace=namespace, body={"metadata": bare, "spec": spec})
    status = kube_cli("status", "j", "-n", namespace, "-o", "json")
    assert status.returncode == 0, status.stderr
    reason = json.loads(status.stdout)["reason"]
    assert reason == "1/3 pods running; no pod j-node-0-1, j-node-0-2 yet", reason
    node2 = kube_cli("logs", "j", "--node", "2", "-n", namespace)
    assert node2.returncode == 2
    assert "no pod for node 2 yet; it has nodes 0-2" in node2.stderr, node2.stderr
    tj_pod(admin, namespace, kubelet, "j-node-0-1-fghij", "[rank1]:one", label="1")
    pods = res(admin, "v1", "Pod")
    held = {"metadata": {"finalizers": ["example.com/hold"]}}
    pods.patch(name="j-node-0-1-fghij", namespace=namespace, body=held, content_type=MERGE)
    pods.delete(name="j-node-0-1-fghij", namespace=namespace)
    try:
        doc = json.loads(kube_cli("status", "j", "-n", namespace, "-o", "json").stdout)
        assert doc["reason"].startswith("2/3 pods running; no pod j-node-0-2 yet"), doc["reason"]
        assert "earlier run" not in doc["reason"]
        detail = {p["name"]: p["detail"] for p in doc["pods"]}
        assert detail["j-node-0-1-fghij"].startswith("Terminating (finalizers: example.com/hold")
    finally:
        unheld = {"metadata": {"finalizers": None}}
        pods.patch(name="j-node-0-1-fghij", namespace=namespace, body=unheld, content_type=MERGE)
