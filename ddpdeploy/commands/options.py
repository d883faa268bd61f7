"""The CLI's flags, declared once: each spec flag's spelling, help, and where it goes in the
spec (the spec itself knows no flag spellings); the cluster commands' flags; -o/--output.

`spec_command` adds the spec flags (-f, --name, --image, --nodes, …) and the arguments after
``--`` to a command's signature, loads the JobSpec from them, and passes it as ``spec``.
Declaring them loads no spec model: `--help` and completion stay fast; the spec loads when a
command runs.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast, overload

import typer

from ddpdeploy.errors import UserError
from ddpdeploy.rules import TARGET_NAMES
from ddpdeploy.text import reads_as_zero, show

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec

SPEC_PANEL = "Job spec (flags override ddpdeploy.yaml)"


def parse_rdma(text: str) -> dict[str, Any]:
    """``RESOURCE=N`` -> the network.rdma mapping."""
    match = re.fullmatch(r"([^=\s]+)=([0-9]{1,100})", text)
    if not match:
        raise UserError(
            f"--rdma: {show(text)} is not RESOURCE=N; use the device plugin's resource and a "
            "count, e.g. rdma/hca_shared_devices_a=1"
        )
    return {"resource": match[1], "count": int(match[2])}


def parse_elastic(text: str) -> dict[str, Any]:
    """``MIN:MAX`` -> the rendezvous fields it sets."""
    match = re.fullmatch(r"([0-9]{1,100}):([0-9]{1,100})", text)
    if not match:
        raise UserError(f"--elastic: {show(text)} is not MIN:MAX; use two node counts, e.g. 1:4")
    return {"mode": "elastic", "minNodes": int(match[1]), "maxNodes": int(match[2])}


# What the spec takes for a count and a number (docs/spec.md): Python's int() and float()
# would also take `1_0` (ten: a typo of 1.5 as 1_5 is fifteen), ' 2 ' and, for a count, 2.0.
_WHOLE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
_MOST_DIGITS = 100  # past this a count is out of every range (and int() refuses 4300)


def whole(minimum: int | None = None) -> Callable[[Any], int]:
    """The parser of a count flag: plain decimal digits, at least ``minimum``."""

    def parse(value: Any) -> int:
        if not isinstance(value, str):  # a default
            return int(value)
        if not _WHOLE.fullmatch(value):
            raise typer.BadParameter(f"write {show(value)} as a plain decimal integer, e.g. 2")
        if len(value.lstrip("+-")) > _MOST_DIGITS:
            raise typer.BadParameter(f"{show(value)} is more than any count")
        if minimum is not None and int(value) < minimum:
            raise typer.BadParameter(f"{int(value)} is less than {minimum}")
        return int(value)

    return parse


def decimal(minimum: float | None = None) -> Callable[[Any], float]:
    """The parser of a number flag: a plain decimal (1.5, 2, 1e-3), at least ``minimum``;
    never nan or inf, which pass every comparison's check or none."""

    def parse(value: Any) -> float:
        if not isinstance(value, str):  # a default
            return float(value)
        if not _DECIMAL.fullmatch(value):
            raise typer.BadParameter(f"write {show(value)} as a plain decimal number, e.g. 1.5")
        number = float(value)
        if number in (float("inf"), float("-inf")):
            raise typer.BadParameter(f"{show(value)} is too large a number")
        if reads_as_zero(value, number):
            raise typer.BadParameter(f"{show(value)} is too small a number (it reads as 0)")
        if minimum is not None and number < minimum:
            raise typer.BadParameter(f"{number:g} is less than {minimum:g}")
        return number

    return parse


def count_option(
    *decls: str, minimum: int | None = None, metavar: str | None = None, **kwargs: Any
) -> Any:
    """A typer.Option holding a count: parsed by `whole`, shown as INTEGER by default."""
    return typer.Option(*decls, parser=whole(minimum), metavar=metavar or "INTEGER", **kwargs)


def number_option(
    *decls: str, minimum: float | None = None, metavar: str | None = None, **kwargs: Any
) -> Any:
    """A typer.Option holding a number: parsed by `decimal`, shown as FLOAT by default."""
    return typer.Option(*decls, parser=decimal(minimum), metavar=metavar or "FLOAT", **kwargs)


@dataclass(frozen=True)
class SpecFlag:
    """One flag that overrides a spec field."""

    param: str  # the command function's parameter
    decls: tuple[str, ...]  # its spellings; the last long one names it in errors
    kind: type
    help: str
    path: tuple[str, ...]  # where it goes in the spec document
    metavar: str | None = None
    convert: Callable[[Any], Any] | None = None  # when the value is not the field's as typed

    @property
    def flag(self) -> str:
        return self.decls[-1].split("/")[0]

    def annotation(self) -> Any:
        make = {int: count_option, float: number_option}.get(self.kind, typer.Option)
        option = make(*self.decls, help=self.help, metavar=self.metavar, rich_help_panel=SPEC_PANEL)
        return Annotated[self.kind | None, option]


# In the order errors name them when several flags touch one field.
SPEC_FLAGS: tuple[SpecFlag, ...] = (
    SpecFlag("name", ("--name",), str, "Job name (DNS-1035 label).", ("name",)),
    SpecFlag(
        "target",
        ("--target",),
        str,
        "What runs the job: Kubeflow PyTorchJob (default), Trainer v2 TrainJob, or a "
        "plain Indexed Job (no operator).",
        ("target",),
        metavar="|".join(TARGET_NAMES),
    ),
    SpecFlag(
        "runtime",
        ("--runtime",),
        str,
        "trainjob: the ClusterTrainingRuntime (default torch-distributed).",
        ("runtime",),
        metavar="NAME",
    ),
    SpecFlag(
        "namespace",
        ("-n", "--namespace"),
        str,
        "Kubernetes namespace (over the spec's; `up` with neither takes the kubeconfig "
        "context's, else default).",
        ("namespace",),
    ),
    SpecFlag("image", ("--image",), str, "Training image reference.", ("image",)),
    SpecFlag("nodes", ("--nodes",), int, "Number of nodes (pods).", ("nodes",)),
    SpecFlag("gpus", ("--gpus",), int, "GPUs per node; 0 runs on CPU with gloo.", ("gpus",)),
    SpecFlag(
        "procs", ("--procs",), int, "Processes per node (default: gpus, or 1 on CPU).", ("procs",)
    ),
    SpecFlag(
        "cpu",
        ("--cpu",),
        str,
        "CPU request per node (pod), e.g. 8 or 500m (default: one per process; no limit).",
        ("cpu",),
        metavar="QUANTITY",
    ),
    SpecFlag(
        "memory",
        ("--memory",),
        str,
        "Memory per node (pod), request and limit, e.g. 64Gi (default: 4Gi per process).",
        ("memory",),
        metavar="QUANTITY",
    ),
    SpecFlag(
        "max_restarts",
        ("--max-restarts",),
        int,
        "torchrun restarts of the worker group.",
        ("rendezvous", "maxRestarts"),
    ),
    SpecFlag(
        "elastic",
        ("--elastic",),
        str,
        "Elastic c10d rendezvous between MIN and MAX nodes.",
        ("rendezvous",),
        metavar="MIN:MAX",
        convert=parse_elastic,
    ),
    SpecFlag(
        "scheduler",
        ("--scheduler",),
        str,
        "volcano: gang-schedule all nodes with Volcano.",
        ("scheduling", "scheduler"),
        metavar="default|volcano",
    ),
    SpecFlag(
        "queue",
        ("--queue",),
        str,
        "Kueue LocalQueue (the job starts suspended); with volcano, its queue.",
        ("scheduling", "queue"),
        metavar="NAME",
    ),
    SpecFlag(
        "rdma",
        ("--rdma",),
        str,
        "RDMA device plugin resource per node, e.g. rdma/hca_shared_devices_a=1.",
        ("network", "rdma"),
        metavar="RESOURCE=N",
        convert=parse_rdma,
    ),
    SpecFlag(
        "host_network",
        ("--host-network",),
        bool,
        "Use the node's network namespace.",
        ("network", "hostNetwork"),
    ),
    SpecFlag(
        "nccl_debug",
        ("--nccl-debug",),
        str,
        "NCCL_DEBUG: VERSION|WARN|INFO|TRACE.",
        ("network", "ncclDebug"),
        metavar="LEVEL",
    ),
    SpecFlag(
        "network_policy",
        ("--network-policy/--no-network-policy",),
        bool,
        "A NetworkPolicy admitting only the job's own pods (default on).",
        ("network", "policy"),
    ),
    SpecFlag(
        "no_probe",
        ("--no-probe",),
        bool,
        "Skip ddpkit's collective probe at start-up.",
        ("diagnostics", "probe"),
        convert=lambda skip: not skip,
    ),
    SpecFlag(
        "probe_min_busbw",
        ("--probe-min-busbw",),
        float,
        "The probe's floor in GB/s (> 0): below it the run stops before step 1.",
        ("diagnostics", "probeMinBusbw"),
        metavar="GBPS",
    ),
    SpecFlag(
        "hang_timeout",
        ("--hang-timeout",),
        float,
        "Seconds without a finished step before the hang watchdog ends the run (0: off).",
        ("diagnostics", "hangTimeoutSeconds"),
        metavar="SECONDS",
    ),
    SpecFlag(
        "ranks_every",
        ("--ranks-every",),
        int,
        "Steps between two per-rank timing (`ranks`) events.",
        ("diagnostics", "ranksEvery"),
        metavar="N",
    ),
    SpecFlag(
        "straggler_factor",
        ("--straggler-factor",),
        float,
        "How much slower than the median (> 1) a straggler rank is.",
        ("diagnostics", "stragglerFactor"),
        metavar="F",
    ),
    SpecFlag(
        "writable_rootfs",
        ("--writable-rootfs",),
        bool,
        "Writable image file system, for code that writes into the image.",
        ("security", "readOnlyRootFilesystem"),
        convert=lambda writable: not writable,
    ),
)
_BY_FLAG = {f.flag: f for f in SPEC_FLAGS}

FileOpt = Annotated[
    Path | None,
    typer.Option(
        "-f",
        "--file",
        help="Job spec file (default: ./ddpdeploy.yaml when present).",
        rich_help_panel=SPEC_PANEL,
    ),
]
TrainArgs = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[-- TRAIN_ARGS...]",
        help="Arguments appended to the training command.",
        show_default=False,
    ),
]
# The parameters spec_command adds: the file, every spec flag, the training arguments.
_SPEC_PARAMS: list[tuple[str, Any]] = [
    ("file", FileOpt),
    *((f.param, f.annotation()) for f in SPEC_FLAGS),
    ("train_args", TrainArgs),
]


def spec_from_flags(
    path: Path | None = None,
    flags: dict[str, Any] | None = None,
    extra_args: list[str] | None = None,
) -> JobSpec:
    """The spec from ``path`` (or ./ddpdeploy.yaml) and ``flags`` by flag name (--nodes, …;
    None means not given), then ``extra_args``; errors name the flag that set a field."""
    from ddpdeploy.spec import Override, load_spec

    given = {k: v for k, v in (flags or {}).items() if v is not None}
    unknown = set(given) - set(_BY_FLAG)
    if unknown:
        raise KeyError(f"not a spec flag: {sorted(unknown)[0]}")
    overrides = [
        Override(f.flag, f.path, given[f.flag], f.convert) for f in SPEC_FLAGS if f.flag in given
    ]
    return load_spec(path, overrides, extra_args)


def spec_from_params(values: dict[str, Any]) -> JobSpec:
    flags = {f.flag: values.get(f.param) for f in SPEC_FLAGS}
    return spec_from_flags(values.get("file"), flags, values.get("train_args") or None)


def _hints_but_spec(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s parameter annotations, evaluated (they are postponed strings), all but
    ``spec``'s: a command module imports JobSpec for type checking only."""
    hints = {}
    for name, annotation in fn.__annotations__.items():
        if name not in ("spec", "spec_file", "train_args", "return"):
            is_text = isinstance(annotation, str)
            hints[name] = eval(annotation, fn.__globals__) if is_text else annotation
    return hints


@overload
def spec_command(fn: Callable[..., Any]) -> Callable[..., Any]: ...
@overload
def spec_command(
    fn: None = None, *, without: tuple[str, ...] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def spec_command(fn: Callable[..., Any] | None = None, *, without: tuple[str, ...] = ()) -> Any:
    """Give ``fn(spec, ...)`` the spec flags; Typer reads the merged signature.

    ``without``: spec flags (by parameter) the command does not take because one of its own
    options has that name (compose's ``--cpu/--gpu``); any other clash is a TypeError here.
    A ``spec_file`` parameter of ``fn`` (no option) gets the file the spec was read from,
    or None (spec.load.spec_file); a ``train_args`` one, the arguments after ``--`` alone."""
    if fn is None:
        return functools.partial(spec_command, without=without)
    hints = _hints_but_spec(fn)
    given = inspect.signature(fn).parameters
    own = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in given.values()
        if p.name not in ("spec", "spec_file", "train_args")
    ]
    taken = [(name, ann) for name, ann in _SPEC_PARAMS if name not in without]
    clash = {p.name for p in own} & {name for name, _ in taken}
    if clash:
        raise TypeError(f"{fn.__name__}: own option(s) {sorted(clash)} clash with spec flags")
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
        for name, ann in taken
    ]

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name, _ in taken}
        spec = spec_from_params(values)
        if "spec_file" in given:
            from ddpdeploy.spec import spec_file

            kwargs["spec_file"] = spec_file(values.get("file"))
        if "train_args" in given:
            kwargs["train_args"] = list(values.get("train_args") or [])
        return fn(spec=spec, **kwargs)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + extra
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


# --- the cluster commands' flags (kubectl's spellings) ---------------------------------

CLUSTER_PANEL = "Cluster"

KubeconfigOpt = Annotated[
    str | None,
    typer.Option(
        "--kubeconfig",
        help="Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the pod's account).",
        rich_help_panel=CLUSTER_PANEL,
    ),
]
ContextOpt = Annotated[
    str | None,
    typer.Option("--context", help="Kubeconfig context to use.", rich_help_panel=CLUSTER_PANEL),
]


def grammar_error(grammar: Any, value: str) -> str | None:
    """Why ``value`` fails ``grammar`` (a type with its validators, e.g. the spec's
    ImageRef), as the reason of one line; None when it passes."""
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(grammar).validate_python(value)
    except ValidationError as exc:
        return str(exc.errors(include_url=False)[0]["msg"]).removeprefix("Value error, ")
    return None


def _like_spec_field(field_name: str, value: str) -> str:
    """``value`` checked by the spec field's own grammar (not the whole spec's rules); a
    typer.BadParameter (one line, exit 2) naming what it must be."""
    from ddpdeploy.spec import JobSpec

    field = JobSpec.model_fields[field_name]
    grammar = (field.annotation, *field.metadata)  # Annotated[str, <its validators>]
    reason = grammar_error(cast(Any, Annotated[grammar]), value)
    if reason is not None:
        shown = repr(value) if len(value) <= 70 else f"{value[:60]!r}…({len(value)} characters)"
        raise typer.BadParameter(f"{shown} {reason} (like the spec's {field_name})")
    return value


def _namespace(value: str | None) -> str | None:
    """-n is checked like the spec's `namespace` (a DNS-1123 label) before any request: a
    name the API cannot hold (`H4-A`, `a/../x`) is bad input, not "no job in namespace"."""
    return None if value is None else _like_spec_field("namespace", value)


NamespaceOpt = Annotated[
    str | None,
    typer.Option(
        "-n",
        "--namespace",
        help="Namespace (default: the kubeconfig context's, else default).",
        rich_help_panel=CLUSTER_PANEL,
        callback=_namespace,
    ),
]


def _job_name(value: str) -> str:
    """NAME is checked like the spec's `name` (a DNS-1035 label): it becomes a label selector
    and a folder name, so `../x` or `a,b=c` never reach either."""
    return _like_spec_field("name", value)


NameArg = Annotated[
    str,
    typer.Argument(help="The job's name.", show_default=False, metavar="NAME", callback=_job_name),
]

# --- -o/--output: one flag; each command names the formats it has, Typer checks them --------

_OUTPUT = ("-o", "--output")
ObjectsOutput = Annotated[
    Literal["yaml", "json"],
    typer.Option(*_OUTPUT, case_sensitive=False, help="Output format."),
]
StatusOutput = Annotated[
    Literal["table", "json", "yaml"],
    typer.Option(*_OUTPUT, case_sensitive=False, help="Output format."),
]
ListOutput = Annotated[
    Literal["table", "json"],
    typer.Option(*_OUTPUT, case_sensitive=False, help="Output format."),
]


def seconds_above_0(value: float) -> float:
    """A --timeout: a number of seconds above 0 (`decimal` refuses nan and inf)."""
    import math

    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value:g} is not a number of seconds above 0 (e.g. 300)")
    return value
