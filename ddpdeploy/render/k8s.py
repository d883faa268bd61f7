"""JobSpec -> Kubernetes objects (plain dicts): Kubeflow PyTorchJob v1 and its PVC.

Pure: no network, no clock, no randomness; same spec, same objects. The container command
and env come from the launch contract; the operator injects the per-pod rendezvous env.
"""

from __future__ import annotations

from typing import Any

from ddpdeploy.contract import CONTAINER_NAME, PORT_NAME, LaunchContract, launch_contract
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


def _metadata(spec: JobSpec, name: str) -> Obj:
    meta: Obj = {"name": name, "namespace": spec.namespace, "labels": labels(spec)}
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return meta


def _resources(spec: JobSpec) -> Obj:
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


def _env(contract: LaunchContract) -> list[Obj]:
    env: dict[str, Obj] = {k: {"name": k, "value": v} for k, v in contract.base_env.items()}
    for name in contract.own_address_env:
        env[name] = {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    return [env[k] for k in sorted(env)]


def _container(spec: JobSpec, contract: LaunchContract) -> Obj:
    container: Obj = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": contract.container_command(),
        "env": _env(contract),
        "ports": [{"name": PORT_NAME, "containerPort": contract.port, "protocol": "TCP"}],
    }
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    mounts = []
    if spec.shm_size:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    if spec.checkpoint:
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path})
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _pod_template(spec: JobSpec, contract: LaunchContract) -> Obj:
    pod: Obj = {
        "containers": [_container(spec, contract)],
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


def pytorchjob(spec: JobSpec, contract: LaunchContract | None = None) -> Obj:
    """The kubeflow.org/v1 PyTorchJob for ``spec``."""
    if not spec.image:
        raise UserError(
            "image: required to render manifests; set image in ddpdeploy.yaml or pass --image "
            "(ddpdeploy build prints one)"
        )
    contract = contract or launch_contract(spec)
    template = _pod_template(spec, contract)
    replica_specs = {
        replica: {"replicas": count, "restartPolicy": "OnFailure", "template": template}
        for replica, count in contract.replicas.items()
    }
    job_spec: Obj = {"nprocPerNode": str(contract.nproc_per_node)}
    rdzv = spec.rendezvous
    if spec.elastic:
        elastic: Obj = {
            "rdzvBackend": "c10d",
            "rdzvPort": contract.port,
            "rdzvId": spec.name,
            "minReplicas": rdzv.min_nodes,
            "maxReplicas": rdzv.max_nodes,
            "rdzvConf": [{"key": k, "value": v} for k, v in contract.rdzv_conf_items().items()],
        }
        if rdzv.max_restarts is not None:
            elastic["maxRestarts"] = rdzv.max_restarts
        job_spec["elasticPolicy"] = elastic
    run_policy = spec.run_policy.model_dump(by_alias=True, exclude_none=True)
    if run_policy:
        job_spec["runPolicy"] = run_policy
    job_spec["pytorchReplicaSpecs"] = replica_specs
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(spec, spec.name),
        "spec": job_spec,
    }


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
        "metadata": _metadata(spec, checkpoint_claim_name(spec) or ""),
        "spec": pvc_spec,
    }


def render_objects(spec: JobSpec) -> list[Obj]:
    """Every object the job needs, dependencies (the PVC) first."""
    contract = launch_contract(spec)
    objects = [checkpoint_pvc(spec), pytorchjob(spec, contract)]
    return [o for o in objects if o is not None]
