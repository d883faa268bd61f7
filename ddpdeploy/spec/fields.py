"""The spec's field grammars: Kubernetes names, quantities, images, env, labels and paths.

Each grammar is a validator plus the JSON Schema it shows editors, composed into the
annotated types the model (model.py) declares its fields with. Messages are one line that
names what is wrong and what is allowed. One quantity parser (``quantity``) serves the
whole package.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from decimal import Context, Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from ddpdeploy.rules import (
    DIAGNOSTICS_ENV,
    MAX_DNS_LABEL,
    RECORD_ENV,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
)
from ddpdeploy.text import reads_as_zero, show

MAX_DNS_SUBDOMAIN = 253
INT32_MAX = 2**31 - 1  # replicas, counts and most seconds fields are int32 in the API
INT64_MAX = 2**63 - 1  # activeDeadlineSeconds, terminationGracePeriodSeconds, tolerationSeconds
# Kubernetes refuses an Indexed Job running more pods at once (maxParallelismForIndexedJob), and
# every node of a job runs at once. Above it, rendering alone took GBs and minutes.
MAX_NODES = 100_000
# Processes (and GPUs) per node: no machine has more. With MAX_NODES it keeps the world size
# (nodes x procs, at most ~1e8) well within torch's int32 ranks.
MAX_PER_NODE = 1024
# Kubernetes caps all annotations of an object at 256 KiB; ddpdeploy adds a few of its own.
MAX_USER_ANNOTATIONS = 256 * 1024 - 1024
MAX_IMAGE_NAME = 255  # the registry's limit on [domain/]path
SHM_PATH = "/dev/shm"
# Writable emptyDirs under a read-only root: temp files, and HOME for every cache below it.
TMP_DIR = "/tmp"
HOME_DIR = "/home/ddp"  # the image user's home in docker/Dockerfile
WRITABLE_DIRS = (TMP_DIR, HOME_DIR)
# Where torchrun keeps the copy of every worker's stdout and stderr that it tees to the
# console with the rank prefix (PET_LOG_DIR): a volume of its own, bounded (logSize), on
# every pod whatever the root file system; /tmp's emptyDir is the job's own.
LOG_DIR = "/var/log/torchrun"
# What a checkpoint volume mounted at or above must not hide: the shell, Python (the default
# base image keeps it in /opt/conda) and libraries the pod starts with; and the kernel's own
# file systems, which runtimes refuse as mount points.
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib64", "/usr/bin", "/usr/sbin", "/usr/lib",
               "/usr/local/bin", "/usr/local/lib", "/etc", "/dev", "/opt/conda")  # fmt: skip
KERNEL_DIRS = ("/proc", "/sys")


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
# A first component is a registry host only with a '.' or a ':', or as localhost (Docker's
# rule): `UPPER/x` is the repository UPPER/x on Docker Hub, which the kubelet refuses
# (InvalidImageName: repository name must be lowercase). A host may have capitals.
_DOMAIN = (
    rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})+(?::[0-9]+)?"
    rf"|{_DOMAIN_PART}:[0-9]+|localhost)"
)
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
MODULE = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_QUANTITY_HINT = "use a number with an optional suffix, e.g. 500m, 4, 16Gi, 512Mi"


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

# Quantity suffixes -> multipliers, exact (Decimal): `scale` and compose need whole bytes.
_MULTIPLIERS = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s + "i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}
# Exponents as long as the grammar allows: overflow is Infinity and underflow 0, no error.
_EXACT = Context(prec=60, Emax=999_999_999, Emin=-999_999_999, traps=[])


def quantity(value: Any) -> tuple[str, Decimal, str]:
    """A Kubernetes quantity -> (its text, its amount in base units, its suffix); ValueError
    when ``value`` is none. The one quantity parser of the package."""
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    match = re.fullmatch(_QUANTITY, text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"{show(value)} is not a Kubernetes quantity: {_QUANTITY_HINT}")
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E") and suffix not in _MULTIPLIERS:  # E and Ei: exa, exbi
        amount = _EXACT.create_decimal(match["number"] + suffix)
    else:
        amount = _EXACT.multiply(Decimal(match["number"]), _MULTIPLIERS[suffix])
    return text, amount, suffix


def _positive(value: Any) -> tuple[str, Decimal, str]:
    text, amount, suffix = quantity(value)
    if amount <= 0:
        raise ValueError(f"{show(text)} must be greater than zero")
    return text, amount, suffix


# No node has this many CPUs; above it OMP_NUM_THREADS (the share of each process) is nonsense.
MAX_CPU = 100_000
# Kubernetes and Docker count bytes in an int64; below a MiB no container starts (runc's
# floor is about 6 MB) and no volume holds a checkpoint.
MAX_BYTES = 2**63 - 1
MIN_BYTES = 2**20


def _cpu(value: Any) -> str:
    text, amount, _ = _positive(value)
    if amount < Decimal("1e-3"):
        raise ValueError(f"{show(text)} is below the smallest CPU unit, 1m")
    if amount > MAX_CPU:
        raise ValueError(f"{show(text)} is more CPUs than any node has; give a node's, e.g. 8")
    return text


def _with_unit(text: str, amount: Decimal) -> str:
    """The fix offered for a size without a unit: a few bytes meant as that many Gi (16:
    16Gi), a byte count as itself in the largest unit it fills (1048576: 1Mi); never one
    the checks below refuse."""
    number = text.rstrip("num")
    few = re.fullmatch(r"\+?[0-9]{1,4}", number)
    if few and 0 < int(few[0]) <= 4096:
        return f"{int(few[0])}Gi"
    if MIN_BYTES <= amount <= MAX_BYTES:
        for power, unit in ((60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi")):
            if amount >= 2**power:
                return f"{float(amount / 2**power):.4g}{unit}"
    return "16Gi"


def _bytes(value: Any) -> str:
    text, amount, suffix = _positive(value)
    if suffix not in _MULTIPLIERS:  # 1e3, 16E3: an exponent, no unit
        raise ValueError(f"{show(text)} has no unit (an exponent is not one); give e.g. 16Gi")
    if suffix in ("", "n", "u", "m"):
        # `memory: 16` is 16 bytes and `16m` is 0.016 bytes: a unit was surely forgotten.
        raise ValueError(
            f"{show(text)} is {float(amount):g} bytes; give a unit, e.g. {_with_unit(text, amount)}"
        )
    if amount < MIN_BYTES:
        raise ValueError(
            f"{show(text)} is {amount.normalize():f} bytes, less than 1Mi; give e.g. 16Gi"
        )
    if amount > MAX_BYTES:
        raise ValueError(
            f"{show(text)} is more bytes than Kubernetes and Docker count (under 8Ei); e.g. 16Gi"
        )
    return text


def _uppercase_path(value: str) -> str | None:
    """The repository path of ``value`` when only its capitals keep it from being an image
    reference (the pull would fail at run time with InvalidImageName), else None."""
    name = value.split("@", 1)[0]
    head, slash, last = name.rpartition("/")
    tag = re.search(r":[^:/]*$", last)
    name = f"{head}{slash}{last[: tag.start()] if tag else last}"
    first, slash, rest = name.partition("/")
    host = f"{first}/" if slash and re.fullmatch(_DOMAIN, first) else ""
    path = name[len(host) :]
    lowered = host + path.lower() + value[len(host) + len(path) :]
    if path == path.lower() or not re.fullmatch(_IMAGE, lowered):
        return None
    return path


def _image(value: str) -> str:
    match = re.fullmatch(_IMAGE, value)
    if not match and (path := _uppercase_path(value)):
        raise ValueError(
            f"{show(value)}: the repository {path!r} must be lowercase (only the registry host "
            f"and the tag may have capitals), e.g. {path.lower()!r}"
        )
    if not match:
        raise ValueError(
            f"{show(value)} is not an image reference: use "
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
    # Files keep scalars as typed (load.py); this is for documents built in Python.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def no_expansion(value: str) -> str:
    # The kubelet expands $(VAR) and turns $$ into $ in args and env; local runs do not.
    if "$(" in value or "$$" in value:
        raise ValueError(
            f"{show(value)} contains '$(' or '$$', which Kubernetes expands but local runs do "
            "not; ddpdeploy passes text unchanged everywhere, so write it without them"
        )
    if "\0" in value:
        raise ValueError(f"{show(value)} contains a NUL character")
    return value


def check_env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not re.fullmatch(_ENV_NAME, key):
            raise ValueError(
                f"env name {show(key)} is invalid: use letters, digits, '_', '-', '.', "
                "not starting with a digit"
            )
        if key in DIAGNOSTICS_ENV:
            raise ValueError(
                f"{key} is set by ddpdeploy's launch contract (the diagnostics settings); "
                f"use {DIAGNOSTICS_ENV[key]} instead"
            )
        if key in RECORD_ENV:
            raise ValueError(
                f"{key} is set by ddpdeploy's launch contract (the record of what ran, from "
                "the spec and the image ddpdeploy built); remove it from env"
            )
        if is_reserved_env(key):
            raise ValueError(
                f"{key} is set by ddpdeploy's launch contract (torchrun/operator topology); "
                "use the matching field or flag (--nodes, --procs, --elastic, …) instead"
            )
    return env


def qualified_name(key: str, what: str, example: str) -> None:
    prefix, _, name = key.rpartition("/")
    valid = bool(re.fullmatch(_LABEL_NAME, name)) and len(name) <= MAX_DNS_LABEL
    if "/" in key:
        valid = (
            valid and len(prefix) <= MAX_DNS_SUBDOMAIN and bool(re.fullmatch(_SUBDOMAIN, prefix))
        )
    if not valid:
        raise ValueError(
            f"{what} {show(key)} is not a qualified name: [DNS subdomain of at most "
            f"{MAX_DNS_SUBDOMAIN} characters/]name of at most {MAX_DNS_LABEL} letters, digits, "
            f"'-', '_', '.' (e.g. {example})"
        )


def label_value(value: str, what: str) -> None:
    if len(value) > MAX_DNS_LABEL or not re.fullmatch(_LABEL_VALUE, value):
        raise ValueError(
            f"{what} {show(value)} is invalid: at most 63 letters, digits, '-', '_', '.', "
            "starting and ending with a letter or digit"
        )


# Keys that are ddpdeploy's own, never a spec's: everything under its domain (the saved spec
# ddpdeploy.dev/spec, the run record record.ddpdeploy.dev/*, ddpdeploy.dev/role), and the
# keys it writes itself elsewhere (render/pod.py, render/policy.py), each with what sets it.
# A spec that set one would forge what ddpdeploy reads back (a saved spec, whose job an
# object is) or be silently overwritten.
OWN_DOMAIN = "ddpdeploy.dev"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ISTIO_INJECT_ANNOTATION = "sidecar.istio.io/inject"
POD_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
WRITTEN_LABELS = {
    NAME_LABEL: "ddpdeploy sets it to the job's name",
    INSTANCE_LABEL: "ddpdeploy sets it to the job's name; it tells whose an object is",
    MANAGED_BY_LABEL: "ddpdeploy sets it; it tells what ddpdeploy made",
    KUEUE_QUEUE_LABEL: "set it with scheduling.queue (--queue)",
}
WRITTEN_ANNOTATIONS = {
    ISTIO_INJECT_ANNOTATION: "ddpdeploy sets it to false on the pods: an injected sidecar never "
    "exits, so the job would never complete",
    POD_GROUP_ANNOTATION: "ddpdeploy sets it for Volcano; set scheduling.scheduler: volcano",
}


def _own_domain(key: str) -> bool:
    prefix = key.rpartition("/")[0] if "/" in key else ""
    return prefix == OWN_DOMAIN or prefix.endswith("." + OWN_DOMAIN)


def _not_ours(key: str, field: str, written: dict[str, str]) -> None:
    if _own_domain(key):
        raise ValueError(
            f"{show(key)} is under ddpdeploy's own prefix {OWN_DOMAIN}/ (where it keeps the "
            f"saved spec and run record); remove it from {field}, or use a prefix of your "
            "own, e.g. example.com/"
        )
    if key in written:
        raise ValueError(f"{show(key)} is ddpdeploy's own ({written[key]}); remove it from {field}")


def _labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        qualified_name(key, "label key", "team or example.com/team")
        _not_ours(key, "labels", WRITTEN_LABELS)
        label_value(value, "label value")
    return labels


def _annotations(annotations: dict[str, str]) -> dict[str, str]:
    for key in annotations:
        qualified_name(key, "annotation key", "example.com/note")
        _not_ours(key, "annotations", WRITTEN_ANNOTATIONS)
    total = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if total > MAX_USER_ANNOTATIONS:
        raise ValueError(
            f"annotations total {total} bytes; Kubernetes allows 256 KiB per object and "
            f"ddpdeploy adds its own: keep them within {MAX_USER_ANNOTATIONS} bytes"
        )
    return annotations


def script_path(value: str) -> str:
    """command.script: a file of the workspace, by a relative path inside it, on every
    target alike (the image holds the workspace as its working directory; a local run
    starts in it)."""
    parts = value.split("/")
    if value.startswith("/") or "\\" in value:
        why = "is absolute" if value.startswith("/") else "contains '\\'"
    elif ".." in parts and (inside := posixpath.normpath(value)).split("/")[0] not in ("..", "."):
        # Inside after all; one spelling, so one rule checks it (links, .dockerignore).
        raise ValueError(f"{show(value)} goes through '..'; write it as {inside!r}")
    elif ".." in parts and posixpath.normpath(value) == ".":
        why = "names no file"
    elif ".." in parts:
        why = "leaves the workspace ('..')"
    elif value.startswith("-"):
        why = "starts with '-', which torchrun would read as its own option"
    elif any(ord(c) < 32 or ord(c) == 127 for c in value):
        why = "contains a control character"
    elif all(p in ("", ".") for p in parts) or value.endswith("/"):
        why = "names no file"
    else:
        return value
    raise ValueError(
        f"{show(value)} {why}; give the script's path relative to the workspace "
        "(the folder you run ddpdeploy in, which the image copies), e.g. train.py or src/train.py"
    )


def mount_path(value: str) -> str:
    parts = value.split("/")
    if not value.startswith("/") or ".." in parts or any(ord(c) < 32 for c in value):
        raise ValueError(f"mountPath must be an absolute path without '..' (got {show(value)})")
    # normpath keeps a leading "//" (POSIX leaves its meaning open), so "//dev/shm" would
    # slip past the clash rules that compare normalised paths: strip it here first.
    normal = "/" + posixpath.normpath(value).lstrip("/")
    if normal == "/":
        raise ValueError("mountPath '/' would hide the image's whole file system")
    if value.startswith("//"):
        raise ValueError(f"mountPath {show(value)} starts with '//'; write {show(normal)}")
    for kernel in KERNEL_DIRS:
        if normal == kernel or normal.startswith(kernel + "/"):
            raise ValueError(
                f"mountPath {show(value)} is in {kernel}, which the container runtime refuses "
                "to mount over; use another path, e.g. /checkpoints"
            )
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


def json_pattern(pattern: str) -> Callable[[dict[str, Any]], None]:
    def update(schema: dict[str, Any]) -> None:
        schema["pattern"] = _ecma(pattern)

    return update


DnsName = Annotated[str, AfterValidator(_dns1035), Field(json_schema_extra=json_pattern(_DNS1035))]
Namespace = Annotated[
    str, AfterValidator(_dns1123), Field(json_schema_extra=json_pattern(_DNS1123))
]
Subdomain = Annotated[
    str, AfterValidator(_subdomain), Field(json_schema_extra=json_pattern(_SUBDOMAIN))
]
CpuQuantity = Annotated[str, BeforeValidator(_cpu), Field(json_schema_extra=_quantity_schema)]
ByteQuantity = Annotated[str, BeforeValidator(_bytes), Field(json_schema_extra=_quantity_schema)]
ImageRef = Annotated[str, AfterValidator(_image), Field(json_schema_extra=json_pattern(_IMAGE))]
Str = Annotated[str, BeforeValidator(_scalar_to_str), Field(json_schema_extra=_scalar_schema)]
ArgStr = Annotated[Str, AfterValidator(no_expansion)]


def _not_underflowed(value: Any) -> Any:
    """A number written with a non-zero digit that reads as 0 (1e-400) is refused: 0 turns
    off what it sets (the hang watchdog), and that was not asked for."""
    if not isinstance(value, str):
        return value
    number = re.fullmatch(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][+-]?[0-9]+\s*", value, re.ASCII)
    if number and reads_as_zero(value, float(value)):
        raise ValueError(f"{show(value)} is too small a number (it reads as 0)")
    return value


Number = Annotated[float, BeforeValidator(_not_underflowed)]


def _ifnames(value: str) -> str:
    """NCCL_SOCKET_IFNAME: `^` (all but) and/or `=` (exactly), then interface name
    prefixes, comma-separated; Linux names are at most 15 bytes, without '/', ':' or spaces."""
    names = value.removeprefix("^").removeprefix("=").split(",")
    for name in names:
        bad = not re.fullmatch(r"[!-~]{1,15}", name, re.ASCII) or name in (".", "..")
        if bad or re.search(r"[/:,]", name):
            which = show(name) if name == value else f"{show(value)}: {show(name)}"
            raise ValueError(
                f"{which} is not a network interface name (at most 15 characters, no '/', "
                "':' or spaces); e.g. eth0 or ^lo,docker"
            )
    return value


IfNames = Annotated[ArgStr, AfterValidator(_ifnames)]


def _hcas(value: str) -> str:
    """NCCL_IB_HCA: `^` and/or `=`, then adapters as NAME or NAME:PORT, comma-separated."""
    for item in value.removeprefix("^").removeprefix("=").split(","):
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}(:[0-9]{1,3})?", item, re.ASCII):
            which = show(item) if item == value else f"{show(value)}: {show(item)}"
            raise ValueError(
                f"{which} is not an InfiniBand adapter (NAME or NAME:PORT); e.g. mlx5_0,mlx5_1:1"
            )
    return value


Hcas = Annotated[ArgStr, AfterValidator(_hcas)]
EnvMap = Annotated[dict[str, ArgStr], AfterValidator(check_env)]
LabelMap = Annotated[dict[str, Str], AfterValidator(_labels)]
AnnotationMap = Annotated[dict[str, Str], AfterValidator(_annotations)]
# strict: `nodes: true` or `nodes: 2.0` is refused instead of read as 1 or 2.
Int32 = Annotated[int, Field(strict=True, ge=0, le=INT32_MAX)]
Count = Annotated[int, Field(strict=True, ge=1, le=INT32_MAX)]


def at_most(limit: int, why: str) -> Callable[[int], int]:
    """A bound whose one-line error says why it is there (pydantic's `le` says only
    "less than or equal to")."""

    def check(value: int) -> int:
        if value > limit:
            raise ValueError(f"must be at most {limit}{why} (got {value})")
        return value

    return check


# No int32 `le` under these: 2**31 too gets the line that names the real limit.
NodeCount = Annotated[
    int,
    Field(strict=True, ge=1, json_schema_extra={"maximum": MAX_NODES}),
    AfterValidator(
        at_most(MAX_NODES, ", Kubernetes' limit on the pods an Indexed Job runs at once")
    ),
]
ProcCount = Annotated[
    int,
    Field(strict=True, ge=1, json_schema_extra={"maximum": MAX_PER_NODE}),
    AfterValidator(at_most(MAX_PER_NODE, " processes per node; no machine runs more")),
]
GpuCount = Annotated[
    int,
    Field(strict=True, ge=0, json_schema_extra={"maximum": MAX_PER_NODE}),
    AfterValidator(at_most(MAX_PER_NODE, " GPUs per node; no machine has more")),
]


def secret_key(value: str) -> str:
    if len(value) > MAX_DNS_SUBDOMAIN or not re.fullmatch(r"[-._a-zA-Z0-9]+", value):
        raise ValueError(
            f"secret key {show(value)} is invalid: letters, digits, '-', '_', '.', at most "
            f"{MAX_DNS_SUBDOMAIN} characters"
        )
    return value


def extended_resource(value: str) -> str:
    qualified_name(value, "resource", "rdma/hca_shared_devices_a")
    domain = value.partition("/")[0]
    if "/" not in value or domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ValueError(
            f"resource {show(value)} must be a device plugin's domain-qualified name, e.g. "
            "rdma/hca_shared_devices_a or nvidia.com/hostdev"
        )
    return value
