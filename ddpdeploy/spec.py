"""JobSpec: the one validated description of a training job that every command speaks.

Loaded from ``ddpdeploy.yaml`` (camelCase keys, like Kubernetes) and overridden by CLI flags.
Validation errors become one line naming the field (or the flag) and what is allowed.
"""

from __future__ import annotations

import os
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

# Model classes build their validators at definition; pydantic then scans every installed
# distribution's entry points for plugins, a large share of `ddpdeploy render`'s start-up.
# ddpdeploy uses none, so the scan is skipped while the classes below are defined, and the
# user's setting is restored afterwards (children such as torchrun inherit it unchanged).
_USER_PLUGINS = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"

DEFAULT_FILE = "ddpdeploy.yaml"
DEFAULT_PORT = 23456  # the operator's default for the port named pytorchjob-port
# Pod and per-pod Service names are "<job>-worker-<i>"; Services must be DNS-1035 labels.
MAX_DNS_LABEL = 63

# Patterns as strings: `re` compiles (and caches) only those a run uses, at first use.
_DNS1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_DNS1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Kubernetes resource.Quantity, as the apiserver's own pattern accepts it.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
_QUANTITY = rf"^[+]?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?{_NUMBER}))?$"
# Image reference grammar of the distribution project: [domain[:port]/]path[:tag][@digest].
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = (
    rf"^(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def _dns_label(pattern: str, rule: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if len(value) > MAX_DNS_LABEL or not re.match(pattern, value):
            raise ValueError(f"must be a {rule}, at most {MAX_DNS_LABEL} characters")
        return value

    return check


_dns1035 = _dns_label(
    _DNS1035,
    "DNS-1035 label: lowercase letters, digits and '-', starting with a letter, ending with "
    "a letter or digit",
)
_dns1123 = _dns_label(
    _DNS1123,
    "DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit",
)


def _quantity(value: Any) -> str:
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not re.match(_QUANTITY, text):
        raise ValueError(
            f"{value!r} is not a Kubernetes quantity: use a number with an optional suffix, "
            "e.g. 500m, 4, 16Gi, 512Mi"
        )
    return text


def _image(value: str) -> str:
    if not re.match(_IMAGE, value):
        raise ValueError(
            f"{value!r} is not an image reference: use [registry[:port]/]repo[:tag][@sha256:…] "
            "with a lowercase repository, e.g. ghcr.io/team/train:v1"
        )
    return value


def _scalar_to_str(value: Any) -> Any:
    # YAML reads `OMP_NUM_THREADS: 4` as an int; env values and labels are strings.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def _env_names(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not re.match(_ENV_NAME, key):
            raise ValueError(
                f"env name {key!r} is invalid: use letters, digits, '_', '-', '.', "
                "not starting with a digit"
            )
    return env


def _labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        if not re.match(_QUALIFIED_NAME, key) or len(key.rsplit("/", 1)[-1]) > 63:
            raise ValueError(f"label key {key!r} is not a qualified name (e.g. team or a.b/team)")
        if len(value) > 63 or not re.match(_LABEL_VALUE, value):
            raise ValueError(
                f"label value {value!r} is invalid: at most 63 letters, digits, '-', '_', '.', "
                "starting and ending with a letter or digit"
            )
    return labels


def _annotation_keys(annotations: dict[str, str]) -> dict[str, str]:
    for key in annotations:
        if not re.match(_QUALIFIED_NAME, key):
            raise ValueError(f"annotation key {key!r} is not a qualified name (e.g. a.b/note)")
    return annotations


DnsName = Annotated[str, AfterValidator(_dns1035)]
Namespace = Annotated[str, AfterValidator(_dns1123)]
Quantity = Annotated[str, BeforeValidator(_quantity)]
ImageRef = Annotated[str, AfterValidator(_image)]
Str = Annotated[str, BeforeValidator(_scalar_to_str)]
EnvMap = Annotated[dict[str, Str], AfterValidator(_env_names)]
LabelMap = Annotated[dict[str, Str], AfterValidator(_labels)]
AnnotationMap = Annotated[dict[str, Str], AfterValidator(_annotation_keys)]


class Model(BaseModel):
    """camelCase keys in files, snake_case in Python; unknown keys are errors."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Command(Model):
    """What torchrun starts on every node. Neither script nor module: the built-in trainer."""

    script: str | None = None
    module: str | None = None
    args: list[Str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_entry(self) -> Command:
        if self.script and self.module:
            raise ValueError("set either script or module, not both")
        return self

    @property
    def builtin(self) -> bool:
        return not (self.script or self.module)


class Rendezvous(Model):
    """static: fixed node count, rank 0 on master-0. elastic: c10d with min:max nodes."""

    mode: Literal["static", "elastic"] = "static"
    min_nodes: int | None = Field(default=None, ge=1)
    max_nodes: int | None = Field(default=None, ge=1)
    max_restarts: int | None = Field(default=None, ge=0)
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    # How long agents wait for all peers (and their DNS) before giving up, in seconds.
    join_timeout: int = Field(default=900, ge=1)

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

    claim_name: Namespace | None = None
    size: Quantity | None = None
    storage_class: str | None = None
    # Several pods mount it: under c10d global rank 0 can land on any of them.
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = "ReadWriteMany"
    mount_path: str = "/checkpoints"

    @model_validator(mode="after")
    def _one_source(self) -> Checkpoint:
        if bool(self.claim_name) == bool(self.size):
            raise ValueError(
                "set claimName (an existing PVC) or size (a new PVC), exactly one of them"
            )
        if self.storage_class and not self.size:
            raise ValueError("storageClass applies only to a new PVC (set size)")
        if not self.mount_path.startswith("/"):
            raise ValueError("mountPath must be an absolute path")
        return self


class Toleration(Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class RunPolicy(Model):
    backoff_limit: int | None = Field(default=None, ge=0)
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    clean_pod_policy: Literal["None", "Running", "All"] | None = None


class JobSpec(Model):
    """One training job: what runs, on how many nodes, with what resources."""

    name: DnsName = "ddp-train"
    namespace: Namespace = "default"
    image: ImageRef | None = None
    nodes: int = Field(default=1, ge=1)
    gpus: int = Field(default=0, ge=0, description="GPUs per node; 0 is a CPU job")
    procs: int | None = Field(default=None, ge=1, description="processes per node")
    cpu: Quantity | None = None
    memory: Quantity | None = None
    command: Command = Field(default_factory=Command)
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)
    checkpoint: Checkpoint | None = None
    # /dev/shm is 64 MB in pods; DataLoader workers and NCCL need more. null: no mount.
    shm_size: Quantity | None = "2Gi"
    # On pod deletion torchrun forwards SIGTERM and gives workers 30 s before SIGKILL; the
    # trainer needs a step plus a checkpoint write on top, and Kubernetes' default is 30 s.
    termination_grace_period_seconds: int = Field(default=120, ge=0)
    env: EnvMap = Field(default_factory=dict)
    image_pull_secrets: list[Namespace] = Field(default_factory=list)
    node_selector: dict[str, Str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    service_account: Namespace | None = None
    priority_class: Namespace | None = None
    labels: LabelMap = Field(default_factory=dict)
    annotations: AnnotationMap = Field(default_factory=dict)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)

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
        longest = f"{self.name}-worker-{self.max_nodes - 1}"
        if len(longest) > MAX_DNS_LABEL:
            raise ValueError(
                f"name is too long: pod and Service names like {longest!r} must stay within "
                f"{MAX_DNS_LABEL} characters; shorten name to at most "
                f"{self.name_budget} characters"
            )
        return self

    @property
    def max_nodes(self) -> int:
        return self.rendezvous.max_nodes or self.nodes

    @property
    def name_budget(self) -> int:
        return MAX_DNS_LABEL - len(f"-worker-{self.max_nodes - 1}")

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

# Flags that override file fields: flag name -> path in the spec document.
FLAG_FIELDS: dict[str, tuple[str, ...]] = {
    "--name": ("name",),
    "--namespace": ("namespace",),
    "--image": ("image",),
    "--nodes": ("nodes",),
    "--gpus": ("gpus",),
    "--procs": ("procs",),
    "--max-restarts": ("rendezvous", "maxRestarts"),
    "--elastic": ("rendezvous",),
}


def parse_elastic(text: str) -> dict[str, Any]:
    """``MIN:MAX`` -> the rendezvous fields it sets."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not match:
        raise UserError(f"--elastic: {text!r} is not MIN:MAX; use two node counts, e.g. 1:4")
    return {"mode": "elastic", "minNodes": int(match[1]), "maxNodes": int(match[2])}


def read_spec_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(
            f"-f/--file: {path} not found; create one with `ddpdeploy init` or pass -f PATH"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise UserError(f"-f/--file: cannot read {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
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


def load_spec(
    path: Path | None = None,
    flags: dict[str, Any] | None = None,
    extra_args: list[str] | None = None,
) -> JobSpec:
    """File (if any), then flags (flags win), then args after ``--``: one validated JobSpec.

    ``flags`` maps flag names (keys of FLAG_FIELDS) to values; None means "not given".
    With no path, ``./ddpdeploy.yaml`` is read when it exists, else the defaults apply.
    """
    source = str(path) if path else DEFAULT_FILE
    if path is not None:
        doc = read_spec_file(path)
    elif Path(DEFAULT_FILE).is_file():
        doc = read_spec_file(Path(DEFAULT_FILE))
    else:
        doc, source = {}, "defaults"
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    for flag, value in given.items():
        field_path = FLAG_FIELDS[flag]
        if flag == "--elastic":
            rdzv = dict(doc.get("rendezvous") or {})
            rdzv.update(parse_elastic(value))
            doc["rendezvous"] = rdzv
            continue
        target = doc
        for key in field_path[:-1]:
            target = target.setdefault(key, {})
            if not isinstance(target, dict):
                raise UserError(f"{source}: {key} must be a mapping")
        target[field_path[-1]] = value
    if extra_args:
        command = dict(doc.get("command") or {})
        command["args"] = [*(command.get("args") or []), *extra_args]
        doc["command"] = command
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        raise UserError(_one_line(exc, source, given)) from None


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
        message = f"unknown field {loc[-1]!r}; `ddpdeploy init` writes a file listing every field"
        where = f"{prefix}{'.'.join(loc[:-1]) or '(top level)'}"
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    else:
        message = message.replace("Input should be", "must be")
        if "input" in first and not isinstance(first["input"], dict | list):
            message += f" (got {first['input']!r})"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if where == "defaults":
        return f"{message}{more}"
    return f"{where}: {message}{more}"
