"""The pod every Kubernetes target runs (container, volumes, scheduling) and the objects
beside it (the checkpoint PVC). Pure: spec and launch contract in, plain dicts out.

Targets (ddpdeploy.targets) wrap ``pod_template`` in their own layout; what a pod looks like
is decided here once, so every target gets the same pod.
"""

from __future__ import annotations

from typing import Any

from ddpdeploy.contract import CONTAINER_NAME, PORT_NAME, LaunchContract
from ddpdeploy.errors import UserError
from ddpdeploy.obj import Obj
from ddpdeploy.spec import (
    HOME_DIR,
    INSTANCE_LABEL,
    ISTIO_INJECT_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    LOG_DIR,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    NCCL_FIELDS,
    TMP_DIR,
    JobSpec,
)

MANAGED_BY = "ddpdeploy"
SHM_VOLUME = "dshm"
CHECKPOINT_VOLUME = "checkpoints"
TMP_VOLUME = "tmp"
LOG_VOLUME = "torchrun-logs"
HOME_VOLUME = "home"
__all__ = ["KUEUE_QUEUE_LABEL"]  # its home is the spec's (a key a spec may not set)


def labels(spec: JobSpec) -> dict[str, str]:
    return {
        **spec.labels,
        NAME_LABEL: spec.name,
        INSTANCE_LABEL: spec.name,
        MANAGED_BY_LABEL: MANAGED_BY,
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


def selector_labels(spec: JobSpec) -> dict[str, str]:
    """The labels that pick out this job's pods (NetworkPolicy, PodGroup, Services)."""
    return {INSTANCE_LABEL: spec.name, MANAGED_BY_LABEL: MANAGED_BY}


def workload_metadata(spec: JobSpec, name: str) -> Obj:
    """Metadata of the object that owns the pods (the job), with its Kueue queue label.

    On the job only: a queue label on pods would make Kueue's pod integration queue each
    pod on its own."""
    meta = metadata(spec, name)
    if spec.queued:
        meta["labels"][KUEUE_QUEUE_LABEL] = spec.scheduling.queue
    return meta


def resources(spec: JobSpec) -> Obj:
    # CPU is requested, never limited: CFS throttling stalls a rank, and every collective
    # waits for the slowest rank. Memory is limited (an OOM kill beats a node under
    # pressure); devices are requested = limited, as extended resources must be.
    requests: Obj = {"cpu": spec.cpu_request, "memory": spec.memory_request}
    limits: Obj = {"memory": spec.memory_request}
    devices: Obj = {}
    if spec.gpus:
        devices["nvidia.com/gpu"] = spec.gpus
    if spec.network.rdma:
        devices[spec.network.rdma.resource] = spec.network.rdma.count
    return {"requests": {**requests, **devices}, "limits": {**limits, **devices}}


def hardening_env(spec: JobSpec) -> dict[str, str]:
    """Where temp files and caches go under a read-only root (user env wins)."""
    if not spec.security.read_only_root_filesystem:
        return {}
    return {
        "TMPDIR": TMP_DIR,
        "HOME": HOME_DIR,
        "XDG_CACHE_HOME": f"{HOME_DIR}/.cache",  # torch hub, Hugging Face, pip
        # Both default to paths derived from the user name, which an image without a
        # passwd entry for the UID cannot resolve.
        "TORCHINDUCTOR_CACHE_DIR": f"{TMP_DIR}/torchinductor",
        "TRITON_CACHE_DIR": f"{HOME_DIR}/.triton/cache",
    }


def nccl_env(spec: JobSpec) -> dict[str, str]:
    """The network fields' NCCL variables; NCCL_DEBUG=WARN on GPU jobs unless env sets it."""
    net = spec.network
    out = {var: getattr(net, field) for field, var in NCCL_FIELDS.items()}
    if out["NCCL_DEBUG"] is None and spec.gpus and "NCCL_DEBUG" not in spec.env:
        out["NCCL_DEBUG"] = "WARN"  # warnings such as a fall-back from RDMA to TCP
    return {k: v for k, v in out.items() if v is not None}


def pod_only_env(spec: JobSpec) -> dict[str, str]:
    """Env of the pod's own (its file system and network), not of the launch: targets that
    run outside a pod (local processes) do without it. PET_LOG_DIR: torchrun's tee files go
    to the pod's bounded log volume."""
    return {**hardening_env(spec), **nccl_env(spec), "PET_LOG_DIR": LOG_DIR}


def env_list(contract: LaunchContract) -> list[Obj]:
    spec = contract.spec
    values = {**pod_only_env(spec), **contract.pod_env()}
    env: dict[str, Obj] = {k: {"name": k, "value": v} for k, v in values.items()}
    for name, path in contract.field_env.items():
        env[name] = {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
    for name, ref in spec.secret_env.items():
        # By reference only: the secret's value never appears in rendered output.
        key_ref = {"name": ref.secret, "key": ref.key}
        env[name] = {"name": name, "valueFrom": {"secretKeyRef": key_ref}}
    return [env[k] for k in sorted(env)]


def container_security(spec: JobSpec) -> Obj:
    caps: Obj = {"drop": ["ALL"]}
    if spec.network.rdma:
        caps["add"] = ["IPC_LOCK"]  # RDMA pins (locks) memory for the adapter
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": caps,
        "privileged": False,
        "readOnlyRootFilesystem": spec.security.read_only_root_filesystem,
        "runAsNonRoot": True,
    }


def pod_security(spec: JobSpec) -> Obj:
    sec = spec.security
    return {
        # A new PVC is usually root's; the kubelet hands it to this group (setgid, g+rw)
        # once, and again only when the volume root's group differs.
        "fsGroup": sec.fs_group,
        "fsGroupChangePolicy": "OnRootMismatch",
        "runAsGroup": sec.run_as_group,
        "runAsNonRoot": True,
        "runAsUser": sec.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _mounts_and_volumes(spec: JobSpec) -> tuple[list[Obj], list[Obj]]:
    mounts: list[Obj] = []
    volumes: list[Obj] = []
    if spec.shm_size:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
        volumes.append(
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}
        )
    if spec.security.read_only_root_filesystem:
        for name, path in ((TMP_VOLUME, TMP_DIR), (HOME_VOLUME, HOME_DIR)):
            mounts.append({"name": name, "mountPath": path})
            volumes.append({"name": name, "emptyDir": {}})
    # torchrun's copies of the workers' output, bounded: past sizeLimit the pod is evicted
    # rather than the node's disk filled (and every pod on it evicted).
    mounts.append({"name": LOG_VOLUME, "mountPath": LOG_DIR})
    volumes.append(
        {"name": LOG_VOLUME, "emptyDir": {"sizeLimit": spec.log_size} if spec.log_size else {}}
    )
    claim = checkpoint_claim_name(spec)
    if spec.checkpoint and claim:
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path})
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    return mounts, volumes


def container(spec: JobSpec, contract: LaunchContract) -> Obj:
    out: Obj = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": contract.container_command(),
        "env": env_list(contract),
        "ports": [{"name": PORT_NAME, "containerPort": contract.port, "protocol": "TCP"}],
        "resources": resources(spec),
        "securityContext": container_security(spec),
        # A container that fails keeps its log's last 2 KB in its status (lastState), so
        # `up --wait` and `status` can name the failed rank's own last line.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    mounts, _ = _mounts_and_volumes(spec)
    if mounts:
        out["volumeMounts"] = mounts
    return out


def pod_template(spec: JobSpec, contract: LaunchContract) -> Obj:
    pod: Obj = {
        "automountServiceAccountToken": spec.security.automount_service_account_token,
        "containers": [container(spec, contract)],
        # Service links add an env var per Service in the namespace: noise at best, and a
        # name clash with the launch env at worst.
        "enableServiceLinks": False,
        "securityContext": pod_security(spec),
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
    }
    _, volumes = _mounts_and_volumes(spec)
    if volumes:
        pod["volumes"] = volumes
    pod |= placement(spec)
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    if spec.priority_class:
        pod["priorityClassName"] = spec.priority_class
    if spec.scheduling.scheduler == "volcano":
        pod["schedulerName"] = "volcano"
    if spec.network.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"  # else cluster DNS names do not resolve
    annotations = {
        **spec.annotations,
        # An injected sidecar never exits, so the pod (and the job) would never complete.
        ISTIO_INJECT_ANNOTATION: "false",
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


def placement(spec: JobSpec) -> dict[str, Any]:
    """Where a pod of the job may run and how it pulls: the job's pods and its readers."""
    out: dict[str, Any] = {}
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations
        ]
    return out
