"""The built-in trainer as a 2-node x 2-process CPU PyTorchJob through `ddpdeploy up`, on the
real cluster (issue 23 §2a and §2h): the real apiserver admits the rendered objects (through
the operator's webhook), the stand-in operator makes the pods and headless Services, the
real scheduler binds them and the checkpoint PVC, the real kubelet runs them in Docker with
the rendered securityContext, volumes and env, and torchrun rendezvouses over cluster DNS
and trains over the pod network (gloo).

One job serves every test here (it takes about a minute); each checks one promise of it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from realcluster import Cluster, fresh_namespace

NAME = "e2e-2x2"
STEPS = 30
# The default request is one core per process: a 2 x 2 job asks for 4 cores, and this node
# has 2 (see the product note in docs/ci.md). The spec's cpu and memory fit it.
SPEC = {
    "name": NAME,
    "nodes": 2,
    "procs": 2,
    "gpus": 0,
    "cpu": "400m",
    "memory": "1536Mi",
    "checkpoint": {"size": "1Gi"},  # the default StorageClass: a local volume
    "command": {"args": ["--steps", str(STEPS), "--checkpoint-every", "10"]},
}
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
SHA_LINE = re.compile(r"^weights_sha256\s+([0-9a-f]{64})\s*$", re.M)


@dataclass
class Ran:
    namespace: str
    spec_file: Path
    up: Any  # the CompletedProcess of `ddpdeploy up`
    seconds: float


def events(log: str) -> list[dict[str, Any]]:
    """The JSON event lines of a pod's log (torchrun's `[rankN]:` prefix taken off)."""
    out = []
    for line in log.splitlines():
        line = RANK_PREFIX.sub("", line).strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "event" in obj:
                out.append(obj)
    return out


@pytest.fixture(scope="module")
def job(
    cluster: Cluster, trainer_image: str, e2e_cli: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ran]:
    folder = tmp_path_factory.mktemp("job")
    spec_file = folder / "ddpdeploy.yaml"
    spec_file.write_text(yaml.safe_dump({**SPEC, "image": trainer_image}))
    with fresh_namespace(cluster) as ns:
        start = time.monotonic()
        up = e2e_cli("up", "-f", str(spec_file), "-n", ns, "--wait", "--timeout", "10m")
        ran = Ran(ns, spec_file, up, time.monotonic() - start)
        print(f"`ddpdeploy up` of the 2x2 job ended in {ran.seconds:.1f}s")
        yield ran


def _api(cluster: Cluster) -> tuple[Any, Any]:
    from kubernetes import client

    api = cluster.api()
    return client.CoreV1Api(api), client.CustomObjectsApi(api)


def _job(cluster: Cluster, ns: str) -> dict[str, Any]:
    _, custom = _api(cluster)
    return custom.get_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", NAME)


def test_up_2x2_succeeds_with_the_weights_of_smoke_local(
    cluster: Cluster, job: Ran, e2e_cli: Any, tmp_path: Path
) -> None:
    assert job.up.returncode == 0, (
        f"ddpdeploy up failed:\n{job.up.stdout[-3000:]}\n{job.up.stderr[-3000:]}\n"
        f"operator log:\n{cluster.log_tail('operator')}"
    )
    assert f"PyTorchJob {NAME} succeeded" in job.up.stdout + job.up.stderr
    core, _ = _api(cluster)
    log = core.read_namespaced_pod_log(f"{NAME}-master-0", job.namespace, container="pytorch")
    done = [e for e in events(log) if e["event"] == "done"]
    assert done, f"no done event in rank 0's log:\n{log[-3000:]}"
    assert done[-1]["step"] == STEPS
    assert done[-1]["run"]["world_size"] == 4

    # The same spec on local torchrun agents: the same weights, bit for bit.
    smoke = e2e_cli("smoke", "--local", "-f", str(job.spec_file), cwd=tmp_path)
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    found = SHA_LINE.search(smoke.stdout)
    assert found, smoke.stdout
    assert done[-1]["weights_sha256"] == found.group(1)


def test_the_operator_played_its_part(cluster: Cluster, job: Ran) -> None:
    """What the operator stand-in made of the job, read back from the real API."""
    assert job.up.returncode == 0
    core, _ = _api(cluster)
    obj = _job(cluster, job.namespace)
    conditions = [(c["type"], c["status"]) for c in obj["status"]["conditions"]]
    # Created, Running, then Succeeded, which turns Running to False (util/status.go).
    assert conditions == [("Created", "True"), ("Running", "False"), ("Succeeded", "True")]
    assert obj["status"]["replicaStatuses"]["Master"]["succeeded"] == 1
    assert obj["status"]["replicaStatuses"]["Worker"]["succeeded"] == 1
    assert obj["status"]["completionTime"] >= obj["status"]["startTime"]

    owner = {"kind": "PyTorchJob", "name": NAME, "uid": obj["metadata"]["uid"]}
    for rtype in ("master", "worker"):
        name = f"{NAME}-{rtype}-0"
        pod = core.read_namespaced_pod(name, job.namespace)
        assert pod.status.phase == "Succeeded"
        labels = pod.metadata.labels
        assert labels["training.kubeflow.org/job-name"] == NAME
        assert labels["training.kubeflow.org/replica-type"] == rtype
        assert labels["training.kubeflow.org/replica-index"] == "0"
        assert labels["training.kubeflow.org/operator-name"] == "pytorchjob-controller"
        assert ("training.kubeflow.org/job-role" in labels) == (rtype == "master")
        (ref,) = pod.metadata.owner_references
        assert {"kind": ref.kind, "name": ref.name, "uid": ref.uid} == owner and ref.controller
        # As rendered, and as it ran: the kubelet applied this to a real container.
        sc, csc = pod.spec.security_context, pod.spec.containers[0].security_context
        assert (sc.run_as_user, sc.fs_group, sc.run_as_non_root) == (10001, 10001, True)
        assert csc.read_only_root_filesystem and csc.capabilities.drop == ["ALL"]
        shm = next(v for v in pod.spec.volumes if v.name == "dshm")
        assert shm.empty_dir.medium == "Memory"
        inits = [c.name for c in pod.spec.init_containers or []]
        assert inits == (["init-pytorch"] if rtype == "worker" else [])
        svc = core.read_namespaced_service(name, job.namespace)
        assert svc.spec.cluster_ip == "None"
        assert svc.spec.selector["training.kubeflow.org/replica-type"] == rtype
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
    """§2h: the env the operator stand-in gave each real pod is what ddpdeploy's launch
    contract says the operator gives it (plus the pod's own HOME, TMPDIR and caches)."""
    # Product modules, imported here only: ddpdeploy/ is being reorganised.
    from ddpdeploy.cluster.saved import saved_spec
    from ddpdeploy.render.pod import pod_only_env
    from ddpdeploy.targets import launch_contract

    assert job.up.returncode == 0
    core, _ = _api(cluster)
    spec = saved_spec(_job(cluster, job.namespace))  # the spec `up` rendered the job from
    assert spec is not None
    launch = launch_contract(spec)
    assert [n.hostname for n in launch.nodes] == [f"{NAME}-master-0", f"{NAME}-worker-0"]
    for node in launch.nodes:
        pod = core.read_namespaced_pod(node.hostname, job.namespace)
        (container,) = [c for c in pod.spec.containers if c.name == "pytorch"]
        got: dict[str, str] = {}
        for var in container.env:  # in order: a later one wins, as in the container
            if var.value_from is not None:
                assert var.value_from.field_ref.field_path == "status.podIP"
                got[var.name] = pod.status.pod_ip
            else:
                got[var.name] = var.value
        want = launch.node_env(node) | pod_only_env(spec)
        # The downward API's fields are the pod's own on the cluster (addresses stay names).
        want |= {name: pod.status.pod_ip for name in launch.field_env}
        assert got == want, node.hostname


def test_the_default_cpu_request_of_a_2x2_job_does_not_fit_a_2_core_node(
    cluster: Cluster, namespace: str, trainer_image: str, e2e_cli: Any, tmp_path: Path
) -> None:
    """Without cpu in the spec each pod asks for a core per process: 2 x 2 asks for 4 of the
    node's 2 (a product note in docs/ci.md). The real scheduler says so, and `up` ends with
    its reason at once instead of waiting."""
    from kubernetes import client

    allocatable = client.CoreV1Api(cluster.api()).list_node().items[0].status.allocatable
    if int(allocatable["cpu"]) >= 4:
        pytest.skip(f"this node has {allocatable['cpu']} CPUs: a 2 x 2 job fits it")
    up = e2e_cli(
        "up", "--name", "e2e-default-cpu", "--image", trainer_image, "-n", namespace,
        "--nodes", "2", "--procs", "2", "--gpus", "0", "--wait", "--timeout", "3m",
        cwd=tmp_path,  # no ddpdeploy.yaml here: the defaults
    )  # fmt: skip
    assert up.returncode == 1, up.stdout + up.stderr
    assert "Unschedulable" in up.stderr and "Insufficient cpu" in up.stderr, up.stderr
