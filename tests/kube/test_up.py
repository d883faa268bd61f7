"""`ddpdeploy up` against a real kube-apiserver: preflight, dry run, apply, and `--wait`
driven through each ending by the tests acting as operator and kubelet."""

from __future__ import annotations

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
from apiserver import LIMITED_NAMESPACE

IMAGE = "registry.invalid/train:v1"


def up_args(ns: str, name: str = "j", *more: str) -> list[str]:
    return ["up", "--image", IMAGE, "--name", name, "-n", ns, "--nodes", "2", *more]


def stored(admin, ns: str) -> dict[str, list[str]]:
    pvcs = res(admin, "v1", "PersistentVolumeClaim").get(namespace=ns).to_dict()["items"]
    jobs = res(admin, "kubeflow.org/v1", "PyTorchJob").get(namespace=ns).to_dict()["items"]
    return {
        "pvc": [p["metadata"]["name"] for p in pvcs],
        "job": [j["metadata"]["name"] for j in jobs],
    }


@pytest.fixture
def ckpt_spec(tmp_path: Path) -> Path:
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text("checkpoint: {size: 1Gi}\n")
    return path


def test_up_no_wait_applies_pvc_and_job_with_the_saved_spec(kube_cli, admin, namespace, ckpt_spec):
    res_ = kube_cli(*up_args(namespace, "j", "-f", str(ckpt_spec), "--no-wait"))
    assert res_.returncode == 0, res_.stderr
    assert "no default StorageClass" in res_.stderr
    assert stored(admin, namespace) == {"pvc": ["j-checkpoints"], "job": ["j"]}
    job = get_job(admin, namespace, "j")
    assert job["metadata"]["managedFields"][0]["manager"] == "ddpdeploy"
    assert (
        '"image": "registry.invalid/train:v1"'
        in job["metadata"]["annotations"]["ddpdeploy.dev/spec"]
    )
    # A job of the same name is refused, and --replace recreates it.
    again = kube_cli(*up_args(namespace, "j", "-f", str(ckpt_spec), "--no-wait"))
    assert again.returncode == 1
    assert "already exists" in again.stderr and "--replace" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 2  # the storage warning, then one line
    replaced = kube_cli(*up_args(namespace, "j", "-f", str(ckpt_spec), "--no-wait", "--replace"))
    assert replaced.returncode == 0, replaced.stderr
    assert get_job(admin, namespace, "j")["metadata"]["uid"] != job["metadata"]["uid"]


def test_dry_run_stores_nothing(kube_cli, admin, namespace, ckpt_spec):
    out = kube_cli(*up_args(namespace, "j", "-f", str(ckpt_spec), "--dry-run"))
    assert out.returncode == 0, out.stderr
    assert "would apply PyTorchJob" in out.stderr
    assert stored(admin, namespace) == {"pvc": [], "job": []}


def test_server_rejection_applies_nothing(kube_cli, admin, namespace, tmp_path):
    # A rule of this cluster that no client can know: a LimitRange caps PVCs at 1Gi, and the
    # apiserver's LimitRanger admission refuses a bigger one, in the dry run already.
    res(admin, "v1", "LimitRange").create(
        namespace=namespace,
        body={
            "metadata": {"name": "small-pvcs"},
            "spec": {"limits": [{"type": "PersistentVolumeClaim", "max": {"storage": "1Gi"}}]},
        },
    )
    spec = tmp_path / "big.yaml"
    spec.write_text("checkpoint: {size: 2Gi}\n")
    for extra in ([], ["--dry-run"]):
        out = kube_cli(*up_args(namespace, "j", "-f", str(spec), "--no-wait", *extra))
        assert out.returncode == 1
        last = out.stderr.strip().splitlines()[-1]
        assert "dry run of PersistentVolumeClaim j-checkpoints: the API server refused it" in last
        assert "maximum storage usage per PersistentVolumeClaim is 1Gi" in last
        assert stored(admin, namespace) == {"pvc": [], "job": []}


def test_missing_namespace_and_create_namespace(kube_cli, admin):
    out = kube_cli(*up_args("nowhere", "j", "--no-wait"))
    assert out.returncode == 1
    assert "namespace nowhere does not exist" in out.stderr and "--create-namespace" in out.stderr
    out = kube_cli(*up_args("made-by-up", "j", "--no-wait", "--create-namespace"))
    assert out.returncode == 0, out.stderr
    assert stored(admin, "made-by-up")["job"] == ["j"]


def test_gpu_capacity_preflight(kube_cli, admin, namespace):
    out = kube_cli(*up_args(namespace, "j", "--gpus", "8", "--no-wait"))
    assert out.returncode == 1
    assert "cannot hold 2 × 8 GPUs: 0 node(s)" in out.stderr
    assert stored(admin, namespace)["job"] == []
    # Two 8-GPU nodes (as the device plugin reports them), one of them busy right now.
    nodes = res(admin, "v1", "Node")
    for name in ("gpu-a", "gpu-b"):
        nodes.create(body={"metadata": {"name": name}})
        gpus = {"nvidia.com/gpu": "8"}
        nodes.status.patch(
            name=name,
            body={"status": {"allocatable": gpus, "capacity": gpus}},
            content_type="application/merge-patch+json",
        )
    busy = {
        "metadata": {"name": "busy"},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
            ],
        },
    }
    res(admin, "v1", "Pod").create(namespace=namespace, body=busy)
    out = kube_cli(*up_args(namespace, "j", "--gpus", "8", "--no-wait"))
    assert out.returncode == 0, out.stderr
    assert "warning: only 1 node(s) have 8 GPUs free right now" in out.stderr
    assert stored(admin, namespace)["job"] == ["j"]


def test_limited_user_is_told_it_is_forbidden(kube_cli, admin, namespace):
    out = kube_cli(*up_args(namespace, "j", "--no-wait", "--context", "limited"))
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "forbidden" in last and 'User "limited"' in last and "RBAC" in last
    assert stored(admin, namespace)["job"] == []
    # In its own namespace the same user may.
    out = kube_cli(*up_args(LIMITED_NAMESPACE, "mine", "--no-wait", "--context", "limited"))
    assert out.returncode == 0, out.stderr


def test_unreachable_api_and_bad_credentials(kube_cli, control_plane, tmp_path):
    text = control_plane.kubeconfig.read_text()
    dead = tmp_path / "dead"
    dead.write_text(text.replace(control_plane.server, "https://127.0.0.1:1"))
    out = kube_cli("list", "--kubeconfig", str(dead))
    assert out.returncode == 1
    assert "cannot reach the Kubernetes API at https://127.0.0.1:1" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    expired = tmp_path / "expired"
    expired.write_text(text.replace("admin-token-for-tests", "expired-token"))
    out = kube_cli("list", "--kubeconfig", str(expired))
    assert out.returncode == 1
    assert "rejected the credentials" in out.stderr and "Traceback" not in out.stderr
    missing = kube_cli("list", "--kubeconfig", str(tmp_path / "none"))
    assert missing.returncode == 2 and "none: no such file; point --kubeconfig" in missing.stderr


def _run_to(admin, control_plane, namespace: str, drive, *extra: str) -> tuple[int, str]:
    proc = start_cli(
        control_plane.kubeconfig, *up_args(namespace, "j", "--wait", "--timeout", "60s", *extra)
    )
    job = wait_for_job(admin, namespace, "j", proc)
    pods = create_pods(admin, job)
    drive(pods)
    code, _, err = finish(proc)
    return code, err


def test_wait_running_then_succeeded(admin, control_plane, namespace):
    def drive(pods):
        running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
        for pod in pods:
            set_pod_status(
                admin,
                namespace,
                pod,
                {"phase": "Running", "containerStatuses": [container_status(IMAGE, running)]},
            )
        set_job_conditions(admin, namespace, "j", ("Created", ""), ("Running", "job running"))
        time.sleep(2.5)  # long enough for `up` to see and print Running
        set_job_conditions(
            admin, namespace, "j", ("Created", ""), ("Running", ""), ("Succeeded", "job succeeded")
        )

    code, err = _run_to(admin, control_plane, namespace, drive)
    assert code == 0, err
    assert "j: Running" in err
    assert "j-worker-0: Running" in err and "j-worker-1: Running" in err
    assert err.strip().splitlines()[-1] == "PyTorchJob j succeeded: job succeeded"


def _waiting(reason: str, message: str, restarts: int = 0, last: dict | None = None):
    def status(pod: str) -> dict:
        cs = container_status(
            IMAGE, {"waiting": {"reason": reason, "message": message}}, restarts, last
        )
        return {"phase": "Pending" if not restarts else "Running", "containerStatuses": [cs]}

    return status


FAILURES = {
    "ImagePullBackOff": (
        _waiting("ImagePullBackOff", 'Back-off pulling image "registry.invalid/train:v1"'),
        "PyTorchJob j ImagePullBackOff: pod j-worker-0: cannot pull image "
        "registry.invalid/train:v1",
    ),
    "CrashLoopBackOff": (
        _waiting(
            "CrashLoopBackOff",
            "back-off 40s restarting failed container",
            restarts=3,
            last={
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "startedAt": None,
                    "finishedAt": None,
                }
            },
        ),
        "pod j-worker-0: container pytorch restarted 3 times, last exit code 1 (Error)",
    ),
    "Unschedulable": (
        lambda pod: {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 node(s) had taint {gpu: a100}, "
                    "that the pod didn't tolerate.",
                }
            ],
        },
        "PyTorchJob j Unschedulable: pod j-worker-0: 0/4 nodes are available: 4 node(s) had "
        "taint {gpu: a100}, that the pod didn't tolerate.",
    ),
}


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_wait_ends_with_the_stuck_pods_reason(admin, control_plane, namespace, kind):
    status, expected = FAILURES[kind]

    def drive(pods):
        set_pod_status(admin, namespace, pods[0], status(pods[0]))

    code, err = _run_to(admin, control_plane, namespace, drive)
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert expected in last, err
    assert "ddpdeploy down j" in last


def test_wait_waits_out_a_pod_the_nodes_have_no_room_for_now(admin, control_plane, namespace):
    # The preflight's warning says such pods wait until room frees up (or an autoscaler
    # adds a node): `up --wait` waits on, showing why, and its timeout names it.
    def drive(pods):
        sched = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        }
        set_pod_status(admin, namespace, pods[0], {"phase": "Pending", "conditions": [sched]})

    proc = start_cli(
        control_plane.kubeconfig, *up_args(namespace, "j", "--wait", "--timeout", "6s")
    )
    drive(create_pods(admin, wait_for_job(admin, namespace, "j", proc)))
    code, _, err = finish(proc)
    assert code == 1, err
    assert "j-worker-0: Pending, 0 restarts Unschedulable: 0/4 nodes" in err  # the live view
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: timed out after 6s waiting for PyTorchJob"), err
    assert "it is Unschedulable (pod j-worker-0: 0/4 nodes are available: 4 Insufficient " in last


def test_wait_ends_with_job_failed(admin, control_plane, namespace):
    def drive(pods):
        set_job_conditions(
            admin,
            namespace,
            "j",
            ("Created", ""),
            ("Failed", "PyTorchJob j has failed because one Worker replica(s) failed."),
        )

    code, err = _run_to(admin, control_plane, namespace, drive)
    assert code == 1
    assert (
        "PyTorchJob j Failed: PyTorchJob j has failed because one Worker replica(s) failed." in err
    )


def test_wait_times_out(kube_cli, admin, namespace):
    out = kube_cli(*up_args(namespace, "j", "--wait", "--timeout", "2s"))
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: timed out after 2s waiting for PyTorchJob")
    assert "Pending" in last


def test_conflict_with_another_manager_applies_nothing(kube_cli, admin, namespace, ckpt_spec):
    # A PVC of that name someone else made is not ours: refused before any change.
    theirs = {
        "metadata": {"name": "j-checkpoints"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
    }
    res(admin, "v1", "PersistentVolumeClaim").create(
        namespace=namespace, body=theirs, field_manager="someone-else"
    )
    out = kube_cli(*up_args(namespace, "j", "-f", str(ckpt_spec), "--no-wait"))
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: PersistentVolumeClaim {namespace}/j-checkpoints exists and")
    assert "no ddpdeploy labels" in last and "--adopt-pvc" in last
    assert stored(admin, namespace) == {"pvc": ["j-checkpoints"], "job": []}
    # Our own NetworkPolicy with a field another manager took: the dry run's conflict stops
    # the replace before the old job is touched.
    assert kube_cli(*up_args(namespace, "k", "--no-wait")).returncode == 0
    first = get_job(admin, namespace, "k")
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "k", "namespace": namespace},
        "spec": {"podSelector": {"matchLabels": {"x": "y"}}},
    }
    res(admin, "networking.k8s.io/v1", "NetworkPolicy").server_side_apply(
        body=policy, namespace=namespace, field_manager="someone-else", force_conflicts=True
    )
    out = kube_cli(*up_args(namespace, "k", "--no-wait", "--replace"))
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: dry run of NetworkPolicy k: conflict:")
    assert "someone-else" in last
    assert get_job(admin, namespace, "k")["metadata"]["uid"] == first["metadata"]["uid"]
