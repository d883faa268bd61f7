"""What the cluster commands show, against a real kube-apiserver: text from the cluster
(waiting reasons, messages) with markup and escapes is shown as text; `logs --index N`
reads node N's pod; `> /dev/full` is one line, exit 1."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from actors import (
    container_status,
    create_pods,
    finish,
    get_job,
    res,
    set_job_conditions,
    set_pod_status,
    start_cli,
    wait_for_job,
)
from cli_runner import run_cli_into

IMAGE = "registry.invalid/train:v1"
ESC = "\x1b"
REASON = f"[/bold]Waiting{ESC}]0;pwned\x07{ESC}[2J"
MESSAGE = f"containers with unready status: [pytorch]{ESC}[31m red"


@pytest.fixture
def up(kube_cli, namespace):
    def run(name: str, *more: str) -> None:
        args = ["up", "--image", IMAGE, "--name", name, "-n", namespace, "--nodes", "2"]
        out = kube_cli(*args, "--no-wait", *more)
        assert out.returncode == 0, out.stderr

    return run


def hostile(admin, namespace: str, pod: str, phase: str = "Pending") -> None:
    waiting = {"waiting": {"reason": REASON, "message": MESSAGE}}
    status = {"phase": phase, "containerStatuses": [container_status(IMAGE, waiting)]}
    set_pod_status(admin, namespace, pod, status)


def test_status_shows_markup_and_escapes_as_text(kube_cli, admin, namespace, up):
    up("j")
    pods = create_pods(admin, get_job(admin, namespace, "j"))
    hostile(admin, namespace, pods[0])
    out = kube_cli("status", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr  # a MarkupError here was the bug
    assert "[/bold]Waiting" in out.stdout and "[pytorch]" in out.stdout
    assert ESC not in out.stdout and "pwned" not in out.stdout and "\x07" not in out.stdout
    doc = json.loads(kube_cli("status", "j", "-n", namespace, "-o", "json").stdout)
    assert doc["pods"][0]["detail"] == f"{REASON}: {MESSAGE}"  # the document keeps the text


def test_up_wait_shows_markup_and_escapes_as_text(admin, control_plane, namespace):
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
    proc = start_cli(control_plane.kubeconfig, *args, "--wait", "--timeout", "60s")
    pods = create_pods(admin, wait_for_job(admin, namespace, "j", proc))
    for pod in pods:
        hostile(admin, namespace, pod, phase="Running")
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Running", "[bold]up[/]"))
    time.sleep(2.5)  # long enough for `up` to show it
    done = ("Succeeded", f"done {ESC}]0;title\x07[/bold]")
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Running", ""), done)
    code, _, err = finish(proc)
    assert code == 0, err
    assert "[/bold]Waiting" in err and "[pytorch]" in err
    assert ESC not in err and "pwned" not in err
    assert (
        err.strip().splitlines()[-1]
        == "PyTorchJob j succeeded: done \N{REPLACEMENT CHARACTER}[/bold]"
    )


def test_logs_index_reads_that_nodes_pod(kube_cli, admin, namespace, up):
    # A TrainJob (this apiserver predates Indexed Jobs): its JobSet's Jobs name the pods
    # with a random suffix; no hostname is set here, so the completion index decides. The
    # pods carry our labels, from the TrainJob's runtime patch.
    up("j", "--target", "trainjob", "--nodes", "4")  # node 3's pod never comes
    for index in range(3):
        labels = {
            "app.kubernetes.io/managed-by": "ddpdeploy",
            "app.kubernetes.io/instance": "j",
            "jobset.sigs.k8s.io/jobset-name": "j",
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        child = {"apiVersion": "batch/v1", "kind": "Job", "name": "j-node-0", "uid": "u-job"}
        owners = [{**child, "controller": True}]  # a JobSet's Job is their controller
        body = {
            "metadata": {
                "name": f"j-{index}-x{index}z",
                "labels": labels,
                "ownerReferences": owners,
            },
            "spec": {"containers": [{"name": "pytorch", "image": IMAGE}]},
        }
        res(admin, "v1", "Pod").create(namespace=namespace, body=body)
    # No kubelet here: reading fails, naming the pod it tried.
    out = kube_cli("logs", "j", "--index", "2", "-n", namespace)
    assert out.returncode == 1
    assert "pod j-2-x2z" in out.stderr and "j-0-x0z" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    missing = kube_cli("logs", "j", "--index", "3", "-n", namespace)
    assert missing.returncode == 1 and "has no pod for node 3" in missing.stderr
    beyond = kube_cli("logs", "j", "--index", "7", "-n", namespace)  # past its nodes: input
    assert beyond.returncode == 2 and "has no node 7; its nodes are 0-3" in beyond.stderr
    replica = kube_cli("logs", "j", "--replica", "worker", "-n", namespace)
    assert replica.returncode == 2
    assert "a TrainJob has no replicas; pass --index N alone" in replica.stderr


@pytest.mark.parametrize(
    "args",
    [("status", "j"), ("status", "j", "-o", "json"), ("list",), ("list", "-o", "json")],
    ids=["status", "status-json", "list", "list-json"],
)
def test_a_full_stdout_is_one_line(control_plane, namespace, up, args):
    up("j")
    out = run_cli_into(
        "/dev/full", *args, "-n", namespace, "--kubeconfig", str(control_plane.kubeconfig),
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stderr == "error: cannot write to standard output: No space left on device\n", (
        out.stderr
    )
