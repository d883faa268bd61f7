"""The built-in trainer as a 2-node x 2-process CPU PyTorchJob through `ddpdeploy up`, on the
real cluster, at the default rendezvous (c10d, a fixed node count; issue 23 §2a, §2d, §2h):
the real apiserver admits the rendered objects (through the operator's webhook), the
stand-in operator makes Worker pods and headless Services with the elastic env, the real
scheduler binds them and the checkpoint PVC, the real kubelet runs them in Docker with the
rendered securityContext, volumes and env, and torchrun's c10d rendezvous meets over cluster
DNS and trains over the pod network (gloo); global rank 0 lands on either pod.

One job serves every test here; each checks one promise of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2ejob import (
    BUILTIN,
    apis,
    assert_env_of_the_launch_contract,
    done_event,
    job_events,
    wait_for,
    write_spec,
)
from realcluster import Cluster, fresh_namespace

NAME = "e2e-2x2"
STEPS = 60
# 2 x 2 at cpu 400m, memory 1536Mi: the default request is one core per process, and this
# node has 2 (`up` refuses the default: the last test). The restart tests run the same
# training (tests/e2e/test_restarts.py), so their weights compare with this clean run's.
SPEC = {"name": NAME, **BUILTIN}


@dataclass
class Ran:
    namespace: str
    spec_file: Path
    up: Any  # the CompletedProcess of `ddpdeploy up`
    seconds: float


@pytest.fixture(scope="module")
def job(
    cluster: Cluster,
    trainer_image: str,
    e2e_cli: Any,
    clean_weights: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Ran]:
    clean_weights.start(SPEC)  # smoke --local beside the cluster job
    spec_file = write_spec(tmp_path_factory.mktemp("job"), {**SPEC, "image": trainer_image})
    with fresh_namespace(cluster) as ns:
        start = time.monotonic()
        up = e2e_cli("up", "-f", str(spec_file), "-n", ns, "--wait", "--timeout", "10m")
        ran = Ran(ns, spec_file, up, time.monotonic() - start)
        print(f"`ddpdeploy up` of the 2x2 job ended in {ran.seconds:.1f}s")
        yield ran


def _job(cluster: Cluster, ns: str) -> dict[str, Any]:
    _, custom = apis(cluster)
    return custom.get_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", NAME)


def test_up_2x2_succeeds_with_the_weights_of_smoke_local(
    cluster: Cluster, job: Ran, clean_weights: Any
) -> None:
    assert job.up.returncode == 0, (
        f"ddpdeploy up failed:\n{job.up.stdout[-3000:]}\n{job.up.stderr[-3000:]}\n"
        f"operator log:\n{cluster.log_tail('operator')}"
    )
    assert f"PyTorchJob {NAME} succeeded" in job.up.stdout + job.up.stderr
    core, _ = apis(cluster)
    done = done_event(core, job.namespace, NAME)
    assert done is not None, "no done event in any pod's log"
    assert done["step"] == STEPS
    assert done["run"]["world_size"] == 4
    # Under c10d rank 0 is on whichever pod the rendezvous put it; only it logs events.
    starts = job_events(core, job.namespace, NAME, "start")
    assert len(starts) == 1 and starts[0][1]["world_size"] == 4

    # The same spec on local torchrun agents: the same weights, bit for bit.
    assert done["weights_sha256"] == clean_weights(SPEC)


def test_the_operator_played_its_part(cluster: Cluster, job: Ran) -> None:
    """What the operator stand-in made of the c10d job (Worker replicas only, an
    elasticPolicy with min = max), read back from the real API."""
    assert job.up.returncode == 0
    core, _ = apis(cluster)
    obj = _job(cluster, job.namespace)
    assert list(obj["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    policy = obj["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"], policy["rdzvBackend"]) == (2, 2, "c10d")
    conditions = [(c["type"], c["status"]) for c in obj["status"]["conditions"]]
    # Created, Running, then Succeeded, which turns Running to False (util/status.go); with
    # an elasticPolicy the job succeeds once any worker has.
    assert conditions == [("Created", "True"), ("Running", "False"), ("Succeeded", "True")]
    assert obj["status"]["replicaStatuses"]["Worker"]["succeeded"] == 2
    assert "Master" not in obj["status"]["replicaStatuses"]
    assert obj["status"]["completionTime"] >= obj["status"]["startTime"]

    owner = {"kind": "PyTorchJob", "name": NAME, "uid": obj["metadata"]["uid"]}
    for index in (0, 1):
        name = f"{NAME}-worker-{index}"
        # The job succeeded when the first worker did; the other ends on its own.
        pod = wait_for(
            f"{name} Succeeded",
            lambda n=name: (
                (p := core.read_namespaced_pod(n, job.namespace)).status.phase == "Succeeded" and p
            ),
            60,
        )
        labels = pod.metadata.labels
        assert labels["training.kubeflow.org/job-name"] == NAME
        assert labels["training.kubeflow.org/replica-type"] == "worker"
        assert labels["training.kubeflow.org/replica-index"] == str(index)
        assert labels["training.kubeflow.org/operator-name"] == "pytorchjob-controller"
        # No Master: worker 0 has the master role.
        assert ("training.kubeflow.org/job-role" in labels) == (index == 0)
        (ref,) = pod.metadata.owner_references
        assert {"kind": ref.kind, "name": ref.name, "uid": ref.uid} == owner and ref.controller
        # As rendered, and as it ran: the kubelet applied this to a real container.
        sc, csc = pod.spec.security_context, pod.spec.containers[0].security_context
        assert (sc.run_as_user, sc.fs_group, sc.run_as_non_root) == (10001, 10001, True)
        assert csc.read_only_root_filesystem and csc.capabilities.drop == ["ALL"]
        shm = next(v for v in pod.spec.volumes if v.name == "dshm")
        assert shm.empty_dir.medium == "Memory"
        assert not pod.spec.init_containers  # no Master: no init-pytorch
        svc = core.read_namespaced_service(name, job.namespace)
        assert svc.spec.cluster_ip == "None"
        assert svc.spec.selector["training.kubeflow.org/replica-index"] == str(index)
    # The NetworkPolicy is in the API (this cluster's CNI does not enforce policies).
    from kubernetes import client

    net = client.NetworkingV1Api(cluster.api())
    assert net.read_namespaced_network_policy(NAME, job.namespace).spec.pod_selector

    # The checkpoint PVC was bound to a local volume, which the trainer (UID 10001) wrote
    # to through the fsGroup the kubelet set.
    pvc = core.read_namespaced_persistent_volume_claim(f"{NAME}-checkpoints", job.namespace)
    assert pvc.status.phase == "Bound"
    if cluster.state is not None:
        pv = core.read_persistent_volume(pvc.spec.volume_name)
        files = sorted(Path(pv.spec.local.path).glob("ckpt-step-*.pt"))
        assert [f.name for f in files][-1] == f"ckpt-step-{STEPS:09d}.pt"
        assert {(f.stat().st_uid, f.stat().st_gid) for f in files} == {(10001, 10001)}


def test_each_pod_gets_the_env_of_the_launch_contract(cluster: Cluster, job: Ran) -> None:
    """§2h under c10d: PET_RDZV_ENDPOINT=<job>-worker-0:<port>, PET_RDZV_BACKEND,
    PET_NNODES=2:2, PET_RDZV_ID, PET_RDZV_CONF from the operator, no MASTER_*, and our own
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE and PET_LOCAL_ADDR: as the launch contract says
    (the static job's pods are checked in test_restarts.py)."""
    assert job.up.returncode == 0
    pods = assert_env_of_the_launch_contract(cluster, job.namespace, NAME)
    assert pods == [f"{NAME}-worker-0", f"{NAME}-worker-1"]
    core, _ = apis(cluster)
    env = {
        e.name: e.value
        for e in core.read_namespaced_pod(pods[1], job.namespace).spec.containers[0].env
    }
    assert env["PET_RDZV_ENDPOINT"] == f"{NAME}-worker-0:23456"
    assert env["PET_NNODES"] == "2:2" and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert not any(k.startswith(("MASTER_", "PET_MASTER_")) for k in env)


def test_collect_from_the_cluster_is_what_rank_0_wrote(
    cluster: Cluster, job: Ran, e2e_cli: Any, tmp_path: Path
) -> None:
    """§2d: `collect --from cluster` reads the real volume through the real kubelet's exec
    (the job's pods have ended: a helper pod mounts the claim), and brings the newest
    checkpoint byte for byte as rank 0 wrote it, wherever rank 0 ran."""
    assert job.up.returncode == 0
    out = tmp_path / "out"
    res = e2e_cli("collect", NAME, "-n", job.namespace, "--from", "cluster", "--to", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"collected ddpdeploy checkpoint step {STEPS}" in res.stdout + res.stderr
    got = sorted(p.name for p in out.iterdir())
    want = [f"ckpt-step-{STEPS:09d}.json", f"ckpt-step-{STEPS:09d}.pt"]
    assert [n for n in got if n.startswith("ckpt-")] == want
    core, _ = apis(cluster)
    if cluster.state is not None:
        pvc = core.read_namespaced_persistent_volume_claim(f"{NAME}-checkpoints", job.namespace)
        folder = Path(core.read_persistent_volume(pvc.spec.volume_name).spec.local.path)
        for name in want:
            assert (out / name).read_bytes() == (folder / name).read_bytes(), name
    # The helper pod is deleted (gone, or going).
    helpers = [
        p for p in core.list_namespaced_pod(job.namespace).items if "collect" in p.metadata.name
    ]
    assert all(p.metadata.deletion_timestamp for p in helpers), helpers


def test_status_of_the_finished_job_reads_rank_0_wherever_it_ran(
    cluster: Cluster, job: Ran, e2e_cli: Any
) -> None:
    """Under c10d no pod is rank 0's by name: `status` finds the pod whose log has rank 0's
    events also once the pods have ended."""
    assert job.up.returncode == 0
    res = e2e_cli("status", NAME, "-n", job.namespace, "-o", "json")
    assert res.returncode == 0, res.stderr
    import json

    doc = json.loads(res.stdout)
    assert doc["state"] == "Succeeded"
    training = doc["training"]
    assert training and "error" not in training, training
    assert training["step"] == STEPS and training["done"], training


def test_a_job_bigger_than_the_node_is_refused_before_anything_is_applied(
    cluster: Cluster, namespace: str, trainer_image: str, e2e_cli: Any, tmp_path: Path
) -> None:
    """Without cpu in the spec each pod asks for a core per process: 2 x 2 asks for 4 of a
    2-core node. `up`'s preflight says so in one line (the request, the node's allocatable,
    the fix) and applies nothing; the real scheduler would only have said Unschedulable."""
    from kubernetes import client

    core, custom = apis(cluster)
    allocatable = core.list_node().items[0].status.allocatable
    if int(allocatable["cpu"]) >= 4:
        pytest.skip(f"this node has {allocatable['cpu']} CPUs: a 2 x 2 job fits it")
    up = e2e_cli(
        "up", "--name", "e2e-default-cpu", "--image", trainer_image, "-n", namespace,
        "--nodes", "2", "--procs", "2", "--gpus", "0", "--wait", "--timeout", "3m",
        cwd=tmp_path,  # no ddpdeploy.yaml here: the defaults
    )  # fmt: skip
    assert up.returncode == 1, up.stdout + up.stderr
    (line,) = [ln for ln in up.stderr.splitlines() if ln.strip()]
    assert "cpu" in line and "allocatable" in line and "--cpu" in line, line
    assert not custom.list_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs")[
        "items"
    ]
    assert not core.list_namespaced_persistent_volume_claim(namespace).items
    assert not client.NetworkingV1Api(cluster.api()).list_namespaced_network_policy(namespace).items
