"""The JobSpec model: its sub-models, their cross-field rules and the target rules it
checks (rules.TARGET_RULES: the spec knows no target's code), and its JSON Schema."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from ddpdeploy.image_layout import TRAINER_DIR_IN_IMAGE, WORKSPACE_IN_IMAGE
from ddpdeploy.rules import (
    DEFAULT_PORT,
    DEFAULT_RUNTIME,
    DEFAULT_TARGET,
    MAX_DNS_LABEL,
    TARGET_NAMES,
    TARGET_RULES,
)
from ddpdeploy.spec.fields import (
    INT64_MAX,
    LOG_DIR,
    MODULE,
    SHM_PATH,
    SYSTEM_DIRS,
    WRITABLE_DIRS,
    AnnotationMap,
    ArgStr,
    ByteQuantity,
    Count,
    CpuQuantity,
    DnsName,
    EnvMap,
    GpuCount,
    Hcas,
    IfNames,
    ImageRef,
    Int32,
    LabelMap,
    Namespace,
    NodeCount,
    Number,
    ProcCount,
    Subdomain,
    check_env,
    extended_resource,
    json_pattern,
    label_value,
    mount_path,
    no_expansion,
    qualified_name,
    quantity,
    script_path,
    secret_key,
)
from ddpdeploy.text import show


def _elastic_target() -> str:
    return next(t.name for t in TARGET_RULES.values() if t.no_elastic is None)


class Model(BaseModel):
    """camelCase keys in files (only), snake_case in Python; unknown keys are errors."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, extra="forbid", frozen=True
    )


class Command(Model):
    """What torchrun starts on every node. Neither script nor module: the built-in trainer."""

    script: str | None = Field(
        default=None,
        min_length=1,
        description="A Python script in your workspace, run by torchrun (e.g. train.py).",
    )
    module: str | None = Field(
        default=None,
        description="A Python module run by torchrun -m (e.g. mypkg.train).",
        json_schema_extra=json_pattern(MODULE),
    )
    args: list[ArgStr] = Field(
        default_factory=list,
        description="Arguments passed to the script, module or built-in trainer, as written; "
        "`ddpdeploy render -- ARGS` appends more.",
    )

    @field_validator("script")
    @classmethod
    def _in_the_workspace(cls, value: str | None) -> str | None:
        return None if value is None else script_path(value)

    @model_validator(mode="after")
    def _one_entry(self) -> Command:
        if self.script is not None and self.module is not None:
            raise ValueError("set either script or module, not both")
        if self.script is not None:
            no_expansion(self.script)
        if self.module is not None and not re.fullmatch(MODULE, self.module):
            raise ValueError(f"module {show(self.module)} is not a dotted Python module name")
        return self

    @property
    def builtin(self) -> bool:
        return not (self.script or self.module)


class Rendezvous(Model):
    """c10d (the default): a fixed node count through torchrun's c10d rendezvous, restarts
    safe for any script. static: a fixed node count, rank 0 on master-0, restarts safe only
    for scripts that handle them (ddpkit.init_process_group). elastic: c10d between
    minNodes and maxNodes."""

    mode: Literal["c10d", "static", "elastic"] = Field(
        default="c10d",
        description="c10d: a fixed node count through torchrun's c10d rendezvous; a restarted "
        "worker group rejoins with a fresh store, so any script survives a restart (global "
        "rank 0 may land on any node). static: a fixed node count, rank 0 on master-0; after "
        "a restart a plain init_process_group can fail or hang (ddpkit.init_process_group "
        "handles it). elastic: c10d between minNodes and maxNodes (--elastic MIN:MAX).",
    )
    min_nodes: NodeCount | None = Field(default=None, description="Elastic only: fewest nodes.")
    max_nodes: NodeCount | None = Field(default=None, description="Elastic only: most nodes.")
    max_restarts: Int32 | None = Field(
        default=None,
        description="c10d and elastic: torchrun restarts of the worker group (static jobs "
        "restart through runPolicy.backoffLimit).",
    )
    port: int = Field(
        default=DEFAULT_PORT, strict=True, ge=1, le=65535, description="Rendezvous TCP port."
    )
    join_timeout: Count = Field(
        default=900,
        description="Seconds agents wait for all peers (and their DNS) before giving up.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Rendezvous:
        if self.mode != "elastic" and (self.min_nodes is not None or self.max_nodes is not None):
            raise ValueError(
                "minNodes/maxNodes need mode: elastic (a c10d or static job has `nodes`)"
            )
        if self.mode == "static" and self.max_restarts is not None:
            raise ValueError(
                "maxRestarts needs c10d rendezvous (mode: c10d or elastic); static jobs "
                "restart through runPolicy.backoffLimit"
            )
        if self.mode == "elastic":
            if self.min_nodes is None or self.max_nodes is None:
                raise ValueError(
                    "elastic rendezvous needs minNodes and maxNodes (--elastic MIN:MAX)"
                )
            if self.min_nodes > self.max_nodes:
                raise ValueError(
                    f"minNodes ({self.min_nodes}) must not exceed maxNodes ({self.max_nodes})"
                )
        return self


class Checkpoint(Model):
    """Where checkpoints live: an existing PVC (claimName) or a new one (size)."""

    claim_name: Subdomain | None = Field(
        default=None, description="An existing PersistentVolumeClaim to mount."
    )
    size: ByteQuantity | None = Field(
        default=None, description="Size of a new PVC named <name>-checkpoints, e.g. 100Gi."
    )
    storage_class: Subdomain | None = Field(
        default=None, description="Storage class of the new PVC (with size)."
    )
    # Several pods mount it: under c10d global rank 0 can land on any of them.
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = Field(
        default="ReadWriteMany",
        description="Access mode of the new PVC; every pod mounts it, so ReadWriteMany.",
    )
    mount_path: str = Field(
        default="/checkpoints", description="Where the volume is mounted in every pod."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Checkpoint:
        if bool(self.claim_name) == bool(self.size):
            raise ValueError(
                "set claimName (an existing PVC) or size (a new PVC), exactly one of them"
            )
        if self.storage_class and not self.size:
            raise ValueError("storageClass applies only to a new PVC (set size)")
        mount_path(self.mount_path)
        return self


class Toleration(Model):
    """A Kubernetes toleration, as in a pod spec."""

    key: str | None = Field(default=None, description="Taint key (empty: every taint).")
    operator: Literal["Exists", "Equal"] = Field(
        default="Equal", description="Equal: key and value match. Exists: any value."
    )
    value: str | None = Field(default=None, description="Taint value (operator Equal only).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate (empty: all)."
    )
    toleration_seconds: int | None = Field(
        default=None,
        strict=True,
        ge=-(2**63),
        le=INT64_MAX,
        description="NoExecute only: seconds the pod stays bound after the taint appears.",
    )

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        # The apiserver's own toleration checks, so a render is never refused there.
        if self.key:
            qualified_name(self.key, "toleration key", "nvidia.com/gpu")
        elif self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator: Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value; remove value or use Equal")
        if self.operator == "Equal":
            label_value(self.value or "", "toleration value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies only to effect: NoExecute")
        return self


class RunPolicy(Model):
    """The PyTorchJob's runPolicy."""

    backoff_limit: Int32 | None = Field(
        default=None, description="Retries of a failed job before it is marked failed."
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        strict=True,
        ge=1,
        le=INT64_MAX,
        description="Seconds the job may run before it is stopped.",
    )
    ttl_seconds_after_finished: Int32 | None = Field(
        default=None, description="Seconds after completion before the job is deleted."
    )
    clean_pod_policy: Literal["None", "Running", "All"] | None = Field(
        default=None, description="Which pods are deleted when the job ends."
    )


_NCCL_DEBUG = Literal["VERSION", "WARN", "INFO", "TRACE"]
IMAGE_UID = 10001  # the user docker/Dockerfile creates (USER_UID): uid and gid
NCCL_FIELDS = {  # Network field -> the NCCL env var it sets
    "nccl_debug": "NCCL_DEBUG",
    "nccl_socket_ifname": "NCCL_SOCKET_IFNAME",
    "nccl_ib_hca": "NCCL_IB_HCA",
}


class SecretRef(Model):
    """One key of a Kubernetes Secret, passed as an env var by reference (secretKeyRef)."""

    secret: Subdomain = Field(description="Name of the Secret in the job's namespace.")
    key: Annotated[str, AfterValidator(secret_key)] = Field(
        description="Key inside the Secret whose value becomes the env var."
    )


# The API server's range for UIDs and GIDs (IsValidUserID/IsValidGroupID): larger ones are
# refused at apply, and no Linux ID is larger than 32 bits.
MAX_ID = 2**31 - 1


class Security(Model):
    """The pods' security settings: hardened by default, each loosened by name."""

    run_as_user: int = Field(
        default=IMAGE_UID,
        strict=True,
        ge=1,
        le=MAX_ID,
        description="UID the container runs as (runAsNonRoot); the built image's user is 10001.",
    )
    run_as_group: int = Field(
        default=IMAGE_UID, strict=True, ge=0, le=MAX_ID, description="Primary GID."
    )
    fs_group: int = Field(
        default=IMAGE_UID,
        strict=True,
        ge=0,
        le=MAX_ID,
        description="Group that owns the volumes (fsGroup): a new checkpoint PVC is root's "
        "until Kubernetes hands it to this group, and the trainer's first checkpoint would fail.",
    )
    read_only_root_filesystem: bool = Field(
        default=True,
        description="Read-only image file system, with emptyDirs for /tmp and HOME (caches); "
        "false (--writable-rootfs) for code that writes into the image.",
    )
    automount_service_account_token: bool = Field(
        default=False,
        description="Mount the service account's API token into the pods (only for code "
        "that calls the Kubernetes API).",
    )


class Scheduling(Model):
    """Gang scheduling and queueing."""

    scheduler: Literal["default", "volcano"] = Field(
        default="default",
        description="volcano: schedulerName volcano and a gang of all nodes (minAvailable), "
        "so no pod runs until every pod can (--scheduler).",
    )
    queue: Namespace | None = Field(
        default=None,
        description="default scheduler: the Kueue LocalQueue (label kueue.x-k8s.io/queue-name; "
        "the job starts suspended until Kueue admits it). volcano: the Volcano queue (--queue).",
    )


class Rdma(Model):
    """An RDMA device plugin's resource, requested per node."""

    resource: Annotated[str, AfterValidator(extended_resource)] = Field(
        description="The device plugin's resource name, e.g. rdma/hca_shared_devices_a."
    )
    count: Count = Field(default=1, description="Devices per node (requests = limits).")


class Network(Model):
    """The job's network: NetworkPolicy, host network, RDMA and NCCL settings."""

    policy: bool = Field(
        default=True,
        description="A NetworkPolicy admitting ingress to the job's pods only from its own "
        "pods (torchrun's store and NCCL/gloo take unauthenticated connections); false "
        "(--no-network-policy) on clusters without a policy engine.",
    )
    host_network: bool = Field(
        default=False,
        description="Pods use the node's network namespace (--host-network), with dnsPolicy "
        "ClusterFirstWithHostNet; NetworkPolicies do not apply to such pods.",
    )
    rdma: Rdma | None = Field(
        default=None,
        description="RDMA devices per node (--rdma RESOURCE=N); adds the IPC_LOCK capability "
        "NCCL needs to pin memory.",
    )
    nccl_debug: _NCCL_DEBUG | None = Field(
        default=None,
        description="NCCL_DEBUG (--nccl-debug); default WARN on GPU jobs. INFO shows the "
        "transport NCCL chose (e.g. a silent fall-back from RDMA to TCP).",
    )
    nccl_socket_ifname: IfNames | None = Field(
        default=None,
        min_length=1,
        description="NCCL_SOCKET_IFNAME: interfaces for NCCL's TCP traffic, e.g. eth0 or ^lo,"
        "docker (default: NCCL chooses).",
    )
    nccl_ib_hca: Hcas | None = Field(
        default=None,
        min_length=1,
        description="NCCL_IB_HCA: InfiniBand/RoCE adapters to use, e.g. mlx5_0,mlx5_1 "
        "(default: NCCL chooses).",
    )


class Diagnostics(Model):
    """ddpkit's diagnostics for scripts that use it (the built-in trainer does): the
    start-up probe, the per-rank timing event and the hang watchdog. Unset: ddpkit's
    defaults, and no env is added."""

    probe: bool = Field(
        default=True,
        description="Run the collective probe once the process group is up (busbw, the "
        "transport NCCL chose); false (--no-probe) skips it.",
    )
    probe_min_busbw: Number | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="The probe's floor in GB/s (--probe-min-busbw): below it the run stops "
        "before step 1 with one line (exit 3). Default: no floor.",
    )
    hang_timeout_seconds: Number | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Seconds without a finished step before the watchdog dumps every rank's "
        "stack and ends the run (--hang-timeout); 0 turns the watchdog off. Default: "
        "max(60, 5x the slowest step), at most 30 min.",
    )
    ranks_every: Count | None = Field(
        default=None,
        description="Steps between two `ranks` events, per-rank work times (--ranks-every). "
        "Default: after 50 steps, then about every 10 s (at least 50 steps apart).",
    )
    straggler_factor: Number | None = Field(
        default=None,
        gt=1,
        allow_inf_nan=False,
        description="A rank whose work time exceeds the median's by this factor is named a "
        "straggler (--straggler-factor, > 1). Default: 1.2.",
    )


# What a checkpoint volume mounted there would hide: the user's code (the working directory)
# and ddpkit with the built-in trainer.
IMAGE_CODE_DIRS = (WORKSPACE_IN_IMAGE, TRAINER_DIR_IN_IMAGE)


def _at_or_above(mount: str, path: str) -> bool:
    mount = posixpath.normpath(mount)
    return path == mount or path.startswith(mount.rstrip("/") + "/")


class JobSpec(Model):
    """One training job: what runs, on how many nodes, with what resources."""

    model_config = ConfigDict(title="ddpdeploy.yaml")

    name: DnsName = Field(
        default="ddp-train",
        description="Job name (DNS-1035 label); pods are named after it (pytorchjob: "
        "<name>-master-0, <name>-worker-<i>; trainjob: <name>-node-0-<i>; indexed-job: "
        "<name>-<i>).",
    )
    target: Literal[TARGET_NAMES] = Field(  # type: ignore[valid-type]
        default=DEFAULT_TARGET,
        description="What runs the job on Kubernetes: pytorchjob (Kubeflow training operator "
        "v1), trainjob (Kubeflow Trainer v2), indexed-job (a plain Indexed Job and a headless "
        "Service; no operator).",
    )
    runtime: Subdomain = Field(
        default=DEFAULT_RUNTIME,
        description="trainjob only: the ClusterTrainingRuntime the TrainJob references.",
    )
    namespace: Namespace = Field(default="default", description="Kubernetes namespace.")
    image: ImageRef | None = Field(
        default=None,
        description="Training image, [registry[:port]/]repo[:tag][@sha256:…]; "
        "`ddpdeploy build` prints one.",
    )
    nodes: NodeCount = Field(default=1, description="Number of nodes (pods).")
    gpus: GpuCount = Field(default=0, description="GPUs per node; 0 is a CPU job.")
    procs: ProcCount | None = Field(
        default=None, description="Processes per node (default: gpus, or 1 on CPU)."
    )
    cpu: CpuQuantity | None = Field(
        default=None,
        description="CPU request per node, a Kubernetes quantity (e.g. 8, 500m); default one "
        "per process. No CPU limit: CFS throttling stalls collectives. When given, each "
        "process gets its share as OMP_NUM_THREADS (at least 1; env overrides it).",
    )
    memory: ByteQuantity | None = Field(
        default=None,
        description="Memory per node (request and limit), e.g. 64Gi; default 4Gi per process.",
    )
    command: Command = Field(
        default_factory=Command,
        description="What torchrun runs; neither script nor module: the built-in trainer.",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        default="auto", description="auto: nccl on GPUs, gloo on CPU."
    )
    rendezvous: Rendezvous = Field(
        default_factory=Rendezvous, description="How the nodes find each other."
    )
    checkpoint: Checkpoint | None = Field(
        default=None, description="A volume every pod mounts for checkpoints."
    )
    # /dev/shm is 64 MB in pods; DataLoader workers and NCCL need more. null: no mount.
    shm_size: ByteQuantity | None = Field(
        default="2Gi", description="/dev/shm size (a memory emptyDir); null: no mount (64 MB)."
    )
    # torchrun tees each worker's output to the console through files it never trims: a
    # chatty job of days would fill the node's disk through an unbounded emptyDir.
    log_size: ByteQuantity | None = Field(
        default="4Gi",
        description=f"Size limit of the emptyDir at {LOG_DIR} where torchrun keeps the "
        "copy of every worker's output it tees to the log (PET_LOG_DIR); past it the kubelet "
        "evicts the pod. null: no limit.",
    )
    # On pod deletion torchrun forwards SIGTERM and gives workers 30 s before SIGKILL; the
    # trainer needs a step plus a checkpoint write on top, and Kubernetes' default is 30 s.
    termination_grace_period_seconds: int = Field(
        default=120,
        strict=True,
        ge=0,
        le=INT64_MAX,
        description="Seconds between SIGTERM and SIGKILL: time to write a checkpoint.",
    )
    env: EnvMap = Field(
        default_factory=dict,
        description="Extra environment for every process (not the launch contract's own).",
    )
    image_pull_secrets: list[Subdomain] = Field(
        default_factory=list, description="Secrets for pulling the image."
    )
    node_selector: LabelMap = Field(
        default_factory=dict, description="Node labels the pods must land on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the pods tolerate."
    )
    service_account: Subdomain | None = Field(default=None, description="Pod service account.")
    priority_class: Subdomain | None = Field(default=None, description="Pod priority class name.")
    labels: LabelMap = Field(
        default_factory=dict, description="Labels on the job, its pods and its PVC."
    )
    annotations: AnnotationMap = Field(
        default_factory=dict, description="Annotations on the job, its pods and its PVC."
    )
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy,
        description="The PyTorchJob's runPolicy: retries, deadline, cleanup after the job.",
    )
    secret_env: dict[str, SecretRef] = Field(
        default_factory=dict,
        description="Env vars read from Secrets by reference (secretKeyRef), e.g. "
        "{HF_TOKEN: {secret: hf, key: token}}; the value never appears in the output.",
    )
    security: Security = Field(
        default_factory=Security,
        description="Pod security: non-root UID, fsGroup, read-only root, no API token.",
    )
    scheduling: Scheduling = Field(
        default_factory=Scheduling, description="Gang scheduling (Volcano) and Kueue queues."
    )
    network: Network = Field(
        default_factory=Network,
        description="NetworkPolicy, host network, RDMA devices and NCCL settings.",
    )
    diagnostics: Diagnostics = Field(
        default_factory=Diagnostics,
        description="ddpkit's start-up probe, per-rank timing and hang watchdog settings.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.procs is not None and self.gpus and self.procs != self.gpus:
            raise ValueError(
                f"procs ({self.procs}) must equal gpus ({self.gpus}): DDP runs one process per GPU"
            )
        if self.backend == "nccl" and self.gpus == 0:
            raise ValueError("backend nccl needs GPUs: set gpus >= 1, or use backend gloo/auto")
        rdzv = self.rendezvous
        if rdzv.mode == "elastic":
            assert rdzv.min_nodes is not None and rdzv.max_nodes is not None
            if not rdzv.min_nodes <= self.nodes <= rdzv.max_nodes:
                raise ValueError(
                    f"nodes ({self.nodes}) must lie within the elastic range "
                    f"{rdzv.min_nodes}:{rdzv.max_nodes}"
                )
        ckpt = self.checkpoint
        if ckpt and self.shm_size and posixpath.normpath(ckpt.mount_path) == SHM_PATH:
            raise ValueError(
                f"checkpoint.mountPath {SHM_PATH} is where shmSize mounts; use another path"
            )
        self._check_env_sources()
        if ckpt and posixpath.normpath(ckpt.mount_path) == LOG_DIR:
            raise ValueError(
                f"checkpoint.mountPath {LOG_DIR} is where torchrun's log volume mounts; use "
                "another path"
            )
        for code in IMAGE_CODE_DIRS:
            if ckpt and _at_or_above(ckpt.mount_path, code):
                raise ValueError(
                    f"checkpoint.mountPath {ckpt.mount_path} would hide {code}, where the "
                    "image keeps the code it runs; use another path, e.g. /checkpoints"
                )
        for needed in SYSTEM_DIRS:
            if ckpt and _at_or_above(ckpt.mount_path, needed):
                raise ValueError(
                    f"checkpoint.mountPath {ckpt.mount_path} would hide {needed}, which the "
                    "container needs to start (its shell, Python and libraries); use another "
                    "path, e.g. /checkpoints"
                )
        if ckpt and self.security.read_only_root_filesystem:
            taken = [p for p in WRITABLE_DIRS if posixpath.normpath(ckpt.mount_path) == p]
            if taken:
                raise ValueError(
                    f"checkpoint.mountPath {taken[0]} is where the read-only root's writable "
                    "emptyDir mounts; use another path"
                )
        self._check_target()
        return self

    def _check_target(self) -> None:
        """Refuse what the target cannot run (rules.TARGET_RULES), the name rule first.

        By value, not by "was it set": a dumped spec (e.g. one saved on the cluster) holds
        every field and must validate again."""
        rules = TARGET_RULES[self.target]
        if self.runtime != DEFAULT_RUNTIME and not rules.takes_runtime:
            takers = " or ".join(t.name for t in TARGET_RULES.values() if t.takes_runtime)
            raise ValueError(f"runtime applies only to target {takers} (--target {takers})")
        last = (self.max_nodes if rules.index_of == "max_nodes" else self.nodes) - 1
        longest = self.name + rules.label_suffix.format(index=last)
        if len(longest) > MAX_DNS_LABEL:
            budget = MAX_DNS_LABEL - (len(longest) - len(self.name))
            raise ValueError(
                f"name is too long: pod and Service names like {longest[:60]!r} must stay "
                f"within {MAX_DNS_LABEL} characters; shorten name to at most {budget} "
                "characters"
            )
        if self.elastic and rules.no_elastic:
            raise ValueError(
                f"target {rules.name}: {rules.no_elastic}; drop --elastic (rendezvous.mode: "
                f"elastic) or use --target {_elastic_target()}"
            )
        fixed = rules.fixed_port
        if fixed is not None and self.rendezvous.port not in (DEFAULT_PORT, fixed):
            raise ValueError(
                f"target {rules.name}: rendezvous.port is fixed at {fixed} by "
                f"{rules.platform}; remove rendezvous.port"
            )
        policy = self.run_policy.model_dump(by_alias=True, exclude_none=True)
        for key in policy:
            refused = key in rules.run_policy_refused or (
                "*" in rules.run_policy_refused and key not in rules.run_policy_kept
            )
            if refused:
                raise ValueError(
                    f"target {rules.name}: runPolicy.{key} has no {rules.kind} field "
                    f"({rules.run_policy_why}); {rules.run_policy_fix}"
                )

    def _check_env_sources(self) -> None:
        check_env(dict.fromkeys(self.secret_env, ""))
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise ValueError(f"{both[0]} is in both env and secretEnv; keep one")
        for field, var in NCCL_FIELDS.items():
            if getattr(self.network, field) is not None and (
                var in self.env or var in self.secret_env
            ):
                raise ValueError(f"{var} is set by network.{to_camel(field)} and by env; keep one")

    @property
    def cpu_request(self) -> str:
        """CPU requested per node: the field, else one CPU per process."""
        return self.cpu or str(self.procs_per_node)

    @property
    def threads_per_proc(self) -> int | None:
        """CPU threads for each process when ``cpu`` is given: its share of the node's
        request, at least 1 (None: cpu not given, torch and torchrun decide)."""
        if self.cpu is None:
            return None
        return max(1, int(quantity(self.cpu)[1]) // self.procs_per_node)  # cpu <= MAX_CPU

    @property
    def memory_request(self) -> str:
        """Memory requested and limited per node: the field, else 4Gi per process."""
        return self.memory or f"{4 * self.procs_per_node}Gi"

    @property
    def queued(self) -> bool:
        """Kueue admits the job: a queue with the default scheduler."""
        return bool(self.scheduling.queue) and self.scheduling.scheduler == "default"

    @property
    def min_available(self) -> int:
        """Pods a gang needs before any of them starts (the elastic range's least)."""
        return self.rendezvous.min_nodes or self.nodes

    @property
    def max_nodes(self) -> int:
        return self.rendezvous.max_nodes or self.nodes

    @property
    def procs_per_node(self) -> int:
        return self.procs or self.gpus or 1

    @property
    def c10d(self) -> bool:
        """Nodes meet through torchrun's c10d rendezvous (mode c10d or elastic): no fixed
        master, a fresh store each round, global rank 0 on any node."""
        return self.rendezvous.mode != "static"

    @property
    def elastic(self) -> bool:
        """The node count may change between minNodes and maxNodes."""
        return self.rendezvous.mode == "elastic"

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.gpus else "gloo"


def canonical_json(spec: JobSpec) -> str:
    """The spec as JSON, every field with its value, keys sorted: the same for any file
    that describes the same job (key order, layout and defaults left out do not change it).
    The cluster keeps it on the job (the ddpdeploy.dev/spec annotation)."""
    return json.dumps(spec.model_dump(mode="json", by_alias=True), sort_keys=True)


def spec_sha256(spec: JobSpec) -> str:
    """sha256 of ``canonical_json(spec)``'s UTF-8 bytes: what DDPDEPLOY_SPEC_SHA256 says."""
    return hashlib.sha256(canonical_json(spec).encode()).hexdigest()


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ddpdeploy.yaml: camelCase keys, descriptions, allowed values."""
    schema = JobSpec.model_json_schema(by_alias=True)
    _drop_field_titles(schema)
    return schema


def _drop_field_titles(node: Any) -> None:
    # pydantic titles every field after its Python name ("Claimname"); descriptions say more.
    if isinstance(node, dict):
        for prop in (node.get("properties") or {}).values():
            prop.pop("title", None)
        for value in node.values():
            _drop_field_titles(value)
    elif isinstance(node, list):
        for value in node:
            _drop_field_titles(value)
