"""`up --replace` of a job stuck Terminating (issue 24 §3), on the real kube-apiserver: a
finalizer holds the old job, so the wait is bounded (--timeout, default 2m), says what it
waits for, changes nothing before the old job is gone, and stops at Ctrl-C in one line."""

from __future__ import annotations

import signal
import time

import pytest
from actors import MERGE, Lines, get_job, res, start_cli

IMAGE = "registry.invalid/train:v1"
HOLD = "example.com/hold"

pytestmark = pytest.mark.slow  # an apiserver, CLI subprocesses


def up_args(ns: str, *more: str) -> list[str]:
    return ["up", "--image", IMAGE, "--name", "j", "-n", ns, "--no-wait", *more]


def stuck_terminating(kube_cli, admin, namespace: str) -> dict:
    """`up` the job, then a finalizer of someone else's on it, and `kubectl delete` it."""
    assert kube_cli(*up_args(namespace)).returncode == 0
    jobs = res(admin, "kubeflow.org/v1", "PyTorchJob")
    jobs.patch(name="j", namespace=namespace, body={"metadata": {"finalizers": [HOLD]}},
               content_type=MERGE)  # fmt: skip
    jobs.delete(name="j", namespace=namespace)
    job = get_job(admin, namespace, "j")
    assert job is not None and job["metadata"].get("deletionTimestamp")
    return job


def release(admin, namespace: str) -> None:
    jobs = res(admin, "kubeflow.org/v1", "PyTorchJob")
    jobs.patch(name="j", namespace=namespace, body={"metadata": {"finalizers": None}},
               content_type=MERGE)  # fmt: skip


def test_a_stuck_old_job_is_waited_for_bounded_and_said(kube_cli, admin, namespace):
    old = stuck_terminating(kube_cli, admin, namespace)
    policy = res(admin, "networking.k8s.io/v1", "NetworkPolicy")
    before = policy.get(name="j", namespace=namespace).to_dict()["metadata"]["resourceVersion"]
    started = time.monotonic()
    out = kube_cli(*up_args(namespace, "--replace", "--timeout", "3s"))
    assert time.monotonic() - started < 60
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith(
        f"waiting for PyTorchJob {namespace}/j to be deleted (Terminating since "
    ), lines
    assert f"finalizers: {HOLD}), at most 3s (--timeout)" in lines[0]
    assert lines[-1].startswith(f"error: PyTorchJob {namespace}/j is still being deleted after 3s")
    assert "nothing was changed" in lines[-1] and len(lines) == 2, lines
    # Nothing changed meanwhile: not the policy beside it, not the old job.
    assert (
        policy.get(name="j", namespace=namespace).to_dict()["metadata"]["resourceVersion"] == before
    )
    assert get_job(admin, namespace, "j")["metadata"]["uid"] == old["metadata"]["uid"]
    release(admin, namespace)


def test_once_the_old_job_goes_the_new_one_is_created(control_plane, admin, namespace, kube_cli):
    old = stuck_terminating(kube_cli, admin, namespace)
    proc = start_cli(control_plane.kubeconfig, *up_args(namespace, "--replace"))
    lines = Lines(proc)
    lines.wait_for("waiting for PyTorchJob")
    release(admin, namespace)
    code, seen = lines.finish(timeout=60)
    assert code == 0, seen
    assert f"created PyTorchJob {namespace}/j" in seen
    new = get_job(admin, namespace, "j")
    assert new is not None and new["metadata"]["uid"] != old["metadata"]["uid"]


def test_ctrl_c_while_waiting_is_one_line_and_changes_nothing(
    control_plane, admin, namespace, kube_cli
):
    old = stuck_terminating(kube_cli, admin, namespace)
    proc = start_cli(control_plane.kubeconfig, *up_args(namespace, "--replace"))
    lines = Lines(proc)
    lines.wait_for("waiting for PyTorchJob")
    proc.send_signal(signal.SIGINT)
    code, seen = lines.finish(timeout=30)
    assert code == 130, seen
    assert seen[-1] == (
        f"error: interrupted (SIGINT): stopped waiting for PyTorchJob {namespace}/j to go; "
        "nothing was changed"
    ), seen
    assert not any("Traceback" in line for line in seen)
    assert get_job(admin, namespace, "j")["metadata"]["uid"] == old["metadata"]["uid"]
    release(admin, namespace)
