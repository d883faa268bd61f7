"""The pod every Kubernetes target runs (container, volumes, scheduling) and the objects
beside it (the checkpoint PVC). Pure: spec and launch contract in, plain dicts out.

Targets (ddpdeploy.targets) wrap ``pod_template`` in their own layout; what a pod looks like
is decided here once, so every target gets the same pod.
"""

from __future__ import annotations

from typing import Any

from ddpdeploy.contract import CONTAINER_NAME, PORT_NAME, LaunchContract
from ddpdeploy.errors import UserError
from ddpdeploy.spec import JobSpec

Obj = dict[str, Any]

MANAGED_BY = "ddpdeploy"
SHM_VOLUME = "dshm"
CHECKPOINT_VOLUME = "checkpoints"


def labels(spec: JobSpec) -> dict[str, str]:
    return {
        **spec.labels,
        "app.kubernetes.io/name": spec.name,
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def checkpoint_claim_name(spec: JobSpec) -> str | None:
    ckpt = spec.checkpoint
    if ckpt is None:
        return None
    return ckpt.claim_name or f"{spec.name}-checkpoints"


def metadata(spec: JobSpec, name: str) -> Obj:
    meta: Obj = {"name": name, "namespace": spec.namespace, "labels": labels(spec)}
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return meta


def resources(spec: JobSpec) -> Obj:
    requests: Obj = {}
    limits: Obj = {}
    if spec.cpu:
        requests["cpu"] = spec.cpu  # no CPU limit: throttling stalls collectives
    if spec.memory:
        requests["memory"] = limits["memory"] = spec.memory
    if spec.gpus:
        limits["nvidia.com/gpu"] = spec.gpus
    out: Obj = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def env_list(contract: LaunchContract) -> list[Obj]:
    env: dict[str, Obj] = {k: {"name": k, "value": v} for k, v in contract.pod_env().items()}
    for name, path in contract.field_env.items():
        env[name] = {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
    return [env[k] for k in sorted(env)]


def container(spec: JobSpec, contract: LaunchContract) -> Obj:
    out: Obj = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": contract.container_command(),
        "env": env_list(contract),
        "ports": [{"name": PORT_NAME, "containerPort": contract.port, "protocol": "TCP"}],
    }
    res = resources(spec)
    if res:
        out["resources"] = res
    mounts = []
    if spec.shm_size:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    if spec.checkpoint:
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path})
    if mounts:
        out["volumeMounts"] = mounts
    return out


def pod_template(spec: JobSpec, contract: LaunchContract) -> Obj:
    pod: Obj = {
        "containers": [container(spec, contract)],
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
    }
    volumes = []
    if spec.shm_size:
        volumes.append(
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}
        )
    claim = checkpoint_claim_name(spec)
    if claim:
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    if volumes:
        pod["volumes"] = volumes
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations
        ]
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    if spec.priority_class:
        pod["priorityClassName"] = spec.priority_class
    annotations = {
        **spec.annotations,
        # An injected sidecar never exits, so the pod (and the job) would never complete.
        "sidecar.istio.io/inject": "false",
    }
    return {"metadata": {"labels": labels(spec), "annotations": annotations}, "spec": pod}


def checkpoint_pvc(spec: JobSpec) -> Obj | None:
    """A new PVC for checkpoints, when the spec asks for one (size set)."""
    ckpt = spec.checkpoint
    if ckpt is None or not ckpt.size:
        return None
    pvc_spec: Obj = {
        "accessModes": [ckpt.access_mode],
        "resources": {"requests": {"storage": ckpt.size}},
    }
    if ckpt.storage_class:
        pvc_spec["storageClassName"] = ckpt.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(spec, checkpoint_claim_name(spec) or ""),
        "spec": pvc_spec,
    }


def require_image(spec: JobSpec) -> str:
    if not spec.image:
        raise UserError(
            "image: required to render manifests; set image in ddpdeploy.yaml or pass --image "
            "(ddpdeploy build prints one)"
        )
    return spec.image
