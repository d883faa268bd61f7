"""Flags shared by every command that needs a JobSpec, declared once.

`spec_command` adds the spec flags (-f, --name, --image, --nodes, …) and the arguments after
``--`` to a command's signature, loads the JobSpec from them, and passes it as ``spec``.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from ddpdeploy.spec import JobSpec, load_spec

SPEC_PANEL = "Job spec (flags override ddpdeploy.yaml)"


def _flag(kind: type, *decls: str, help: str, metavar: str | None = None) -> Any:
    return Annotated[
        kind | None,
        typer.Option(*decls, help=help, metavar=metavar, rich_help_panel=SPEC_PANEL),
    ]


# (parameter name, flag that FLAG_FIELDS knows or None, annotation) for each spec flag.
_SPEC_PARAMS: list[tuple[str, str | None, Any]] = [
    (
        "file",
        None,
        _flag(Path, "-f", "--file", help="Job spec file (default: ./ddpdeploy.yaml when present)."),
    ),
    ("name", "--name", _flag(str, "--name", help="Job name (DNS-1035 label).")),
    (
        "target",
        "--target",
        _flag(
            str,
            "--target",
            metavar="pytorchjob|trainjob|indexed-job",
            help="What runs the job: Kubeflow PyTorchJob (default), Trainer v2 TrainJob, or a "
            "plain Indexed Job (no operator).",
        ),
    ),
    (
        "runtime",
        "--runtime",
        _flag(
            str,
            "--runtime",
            metavar="NAME",
            help="trainjob: the ClusterTrainingRuntime (default torch-distributed).",
        ),
    ),
    ("namespace", "--namespace", _flag(str, "-n", "--namespace", help="Kubernetes namespace.")),
    ("image", "--image", _flag(str, "--image", help="Training image reference.")),
    ("nodes", "--nodes", _flag(int, "--nodes", help="Number of nodes (pods).")),
    ("gpus", "--gpus", _flag(int, "--gpus", help="GPUs per node; 0 runs on CPU with gloo.")),
    (
        "procs",
        "--procs",
        _flag(int, "--procs", help="Processes per node (default: gpus, or 1 on CPU)."),
    ),
    (
        "elastic",
        "--elastic",
        _flag(
            str,
            "--elastic",
            metavar="MIN:MAX",
            help="Elastic c10d rendezvous between MIN and MAX nodes.",
        ),
    ),
    (
        "max_restarts",
        "--max-restarts",
        _flag(int, "--max-restarts", help="torchrun restarts of the worker group."),
    ),
    (
        "scheduler",
        "--scheduler",
        _flag(
            str,
            "--scheduler",
            metavar="default|volcano",
            help="volcano: gang-schedule all nodes with Volcano.",
        ),
    ),
    (
        "queue",
        "--queue",
        _flag(
            str,
            "--queue",
            metavar="NAME",
            help="Kueue LocalQueue (the job starts suspended); with volcano, its queue.",
        ),
    ),
    (
        "rdma",
        "--rdma",
        _flag(
            str,
            "--rdma",
            metavar="RESOURCE=N",
            help="RDMA device plugin resource per node, e.g. rdma/hca_shared_devices_a=1.",
        ),
    ),
    (
        "host_network",
        "--host-network",
        _flag(bool, "--host-network", help="Use the node's network namespace."),
    ),
    (
        "nccl_debug",
        "--nccl-debug",
        _flag(str, "--nccl-debug", metavar="LEVEL", help="NCCL_DEBUG: VERSION|WARN|INFO|TRACE."),
    ),
    (
        "network_policy",
        "--network-policy",
        _flag(
            bool,
            "--network-policy/--no-network-policy",
            help="A NetworkPolicy admitting only the job's own pods (default on).",
        ),
    ),
    (
        "writable_rootfs",
        "--writable-rootfs",
        _flag(
            bool,
            "--writable-rootfs",
            help="Writable image file system, for code that writes into the image.",
        ),
    ),
    (
        "train_args",
        None,
        Annotated[
            list[str] | None,
            typer.Argument(
                metavar="[-- TRAIN_ARGS...]",
                help="Arguments appended to the training command.",
                show_default=False,
            ),
        ],
    ),
]


class TrainArgsCommand(TyperCommand):
    """A command whose training arguments must follow ``--``.

    Without this, a stray word among the flags (`render --image x deploy/`) would silently
    join the training command; with it, that word is refused by name."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if any(p.name == "train_args" for p in self.params):
            head = args[: args.index("--")] if "--" in args else args
            # The command's own parser tells option values from stray words.
            values, _, _ = self.make_parser(ctx).parse_args(args=list(head))
            stray = values.get("train_args")
            if stray:
                ctx.fail(
                    f"unexpected argument {stray[0]!r} before `--`; training arguments go "
                    f"after it: {ctx.command_path} [OPTIONS] -- {' '.join(stray)}"
                )
        return super().parse_args(ctx, args)


def spec_from_params(values: dict[str, Any]) -> JobSpec:
    flags = {flag: values.get(name) for name, flag, _ in _SPEC_PARAMS if flag}
    return load_spec(values.get("file"), flags, values.get("train_args") or None)


def spec_command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``fn(spec, ...)`` the spec flags; Typer reads the merged signature."""
    hints = typing.get_type_hints(fn, include_extras=True)  # resolve postponed annotations
    own = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in inspect.signature(fn).parameters.values()
        if p.name != "spec"
    ]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
        for name, _, ann in _SPEC_PARAMS
    ]

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name, _, _ in _SPEC_PARAMS}
        return fn(spec=spec_from_params(values), **kwargs)

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + extra
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


OutputOpt = Annotated[
    str, typer.Option("-o", "--output", help="Output format: yaml or json.", case_sensitive=False)
]
