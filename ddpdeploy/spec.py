"""JobSpec: the one validated description of a training job that every command speaks.

Loaded from ``ddpdeploy.yaml`` (camelCase keys, like Kubernetes) and overridden by CLI flags.
Validation errors become one line naming the field (or the flag) and what is allowed.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from ddpdeploy.errors import UserError
from ddpdeploy.rules import (
    DEFAULT_PORT,
    DEFAULT_RUNTIME,
    DEFAULT_TARGET,
    MAX_DNS_LABEL,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    TARGET_NAMES,
    TARGET_RULES,
)

# Model classes build their validators at definition; pydantic then scans every installed
# distribution's entry points for plugins, a large share of `ddpdeploy render`'s start-up.
# ddpdeploy uses none, so the scan is skipped while the classes below are defined, and the
# user's setting is restored afterwards (children such as torchrun inherit it unchanged).
_USER_PLUGINS = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"

DEFAULT_FILE = "ddpdeploy.yaml"
MAX_DNS_SUBDOMAIN = 253
INT32_MAX = 2**31 - 1  # replicas, counts and most seconds fields are int32 in the API
INT64_MAX = 2**63 - 1  # activeDeadlineSeconds, terminationGracePeriodSeconds, tolerationSeconds
# Kubernetes caps all annotations of an object at 256 KiB; ddpdeploy adds a few of its own.
MAX_USER_ANNOTATIONS = 256 * 1024 - 1024
MAX_IMAGE_NAME = 255  # the registry's limit on [domain/]path
SHM_PATH = "/dev/shm"
# Writable emptyDirs under a read-only root: temp files, and HOME for every cache below it.
TMP_DIR = "/tmp"
HOME_DIR = "/home/ddp"  # the image user's home in docker/Dockerfile
WRITABLE_DIRS = (TMP_DIR, HOME_DIR)


def is_reserved_env(name: str) -> bool:
    """True for env names the launch contract owns (see RESERVED_ENV)."""
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)


# Patterns as strings, matched whole (re.fullmatch: `$` would let a trailing newline through);
# `re` compiles (and caches) only those a run uses, at first use.
_DNS1035 = r"[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1123 = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_DNS1123}(\.{_DNS1123})*"
# Kubernetes resource.Quantity, as the apiserver's own pattern accepts it.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
_QUANTITY = rf"[+]?(?P<number>{_NUMBER})(?P<suffix>([KMGTPE]i)|[numkMGTPE]|([eE][+-]?{_NUMBER}))?"
# Image reference grammar of the distribution project: [domain[:port]/]path[:tag][@digest].
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = (
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@(?P<algorithm>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*):(?P<hex>[^:@/]+))?"
)
_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
_ENV_NAME = r"[-._a-zA-Z][-._a-zA-Z0-9]*"
_LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_MODULE = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_QUANTITY_HINT = "use a number with an optional suffix, e.g. 500m, 4, 16Gi, 512Mi"


def _show(value: Any) -> str:
    """repr for one-line messages, cut short: a value can be a megabyte long."""
    try:
        text = repr(value)
    except ValueError:  # an int with more digits than Python will print
        return "a number too long to print"
    return text if len(text) <= 80 else f"{text[:60]}…({len(text)} characters)"


def _dns_name(pattern: str, limit: int, rule: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if len(value) > limit or not re.fullmatch(pattern, value):
            raise ValueError(f"must be a {rule}, at most {limit} characters")
        return value

    return check


_dns1035 = _dns_name(
    _DNS1035,
    MAX_DNS_LABEL,
    "DNS-1035 label: lowercase letters, digits and '-', starting with a letter, ending with "
    "a letter or digit",
)
_dns1123 = _dns_name(
    _DNS1123,
    MAX_DNS_LABEL,
    "DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit",
)
_subdomain = _dns_name(
    _SUBDOMAIN,
    MAX_DNS_SUBDOMAIN,
    "DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting and ending with a "
    "letter or digit",
)

_MULTIPLIERS = {
    "": 1,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    **{s + "i": 1024.0 ** (i + 1) for i, s in enumerate("KMGTPE")},
}


def _parse_quantity(value: Any) -> tuple[str, float, str]:
    """``value`` -> (text, amount in base units, suffix); ValueError when not a quantity."""
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    match = re.fullmatch(_QUANTITY, text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"{_show(value)} is not a Kubernetes quantity: {_QUANTITY_HINT}")
    suffix = match["suffix"] or ""
    number = float(match["number"])
    if suffix[:1] in ("e", "E"):
        amount = float(match["number"] + suffix)
    else:
        amount = number * _MULTIPLIERS[suffix]
    if amount <= 0:
        raise ValueError(f"{_show(text)} must be greater than zero")
    return text, amount, suffix


def _cpu(value: Any) -> str:
    text, amount, _ = _parse_quantity(value)
    if amount < 1e-3:
        raise ValueError(f"{_show(text)} is below the smallest CPU unit, 1m")
    return text


def _bytes(value: Any) -> str:
    text, amount, suffix = _parse_quantity(value)
    if suffix in ("", "n", "u", "m"):
        # `memory: 16` is 16 bytes and `16m` is 0.016 bytes: a unit was surely forgotten.
        number = text.rstrip("num") if len(text) < 20 else "16"
        raise ValueError(f"{_show(text)} is {amount:g} bytes; give a unit, e.g. {number}Gi")
    return text


def _image(value: str) -> str:
    match = re.fullmatch(_IMAGE, value)
    if not match:
        raise ValueError(
            f"{_show(value)} is not an image reference: use "
            "[registry[:port]/]repo[:tag][@sha256:…] with a lowercase repository, "
            "e.g. ghcr.io/team/train:v1"
        )
    if len(match["name"]) > MAX_IMAGE_NAME:
        raise ValueError(
            f"image name {match['name'][:40]!r}… is longer than {MAX_IMAGE_NAME} characters"
        )
    if match["algorithm"]:
        size = _DIGEST_HEX.get(match["algorithm"])
        if size is None or not re.fullmatch(rf"[a-f0-9]{{{size}}}", match["hex"]):
            raise ValueError(
                f"digest {match['algorithm']}:{match['hex'][:16]}… is invalid: use sha256 with "
                "64 lowercase hex digits (or sha384: 96, sha512: 128)"
            )
    return value


def _scalar_to_str(value: Any) -> Any:
    # Files keep scalars as typed (specfile.py); this is for documents built in Python.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def _no_expansion(value: str) -> str:
    # The kubelet expands $(VAR) and turns $$ into $ in args and env; local runs do not.
    if "$(" in value or "$$" in value:
        raise ValueError(
            f"{_show(value)} contains '$(' or '$$', which Kubernetes expands but local runs do "
            "not; ddpdeploy passes text unchanged everywhere, so write it without them"
        )
    if "\0" in value:
        raise ValueError(f"{_show(value)} contains a NUL character")
    return value


def _env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not re.fullmatch(_ENV_NAME, key):
            raise ValueError(
                f"env name {_show(key)} is invalid: use letters, digits, '_', '-', '.', "
                "not starting with a digit"
            )
        if is_reserved_env(key):
            raise ValueError(
                f"{key} is set by ddpdeploy's launch contract (torchrun/operator topology); "
                "use the matching field or flag (--nodes, --procs, --elastic, …) instead"
            )
    return env


def _qualified_name(key: str, what: str, example: str) -> None:
    prefix, _, name = key.rpartition("/")
    valid = re.fullmatch(_LABEL_NAME, name) and len(name) <= MAX_DNS_LABEL
    if "/" in key:
        valid = valid and len(prefix) <= MAX_DNS_SUBDOMAIN and re.fullmatch(_SUBDOMAIN, prefix)
    if not valid:
        raise ValueError(
            f"{what} {_show(key)} is not a qualified name: [DNS subdomain of at most "
            f"{MAX_DNS_SUBDOMAIN} characters/]name of at most {MAX_DNS_LABEL} letters, digits, "
            f"'-', '_', '.' (e.g. {example})"
        )


def _label_value(value: str, what: str) -> None:
    if len(value) > MAX_DNS_LABEL or not re.fullmatch(_LABEL_VALUE, value):
        raise ValueError(
            f"{what} {_show(value)} is invalid: at most 63 letters, digits, '-', '_', '.', "
            "starting and ending with a letter or digit"
        )


def _labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        _qualified_name(key, "label key", "team or example.com/team")
        _label_value(value, "label value")
    return labels


def _annotations(annotations: dict[str, str]) -> dict[str, str]:
    for key in annotations:
        _qualified_name(key, "annotation key", "example.com/note")
    total = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if total > MAX_USER_ANNOTATIONS:
        raise ValueError(
            f"annotations total {total} bytes; Kubernetes allows 256 KiB per object and "
            f"ddpdeploy adds its own: keep them within {MAX_USER_ANNOTATIONS} bytes"
        )
    return annotations


def _mount_path(value: str) -> str:
    parts = value.split("/")
    if not value.startswith("/") or ".." in parts or any(ord(c) < 32 for c in value):
        raise ValueError(f"mountPath must be an absolute path without '..' (got {_show(value)})")
    if posixpath.normpath(value) == "/":
        raise ValueError("mountPath '/' would hide the image's whole file system")
    return value


def _scalar_schema(schema: dict[str, Any]) -> None:
    # In YAML, `OMP_NUM_THREADS: 4` is a number; ddpdeploy reads it as the text "4".
    schema.pop("type", None)
    schema["type"] = ["string", "number", "boolean"]


def _quantity_schema(schema: dict[str, Any]) -> None:
    schema.pop("type", None)
    schema["anyOf"] = [{"type": "string", "pattern": _ecma(_QUANTITY)}, {"type": "number"}]


def _ecma(pattern: str) -> str:
    # JSON Schema regexes are ECMA-262: anchored by hand, and no named groups.
    return "^(?:" + re.sub(r"\?P<\w+>", "", pattern) + ")$"


def _json_pattern(pattern: str) -> Callable[[dict[str, Any]], None]:
    def update(schema: dict[str, Any]) -> None:
        schema["pattern"] = _ecma(pattern)

    return update


def _int(low: int, high: int) -> Any:
    # strict: `nodes: true` or `nodes: 2.0` is refused instead of read as 1 or 2.
    return Annotated[int, Field(strict=True, ge=low, le=high)]


DnsName = Annotated[str, AfterValidator(_dns1035), Field(json_schema_extra=_json_pattern(_DNS1035))]
Namespace = Annotated[
    str, AfterValidator(_dns1123), Field(json_schema_extra=_json_pattern(_DNS1123))
]
Subdomain = Annotated[
    str, AfterValidator(_subdomain), Field(json_schema_extra=_json_pattern(_SUBDOMAIN))
]
CpuQuantity = Annotated[str, BeforeValidator(_cpu), Field(json_schema_extra=_quantity_schema)]
ByteQuantity = Annotated[str, BeforeValidator(_bytes), Field(json_schema_extra=_quantity_schema)]
ImageRef = Annotated[str, AfterValidator(_image), Field(json_schema_extra=_json_pattern(_IMAGE))]
Str = Annotated[str, BeforeValidator(_scalar_to_str), Field(json_schema_extra=_scalar_schema)]
ArgStr = Annotated[Str, AfterValidator(_no_expansion)]
EnvMap = Annotated[dict[str, ArgStr], AfterValidator(_env)]
LabelMap = Annotated[dict[str, Str], AfterValidator(_labels)]
AnnotationMap = Annotated[dict[str, Str], AfterValidator(_annotations)]
Int32 = _int(0, INT32_MAX)
Count = _int(1, INT32_MAX)


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
        json_schema_extra=_json_pattern(_MODULE),
    )
    args: list[ArgStr] = Field(
        default_factory=list,
        description="Arguments passed to the script, module or built-in trainer, as written; "
        "`ddpdeploy render -- ARGS` appends more.",
    )

    @model_validator(mode="after")
    def _one_entry(self) -> Command:
        if self.script is not None and self.module is not None:
            raise ValueError("set either script or module, not both")
        if self.script is not None:
            _no_expansion(self.script)
        if self.module is not None and not re.fullmatch(_MODULE, self.module):
            raise ValueError(f"module {_show(self.module)} is not a dotted Python module name")
        return self

    @property
    def builtin(self) -> bool:
        return not (self.script or self.module)


class Rendezvous(Model):
    """static: fixed node count, rank 0 on master-0. elastic: c10d with min:max nodes."""

    mode: Literal["static", "elastic"] = Field(
        default="static",
        description="static: a fixed node count, rank 0 on master-0. elastic: c10d rendezvous "
        "between minNodes and maxNodes (--elastic MIN:MAX).",
    )
    min_nodes: Count | None = Field(default=None, description="Elastic only: fewest nodes.")
    max_nodes: Count | None = Field(default=None, description="Elastic only: most nodes.")
    max_restarts: Int32 | None = Field(
        default=None, description="Elastic only: torchrun restarts of the worker group."
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
        if self.mode == "static":
            if self.min_nodes is not None or self.max_nodes is not None:
                raise ValueError("minNodes/maxNodes need mode: elastic")
            if self.max_restarts is not None:
                raise ValueError(
                    "maxRestarts needs elastic rendezvous (--elastic MIN:MAX); static jobs "
                    "restart through runPolicy.backoffLimit"
                )
        elif self.min_nodes is None or self.max_nodes is None:
            raise ValueError("elastic rendezvous needs minNodes and maxNodes (--elastic MIN:MAX)")
        elif self.min_nodes > self.max_nodes:
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
        _mount_path(self.mount_path)
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
            _qualified_name(self.key, "toleration key", "nvidia.com/gpu")
        elif self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator: Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value; remove value or use Equal")
        if self.operator == "Equal":
            _label_value(self.value or "", "toleration value")
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


def _secret_key(value: str) -> str:
    if len(value) > MAX_DNS_SUBDOMAIN or not re.fullmatch(r"[-._a-zA-Z0-9]+", value):
        raise ValueError(
            f"secret key {_show(value)} is invalid: letters, digits, '-', '_', '.', at most "
            f"{MAX_DNS_SUBDOMAIN} characters"
        )
    return value


def _extended_resource(value: str) -> str:
    _qualified_name(value, "resource", "rdma/hca_shared_devices_a")
    domain = value.partition("/")[0]
    if "/" not in value or domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ValueError(
            f"resource {_show(value)} must be a device plugin's domain-qualified name, e.g. "
            "rdma/hca_shared_devices_a or nvidia.com/hostdev"
        )
    return value


class SecretRef(Model):
    """One key of a Kubernetes Secret, passed as an env var by reference (secretKeyRef)."""

    secret: Subdomain = Field(description="Name of the Secret in the job's namespace.")
    key: Annotated[str, AfterValidator(_secret_key)] = Field(
        description="Key inside the Secret whose value becomes the env var."
    )


class Security(Model):
    """The pods' security settings: hardened by default, each loosened by name."""

    run_as_user: int = Field(
        default=IMAGE_UID,
        strict=True,
        ge=1,
        le=INT64_MAX,
        description="UID the container runs as (runAsNonRoot); the built image's user is 10001.",
    )
    run_as_group: int = Field(
        default=IMAGE_UID, strict=True, ge=0, le=INT64_MAX, description="Primary GID."
    )
    fs_group: int = Field(
        default=IMAGE_UID,
        strict=True,
        ge=0,
        le=INT64_MAX,
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

    resource: Annotated[str, AfterValidator(_extended_resource)] = Field(
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
    nccl_socket_ifname: ArgStr | None = Field(
        default=None,
        min_length=1,
        description="NCCL_SOCKET_IFNAME: interfaces for NCCL's TCP traffic, e.g. eth0 or ^lo,"
        "docker (default: NCCL chooses).",
    )
    nccl_ib_hca: ArgStr | None = Field(
        default=None,
        min_length=1,
        description="NCCL_IB_HCA: InfiniBand/RoCE adapters to use, e.g. mlx5_0,mlx5_1 "
        "(default: NCCL chooses).",
    )


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
    nodes: Count = Field(default=1, description="Number of nodes (pods).")
    gpus: Int32 = Field(default=0, description="GPUs per node; 0 is a CPU job.")
    procs: Count | None = Field(
        default=None, description="Processes per node (default: gpus, or 1 on CPU)."
    )
    cpu: CpuQuantity | None = Field(
        default=None,
        description="CPU request per node, a Kubernetes quantity (e.g. 8, 500m); default one "
        "per process. No CPU limit: CFS throttling stalls collectives.",
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
        _env(dict.fromkeys(self.secret_env, ""))
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
    def memory_request(self) -> str:
        """Memory requested and limited per node: the field, else 4Gi per process."""
        return self.memory or f"{4 * self.procs_per_node}Gi"

    @property
    def queued(self) -> bool:
        """Kueue admits the job: a queue with the default scheduler."""
        return bool(self.scheduling.queue) and self.scheduling.scheduler == "default"

    @property
    def min_available(self) -> int:
        """Pods a gang needs before any of them starts."""
        return self.rendezvous.min_nodes or self.nodes

    @property
    def max_nodes(self) -> int:
        return self.rendezvous.max_nodes or self.nodes

    @property
    def procs_per_node(self) -> int:
        return self.procs or self.gpus or 1

    @property
    def elastic(self) -> bool:
        return self.rendezvous.mode == "elastic"

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.gpus else "gloo"


if _USER_PLUGINS is None:
    del os.environ["PYDANTIC_DISABLE_PLUGINS"]
else:
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = _USER_PLUGINS

SCHEMA_FILE = ".ddpdeploy.schema.json"  # written by `ddpdeploy init` beside the spec file


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


# Flags that override file fields: flag name -> path in the spec document.
FLAG_FIELDS: dict[str, tuple[str, ...]] = {
    "--name": ("name",),
    "--target": ("target",),
    "--runtime": ("runtime",),
    "--namespace": ("namespace",),
    "--image": ("image",),
    "--nodes": ("nodes",),
    "--gpus": ("gpus",),
    "--procs": ("procs",),
    "--max-restarts": ("rendezvous", "maxRestarts"),
    "--elastic": ("rendezvous",),
    "--scheduler": ("scheduling", "scheduler"),
    "--queue": ("scheduling", "queue"),
    "--rdma": ("network", "rdma"),
    "--host-network": ("network", "hostNetwork"),
    "--nccl-debug": ("network", "ncclDebug"),
    "--network-policy": ("network", "policy"),
    "--writable-rootfs": ("security", "readOnlyRootFilesystem"),
}


def parse_rdma(text: str) -> dict[str, Any]:
    """``RESOURCE=N`` -> the network.rdma mapping."""
    match = re.fullmatch(r"([^=\s]+)=([0-9]{1,100})", text)
    if not match:
        raise UserError(
            f"--rdma: {_show(text)} is not RESOURCE=N; use the device plugin's resource and a "
            "count, e.g. rdma/hca_shared_devices_a=1"
        )
    return {"resource": match[1], "count": int(match[2])}


# Flags whose value is not the field's value as typed.
_FLAG_VALUES: dict[str, Callable[[Any], Any]] = {
    "--rdma": parse_rdma,
    "--writable-rootfs": lambda writable: not writable,
}


def parse_elastic(text: str) -> dict[str, Any]:
    """``MIN:MAX`` -> the rendezvous fields it sets."""
    match = re.fullmatch(r"([0-9]{1,100}):([0-9]{1,100})", text)
    if not match:
        raise UserError(f"--elastic: {_show(text)} is not MIN:MAX; use two node counts, e.g. 1:4")
    return {"mode": "elastic", "minNodes": int(match[1]), "maxNodes": int(match[2])}


def read_spec_file(path: Path, label: str = "-f/--file") -> dict[str, Any]:
    """The spec document in ``path``: strict YAML, string fields as typed, as a plain dict.

    ``label`` names where the path came from in errors (the flag, or the default file)."""
    from ddpdeploy import specfile  # imported on first use: render without a file skips it

    try:
        text = specfile.read_text(path, label)
    except FileNotFoundError:
        raise UserError(
            f"{label}: {path} not found; create one with `ddpdeploy init` or pass -f PATH"
        ) from None
    try:
        data = specfile.resolve(specfile.parse(text), JobSpec)
    except specfile.SpecSyntaxError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise UserError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise UserError(f"{where}: YAML syntax error: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of fields (name: …, nodes: …)")
    return data


def _section(doc: dict[str, Any], key: str, source: str, hint: str) -> dict[str, Any]:
    """A copy of the mapping at ``doc[key]`` that flags or args are merged into."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{source}: {key} must be a mapping, e.g. {hint} (got {_show(value)})")
    return dict(value)


_HINTS = {
    "rendezvous": "{mode: static}",
    "command": "{script: train.py, args: [--lr, '0.1']}",
    "scheduling": "{scheduler: volcano}",
    "network": "{policy: true}",
    "security": "{readOnlyRootFilesystem: true}",
}


def _default_document() -> tuple[dict[str, Any], str]:
    # lexists: a directory, a dangling link or a loop named ddpdeploy.yaml is refused, not
    # silently skipped.
    if os.path.lexists(DEFAULT_FILE):
        return read_spec_file(Path(DEFAULT_FILE), f"./{DEFAULT_FILE}"), DEFAULT_FILE
    return {}, "defaults"


def load_spec(
    path: Path | None = None,
    flags: dict[str, Any] | None = None,
    extra_args: list[str] | None = None,
) -> JobSpec:
    """File (if any), then flags (flags win), then args after ``--``: one validated JobSpec.

    ``flags`` maps flag names (keys of FLAG_FIELDS) to values; None means "not given".
    With no path, ``./ddpdeploy.yaml`` is read when it exists, else the defaults apply.
    """
    if path is not None:
        doc, source = read_spec_file(path), str(path)
    else:
        doc, source = _default_document()
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    for flag, value in given.items():
        field_path = FLAG_FIELDS[flag]
        if len(field_path) == 1 and flag != "--elastic":
            doc[field_path[0]] = value
            continue
        section = _section(doc, field_path[0], source, _HINTS[field_path[0]])
        if flag == "--elastic":
            section.update(parse_elastic(value))
        else:
            section[field_path[1]] = _FLAG_VALUES.get(flag, lambda v: v)(value)
        doc[field_path[0]] = section
    if extra_args:
        command = _section(doc, "command", source, _HINTS["command"])
        args = command.get("args") or []
        if not isinstance(args, list):
            raise UserError(f"{source}: command.args must be a list, e.g. [--lr, '0.1']")
        command["args"] = [*args, *extra_args]
        doc["command"] = command
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        raise UserError(_one_line(exc, source, given)) from None


def spec_with(spec: JobSpec, **changes: Any) -> JobSpec:
    """``spec`` with ``changes`` (snake_case fields), validated again as a whole like a spec
    from a file (``model_copy(update=...)`` would skip every check: name budgets, ranges).
    An invalid result is one UserError line naming the field."""
    doc = spec.model_dump(mode="json", by_alias=True)
    doc.update({to_camel(k): v for k, v in changes.items()})
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        raise UserError(_one_line(exc, "defaults", {})) from None


def _one_line(exc: ValidationError, source: str, flags: dict[str, Any]) -> str:
    """The first error as one line, naming the flag when a flag set that field."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = [str(p) for p in first["loc"]]
    prefix = "" if source == "defaults" else f"{source}: "
    where = f"{prefix}{'.'.join(loc)}" if loc else source
    for flag, field_path in FLAG_FIELDS.items():
        # The error sits on the flag's field, inside it, or on the model holding it.
        n = min(len(loc), len(field_path))
        if flag in flags and loc and tuple(loc[:n]) == field_path[:n]:
            where = flag
            break
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = (
            f"unknown field {_show(loc[-1])}; `ddpdeploy init` writes a file listing every field"
        )
        camel = to_camel(loc[-1])
        if camel != loc[-1]:
            message = (
                f"unknown field {_show(loc[-1])}; keys are camelCase like Kubernetes': "
                f"{_show(camel)}"
            )
        where = f"{prefix}{'.'.join(loc[:-1]) or '(top level)'}"
    elif first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        message = f"must be a mapping of fields (got {_show(first['input'])})"
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    else:
        message = message.replace("Input should be", "must be")
        if "input" in first and not isinstance(first["input"], dict | list):
            message += f" (got {_show(first['input'])})"
    if first["type"] == "string_type":
        message += "; quote it in YAML"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if where == "defaults":
        return f"{message}{more}"
    return f"{where}: {message}{more}"
