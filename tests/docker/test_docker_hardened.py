"""The image `ddpdeploy build` makes runs under the rendered pod's security settings.

The rendered pod of a 1-node job is translated into a `docker run` as close to the kubelet's
as Docker allows: the pod's UID/GID, its read-only root, tmpfs for its emptyDirs, no
capabilities, no-new-privileges, the operator's env plus the pod's, and the checkpoint
volume as a fresh root-owned named volume, the way most storage classes provision a PVC.
Docker has no fsGroup, and what the kubelet does for it (the volume's root gets the
fsGroup as group, group rw and setgid) is left out here: on the root-owned volume the
trainer's first checkpoint fails, as on a cluster without fsGroup. With fsGroup the job
trains and checkpoints on real pods (tests/e2e/test_pytorchjob.py). The read-only root is
real: only the emptyDirs and the volume take writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import launch_contract, render_objects

pytestmark = pytest.mark.docker

STEPS = ["--steps", "4", "--checkpoint-every", "2", "--log-every", "2"]


@pytest.fixture(scope="module")
def image(trainer_image: str) -> str:
    return trainer_image


@pytest.fixture
def volume(engine: Any) -> Iterator[str]:
    """A fresh named volume: its root is root:root 0755, like a new PVC on most classes."""
    vol = engine.volumes.create(f"ddpdeploy-test-ckpt-{uuid.uuid4().hex[:12]}")
    yield vol.name
    vol.remove(force=True)


def pod_of(image: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The rendered pod spec of a 1-node CPU job, and the env its container gets."""
    doc = {
        "name": "hard",
        "image": image,
        "checkpoint": {"claimName": "ckpt"},
        "shmSize": "256Mi",
        "command": {"args": STEPS},
    }
    spec = JobSpec.model_validate(doc)
    (job,) = [o for o in render_objects(spec) if o["kind"] == "PyTorchJob"]
    (replica,) = job["spec"]["pytorchReplicaSpecs"].values()  # c10d: the Workers alone
    pod = replica["template"]["spec"]
    contract = launch_contract(spec)
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    env |= contract.node_env(contract.nodes[0])  # what the operator injects
    return pod, env


def docker_args(pod: dict[str, Any], env: dict[str, str], volume: str) -> dict[str, Any]:
    """The pod's settings as docker SDK `containers.create` arguments."""
    (c,) = pod["containers"]
    sec, csec = pod["securityContext"], c["securityContext"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    tmpfs: dict[str, str] = {}
    binds: dict[str, dict[str, str]] = {}
    shm = None
    for mount in c["volumeMounts"]:
        source = volumes[mount["name"]]
        if "persistentVolumeClaim" in source:
            binds[volume] = {"bind": mount["mountPath"], "mode": "rw"}
        elif source["emptyDir"].get("medium") == "Memory":
            assert mount["mountPath"] == "/dev/shm"
            shm = source["emptyDir"]["sizeLimit"].replace("Mi", "m")
        else:
            # An emptyDir is a fresh directory the pod's user can write (0777, group
            # fsGroup). Docker keeps an image directory's mode on a tmpfs mounted over it
            # (/home/ddp: 0755, the image user's), so the tmpfs is given to the pod's user.
            tmpfs[mount["mountPath"]] = f"uid={sec['runAsUser']},gid={sec['fsGroup']}"
    assert csec["capabilities"] == {"drop": ["ALL"]} and not csec["allowPrivilegeEscalation"]
    assert sec["runAsNonRoot"] and sec["runAsUser"] != 0
    return {
        "command": c["command"],
        "environment": env,
        # docker adds the hostname to /etc/hosts: the rendezvous host resolves, as the
        # operator's per-pod Service makes it resolve in the cluster.
        "hostname": env["DDPDEPLOY_RDZV_HOST"],
        "user": f"{sec['runAsUser']}:{sec['runAsGroup']}",
        "group_add": [str(sec["fsGroup"])],
        "read_only": csec["readOnlyRootFilesystem"],
        "tmpfs": tmpfs,
        "shm_size": shm,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "volumes": binds,
    }


def run(engine: Any, image: str, timeout: int = 300, **kwargs: Any) -> tuple[int, str]:
    container = engine.containers.create(image, **kwargs)
    try:
        container.start()
        code = container.wait(timeout=timeout)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def checkpoint_files(engine: Any, image: str, volume: str) -> list[str]:
    code, logs = run(
        engine,
        image,
        command=["sh", "-c", "stat -c '%u:%g %a' /v && ls -A /v"],
        user="0",
        volumes={volume: {"bind": "/v", "mode": "ro"}},
    )
    assert code == 0, logs
    return logs.split()


def test_root_owned_volume_refuses_the_first_checkpoint_without_fs_group(
    engine: Any, image: str, volume: str
) -> None:
    pod, env = pod_of(image)
    code, logs = run(engine, image, **docker_args(pod, env, volume))
    assert code != 0, logs[-3000:]
    # The first checkpoint write is what fails, as on a cluster without fsGroup.
    assert "checkpoint write failed: [Errno 13] Permission denied: '/checkpoints/" in logs, logs
    assert checkpoint_files(engine, image, volume) == ["0:0", "755"]


def test_writes_outside_the_emptydirs_fail(engine: Any, image: str, volume: str) -> None:
    """The read-only root is real: only the emptyDirs (and the volume) take writes."""
    pod, env = pod_of(image)
    args = docker_args(pod, env, volume)
    args["command"] = [
        "sh",
        "-c",
        "touch /tmp/a \"$HOME/a\" && python3 -c 'import tempfile; tempfile.mkstemp()' && "
        "! touch /workspace/x 2>/dev/null && ! touch /etc/x 2>/dev/null && echo ok",
    ]
    code, logs = run(engine, image, **args)
    assert code == 0 and logs.strip().endswith("ok"), logs


def test_hardened_pod_translates_its_volumes() -> None:
    """The translation above covers every volume the pod renders (no silent skip)."""
    pod, env = pod_of("t:v1")
    args = docker_args(pod, env, "vol")
    assert args["shm_size"] == "256m" and args["volumes"] == {
        "vol": {"bind": "/checkpoints", "mode": "rw"}
    }
