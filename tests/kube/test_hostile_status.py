"""What `status` says of a job whose rank 0 logged no event yet (issue 24 §3), on the real
kube-apiserver with the kubelet stand-in: what the pod and its log tell (waiting at the
rendezvous since the container started; restarting, with the line the last run ended
with), never a guess about the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from actors import container_status, create_pods, get_job, set_pod_status, set_running

IMAGE = "registry.invalid/train:v1"
FLAG_ERROR = (Path(__file__).resolve().parent / "fixtures" / "flagerror-node0.log").read_text()

pytestmark = pytest.mark.slow  # an apiserver, a kubelet stand-in, CLI subprocesses


@pytest.fixture
def job(kube_cli, admin, namespace, kubelet):
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
    out = kube_cli(*args, "--no-wait")
    assert out.returncode == 0, out.stderr
    return create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)


def training(out) -> list[str]:
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith(("training", "no "))]


def test_waiting_at_the_rendezvous_says_so_since_the_container_started(
    kube_cli, admin, namespace, kubelet, job
):
    for pod in job:
        set_running(admin, namespace, pod, IMAGE)  # started 2026-01-01T00:00:00Z
        kubelet.set_log(pod, "")  # torchrun prints nothing while it waits for its peers
    (line,) = training(kube_cli("status", "j", "-n", namespace))
    assert line.startswith("training: waiting for peers since 2026-01-01T00:00:00Z (")
    assert "(rendezvous): no worker has started" in line
    assert "ddpkit.log" not in line
    doc = json.loads(kube_cli("status", "j", "-n", namespace, "-o", "json").stdout)
    (quiet,) = doc["training"]["lines"]
    assert quiet == doc["training"]["quiet"]
    assert "training: " + quiet.split(" (")[0] == line.split(" (")[0]


def test_a_crash_loop_on_a_flag_error_names_the_error(kube_cli, admin, namespace, kubelet, job):
    for pod in job:
        waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}
        last = {"terminated": {"exitCode": 1, "reason": "Error"}}
        status = {
            "phase": "Running",
            "containerStatuses": [container_status(IMAGE, waiting, restarts=3, last=last)],
        }
        set_pod_status(admin, namespace, pod, status)
        kubelet.set_log(pod, FLAG_ERROR, previous=True)
        kubelet.set_log(pod, FLAG_ERROR)
    (line,) = training(kube_cli("status", "j", "-n", namespace))
    assert line == (
        "training: restarting (restart 3; the last run ended with exit code 1, Error): "
        "ddptrain: error: unrecognized arguments: --bogus-flag 3"
    )
    assert any("previous=true" in r for r in kubelet.requests)


def test_workers_that_print_but_log_no_event_are_a_script_without_ddpkit(
    kube_cli, admin, namespace, kubelet, job
):
    for pod in job:
        set_running(admin, namespace, pod, IMAGE)
    kubelet.set_log(job[0], "[rank0]:epoch 1 loss 0.3")
    (line,) = training(kube_cli("status", "j", "-n", namespace))
    assert line == "no training events in rank 0's log (a script without ddpkit.log)"
