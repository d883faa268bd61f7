"""A job's life on the real cluster (issue 23 §2g), one elastic job (the ddpkit script) from
start to purge:
Ctrl-C (SIGINT) during `up --wait` stops the watching and leaves the job running, saying so;
`scale` grows it within its `--elastic 1:3` range and the new pod joins torchrun's c10d
rendezvous (world size 3); `down` stops it and keeps the checkpoint PVC; `resume`
resubmits the saved spec (3 nodes) and the job goes on from its checkpoint to Succeeded;
`down --purge` removes what ddpdeploy made and nothing else: a PyTorchJob, NetworkPolicy
and PVC of the same names in another namespace, and in the job's own namespace a PVC with
the job's instance label but not ours and a pod that looks like the job's, stay.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2ejob import apis, cli_process, job_condition, job_events, job_lines, wait_for, write_spec
from realcluster import Cluster, fresh_namespace

NAME = "life"
STEPS = 40
SPEC = {
    "name": NAME,
    "nodes": 2,
    "procs": 1,
    "gpus": 0,
    "cpu": "300m",
    "memory": "1Gi",
    "rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": 3},
    "checkpoint": {"size": "1Gi"},
    # The ddpkit script: it resumes on any world size (the built-in trainer refuses a
    # mid-epoch checkpoint of another world size, so a scale mid-epoch would crash-loop it).
    "command": {
        "script": "ddpkit_train.py",
        "args": ["--steps", str(STEPS), "--save-every", "2", "--step-delay", "0.5"],
    },
}
INSTANCE = "app.kubernetes.io/instance"


def _foreign_job(namespace: str) -> dict[str, Any]:
    """A PyTorchJob of the job's name that ddpdeploy did not make (suspended: no pods)."""
    container = {"name": "pytorch", "image": "busybox", "command": ["true"]}
    template = {"spec": {"containers": [container]}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "runPolicy": {"suspend": True},
            "pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": template}},
        },
    }


def _claim(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def _policy(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"podSelector": {}}}


@pytest.fixture(scope="module")
def life(
    cluster: Cluster, trainer_image: str, e2e_cli: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    core, custom = apis(cluster)
    net = client.NetworkingV1Api(cluster.api())
    folder = tmp_path_factory.mktemp("life")
    spec_file = write_spec(folder, {**SPEC, "image": trainer_image})
    got: dict[str, Any] = {}
    with fresh_namespace(cluster) as ns, fresh_namespace(cluster) as other:
        start = time.monotonic()
        # Ctrl-C while `up --wait` watches the running job.
        up = cli_process(cluster.env, "up", "-f", str(spec_file), "-n", ns, "--wait", cwd=folder)
        wait_for("3 steps", lambda: len(job_events(core, ns, NAME, "step")) >= 3, 300)
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=60)
        got["interrupted"] = (up.returncode, err)
        got["after_interrupt"] = job_condition(custom, ns, NAME) or "running"

        # scale: a third node joins the rendezvous.
        scaled_at = time.time()
        got["scale"] = e2e_cli("scale", NAME, "-n", ns, "--nodes", "3")

        def three() -> Any:
            starts = job_events(core, ns, NAME, "start")
            late = [e for line, e in starts if line.at > scaled_at and e.get("world_size") == 3]
            return late and job_events(core, ns, NAME, "step")[-1][1]["step"] > late[0].get(
                "resume_step", 0
            )

        wait_for("a world of 3 training", three, 240)
        got["world3"] = [e for _, e in job_events(core, ns, NAME, "start")][-1]

        # down keeps the checkpoints; resume goes on from them with the saved 3 nodes.
        got["down"] = e2e_cli("down", NAME, "-n", ns)
        wait_for("the pods gone", lambda: not core.list_namespaced_pod(ns).items, 120)
        got["resume"] = e2e_cli("resume", NAME, "-n", ns)
        got["end"] = wait_for(
            f"{NAME} to end", lambda: job_condition(custom, ns, NAME), 300, every=1
        )
        got["pods"] = sorted(p.metadata.name for p in core.list_namespaced_pod(ns).items)
        starts = [e for _, e in job_events(core, ns, NAME, "start")]
        assert starts, (
            got["end"],
            got["pods"],
            got["resume"].stderr,
            job_lines(core, ns, NAME)[-20:],
        )
        got["resumed"] = starts[0]
        got["done"] = [e for _, e in job_events(core, ns, NAME, "done")]

        # Objects that are not ours, named like ours.
        custom.create_namespaced_custom_object(
            "kubeflow.org", "v1", other, "pytorchjobs", _foreign_job(other)
        )
        net.create_namespaced_network_policy(other, _policy(NAME))
        core.create_namespaced_persistent_volume_claim(other, _claim(f"{NAME}-checkpoints", {}))
        core.create_namespaced_persistent_volume_claim(ns, _claim(f"{NAME}-data", {INSTANCE: NAME}))
        lookalike = {
            "metadata": {"name": f"{NAME}-worker-9", "labels": {
                "training.kubeflow.org/job-name": NAME, INSTANCE: NAME}},
            "spec": {"containers": [{"name": "c", "image": trainer_image,
                                     "command": ["sleep", "600"]}],
                     "terminationGracePeriodSeconds": 0},
        }  # fmt: skip
        core.create_namespaced_pod(ns, lookalike)
        got["purge"] = e2e_cli("down", NAME, "-n", ns, "--purge")
        time.sleep(3)  # what the garbage collector deletes with the job, it deletes now
        got["left_ns"] = {
            "jobs": [
                j["metadata"]["name"]
                for j in custom.list_namespaced_custom_object(
                    "kubeflow.org", "v1", ns, "pytorchjobs"
                )["items"]
            ],
            "claims": sorted(
                c.metadata.name
                for c in core.list_namespaced_persistent_volume_claim(ns).items
                if not c.metadata.deletion_timestamp
            ),
            "policies": [p.metadata.name for p in net.list_namespaced_network_policy(ns).items],
            "pods": sorted(
                p.metadata.name
                for p in core.list_namespaced_pod(ns).items
                if not p.metadata.deletion_timestamp
            ),
        }
        got["left_other"] = {
            "jobs": [
                j["metadata"]["name"]
                for j in custom.list_namespaced_custom_object(
                    "kubeflow.org", "v1", other, "pytorchjobs"
                )["items"]
            ],
            "claims": [
                c.metadata.name for c in core.list_namespaced_persistent_volume_claim(other).items
            ],
            "policies": [p.metadata.name for p in net.list_namespaced_network_policy(other).items],
        }
        got["namespace"] = ns
        print(f"\nthe job's life took {time.monotonic() - start:.0f}s")
        core.delete_namespaced_pod(lookalike["metadata"]["name"], ns, grace_period_seconds=0)
        yield got


def test_ctrl_c_during_up_wait_leaves_the_job_running_and_says_so(life: dict[str, Any]) -> None:
    code, err = life["interrupted"]
    assert code == 130, err
    line = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert f"stopped watching; PyTorchJob {life['namespace']}/{NAME} is submitted and goes on" in (
        line
    ), err
    assert "(it was Running)" in line and "ddpdeploy down" in line, line
    assert life["after_interrupt"] == "running"


def test_scale_grows_an_elastic_job_and_the_new_pod_joins(life: dict[str, Any]) -> None:
    scale = life["scale"]
    assert scale.returncode == 0, scale.stderr
    assert life["world3"]["world_size"] == 3
    assert life["world3"]["resumed"] is True  # from its checkpoint, as torchrun restarted it


def test_resume_after_down_goes_on_from_the_checkpoint(life: dict[str, Any]) -> None:
    down, resume = life["down"], life["resume"]
    assert down.returncode == 0, down.stderr
    assert f"kept PersistentVolumeClaim {life['namespace']}/{NAME}-checkpoints" in down.stderr
    assert resume.returncode == 0, resume.stderr
    assert life["end"] == "Succeeded"
    assert life["pods"][:3] == [f"{NAME}-worker-{i}" for i in range(3)]  # the saved 3 nodes
    first = life["resumed"]  # the resumed job's first start: from the volume, not step 0
    assert first["resumed"] is True and first["resume_step"] > 0, first
    assert life["done"] and life["done"][-1]["step"] == STEPS


def test_down_purge_removes_ours_and_nothing_else(life: dict[str, Any]) -> None:
    purge = life["purge"]
    assert purge.returncode == 0, purge.stderr
    assert life["left_ns"] == {
        "jobs": [],
        "claims": [f"{NAME}-data"],  # our instance label, not made by ddpdeploy
        "policies": [],
        "pods": [f"{NAME}-worker-9"],  # looks like the job's, owned by nothing
    }
    assert life["left_other"] == {
        "jobs": [NAME],
        "claims": [f"{NAME}-checkpoints"],
        "policies": [NAME],
    }
