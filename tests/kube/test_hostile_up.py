"""`up --replace` of a job stuck Terminating (issue 24 §3), on the real kube-apiserver: a
finalizer holds the old job, so the wait is bounded (--timeout, default 2m), says what it
waits for, changes nothing before the old job is gone, and stops at Ctrl-C in one line."""

from __future__ import annotations

import signal
import time

import pytest
import yaml
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


# Found by the cluster3 pass (F4): the old job went and someone else's job of that name was
# made at once; the wait polled the name, ran to --timeout and said the new one "is still
# being deleted" (remove the finalizers, wait longer) of an object that was not.
@pytest.mark.parametrize("deleted_first", [True, False], ids=["terminating", "replace-deletes"])
def test_a_new_object_of_the_name_ends_the_wait_at_once(
    control_plane, admin, namespace, kube_cli, deleted_first
):
    jobs = res(admin, "kubeflow.org/v1", "PyTorchJob")
    if deleted_first:
        stuck_terminating(kube_cli, admin, namespace)
        left = "nothing was changed"
    else:  # `up --replace` deletes it itself, and then waits for the finalizer
        assert kube_cli(*up_args(namespace)).returncode == 0
        jobs.patch(name="j", namespace=namespace, body={"metadata": {"finalizers": [HOLD]}},
                   content_type=MERGE)  # fmt: skip
        # (the policy beside it was applied first; taking that back changes nothing)
        left = "the new job was not created; nothing was changed"
    proc = start_cli(control_plane.kubeconfig, *up_args(namespace, "--replace", "--timeout", "60s"))
    lines = Lines(proc)
    lines.wait_for("waiting for PyTorchJob")
    # Held still while the name changes hands, so that no poll sees the name free between.
    proc.send_signal(signal.SIGSTOP)
    try:
        release(admin, namespace)
        while get_job(admin, namespace, "j") is not None:
            time.sleep(0.05)
        theirs = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "j", "namespace": namespace},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": {
                "containers": [{"name": "pytorch", "image": "someone/else"}]}}}}},
        }  # fmt: skip
        uid = jobs.create(namespace=namespace, body=theirs).to_dict()["metadata"]["uid"]
    finally:
        proc.send_signal(signal.SIGCONT)
    started = time.monotonic()
    code, seen = lines.finish(timeout=30)
    assert time.monotonic() - started < 10, seen  # at once, not after --timeout
    assert code == 1, seen
    assert seen[-1] == (
        f"error: PyTorchJob {namespace}/j was deleted, but a new PyTorchJob j was created "
        f"meanwhile (not ours: owner: no ddpdeploy labels); {left}"
    ), seen
    assert sum(line.startswith("error:") for line in seen) == 1, seen
    assert get_job(admin, namespace, "j")["metadata"]["uid"] == uid  # theirs, untouched


# Found by the cluster3 pass (F9): `down` of a job a finalizer holds said "deleted" each
# time it ran, and `status`/`list` kept saying Running.
def test_down_of_a_held_job_says_so_and_status_and_list_say_terminating(admin, namespace, kube_cli):
    import json

    assert kube_cli(*up_args(namespace)).returncode == 0
    jobs = res(admin, "kubeflow.org/v1", "PyTorchJob")
    jobs.patch(name="j", namespace=namespace, body={"metadata": {"finalizers": [HOLD]}},
               content_type=MERGE)  # fmt: skip
    held = (
        f"PyTorchJob {namespace}/j is being deleted but held by finalizer(s) {HOLD}: whoever "
        f"set them must remove them (kubectl patch pytorchjob j -n {namespace} --type merge -p "
        '\'{"metadata":{"finalizers":null}}\')'
    )
    for _ in range(2):  # the second `down` finds it Terminating already
        out = kube_cli("down", "j", "-n", namespace)
        assert out.returncode == 0, out.stderr
        assert held in out.stderr.splitlines(), out.stderr
        assert f"deleted PyTorchJob {namespace}/j" not in out.stderr
    since = get_job(admin, namespace, "j")["metadata"]["deletionTimestamp"]
    out = kube_cli("status", "j", "-n", namespace, "-o", "json")
    doc = json.loads(out.stdout)
    assert doc["state"] == "Terminating", doc
    assert doc["reason"].startswith(f"being deleted since {since}, held by finalizer(s) {HOLD}")
    out = kube_cli("status", "j", "-n", namespace)
    assert "PyTorchJob j: Terminating — being deleted since" in " ".join(out.stdout.split())
    out = kube_cli("list", "-n", namespace, "-o", "json")
    assert [row["state"] for row in json.loads(out.stdout)] == ["Terminating"], out.stdout
    release(admin, namespace)


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


# Found by the fourth hostile pass (left open then): a LimitRange that the job's pods break
# passed `up`'s preflight; the operator's pod creates were then refused and the job waited
# with no pod and no word of why.
@pytest.mark.parametrize(
    ("limits", "says"),
    [
        (
            {"type": "Container", "max": {"cpu": "1"}},
            "allows cpu at most 1 per container; the job's pods' cpu request is 2; lower "
            "--cpu to at most 1",
        ),
        (
            {"type": "Pod", "max": {"memory": "1Gi"}},
            "allows memory at most 1Gi per pod; the job's pods' memory limit is 2Gi; lower "
            "--memory to at most 1Gi",
        ),
        (
            {"type": "Container", "min": {"memory": "4Gi"}},
            "requires memory at least 4Gi per container; the job's pods' memory request is "
            "2Gi; raise --memory to at least 4Gi",
        ),
        (
            {"type": "Container", "default": {"cpu": "500m"}},
            "gives containers without a cpu limit a default limit of 0.5, below the job's "
            "cpu request 2; lower --cpu to at most 0.5",
        ),
        (
            {"type": "Container", "maxLimitRequestRatio": {"cpu": "2"}},
            "requires a cpu limit per container (maxLimitRequestRatio 2); the job's pods set "
            "none: ddpdeploy sets no CPU limit (--cpu is the request); a LimitRange of type "
            "Container with a default cpu limit gives them one (the namespace's admin), or use "
            "another namespace",
        ),
    ],
    ids=["container-max", "pod-max", "min", "default", "ratio"],
)
def test_a_limit_range_the_pods_break_is_refused_before_anything_is_made(
    kube_cli, admin, namespace, limits, says
):
    body = {"metadata": {"name": "lr"}, "spec": {"limits": [limits]}}
    res(admin, "v1", "LimitRange").create(namespace=namespace, body=body)
    sizes = ("--cpu", "2", "--memory", "2Gi")
    out = kube_cli(*up_args(namespace, *sizes))
    assert out.returncode == 1, out.stderr
    assert out.stderr == (
        f"error: LimitRange {namespace}/lr {says}: the operator could not create the job's pods\n"
    )
    assert get_job(admin, namespace, "j") is None
    # The API server (its LimitRanger admission, on here) refuses such a pod indeed.
    rendered = kube_cli("render", "--image", IMAGE, "--name", "j", "-n", namespace, *sizes)
    job = next(d for d in yaml.safe_load_all(rendered.stdout) if d["kind"] == "PyTorchJob")
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    pod = {"metadata": {"name": "probe"}, "spec": {"containers": template["spec"]["containers"]}}
    with pytest.raises(Exception, match="Forbidden|Invalid|Unprocessable|must be less"):
        res(admin, "v1", "Pod").create(namespace=namespace, body=pod)


# Left by the fifth hostile pass: the preflight checked the pod templates alone, but the
# operator gives a static job's workers its init container (limits 100m / 20Mi): a
# LimitRange it breaks let `up` through, and the workers were then never created.
@pytest.mark.parametrize("mode", ["static", "c10d"])
def test_a_limit_range_the_operators_init_container_breaks_is_named(
    kube_cli, admin, namespace, tmp_path, mode
):
    limits = {"type": "Container", "min": {"memory": "64Mi"}}
    body = {"metadata": {"name": "lr"}, "spec": {"limits": [limits]}}
    res(admin, "v1", "LimitRange").create(namespace=namespace, body=body)
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text(f"nodes: 2\nrendezvous: {{mode: {mode}}}\n")
    out = kube_cli(*up_args(namespace, "-f", str(spec), "--memory", "2Gi"))
    if mode == "c10d":  # workers only: the operator adds no init container
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode == 1, out.stderr
    assert out.stderr == (
        f"error: LimitRange {namespace}/lr bounds memory per container (min 64Mi), which the "
        "container init-pytorch breaks (memory request 10Mi); it is the training operator's "
        "init container on the workers (its --pytorch-init-container-template-file sets it, "
        "not ddpdeploy): the namespace's admin can change the LimitRange, or use another "
        "namespace: the operator could not create the job's pods\n"
    )
    assert get_job(admin, namespace, "j") is None
    # The API server refuses such an init container indeed.
    init = {
        "name": "init-pytorch",
        "image": IMAGE,
        "resources": {
            "limits": {"cpu": "100m", "memory": "20Mi"},
            "requests": {"cpu": "50m", "memory": "10Mi"},
        },
    }
    pod = {"metadata": {"name": "probe"}, "spec": {"initContainers": [init], "containers": [
        {"name": "c", "image": IMAGE, "resources": {"requests": {"memory": "1Gi"}}}]}}  # fmt: skip
    with pytest.raises(Exception, match="Forbidden|minimum memory usage"):
        res(admin, "v1", "Pod").create(namespace=namespace, body=pod)


def test_a_limit_range_the_pods_keep_lets_up_through(kube_cli, admin, namespace):
    limits = {"type": "Container", "max": {"cpu": "4", "memory": "8Gi"}, "min": {"cpu": "1"}}
    body = {"metadata": {"name": "lr"}, "spec": {"limits": [limits]}}
    res(admin, "v1", "LimitRange").create(namespace=namespace, body=body)
    out = kube_cli(*up_args(namespace, "--cpu", "2", "--memory", "2Gi"))
    assert out.returncode == 0, out.stderr
