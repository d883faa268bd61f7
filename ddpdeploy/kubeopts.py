"""Flags shared by the cluster commands (kubectl's spellings), declared once."""

from __future__ import annotations

from typing import Annotated, Any

import typer

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
NamespaceOpt = Annotated[
    str | None,
    typer.Option(
        "-n",
        "--namespace",
        help="Namespace (default: the context's, else default).",
        rich_help_panel=CLUSTER_PANEL,
    ),
]


def _job_name(value: str) -> str:
    """NAME is checked like the spec's `name` (a DNS-1035 label): it becomes a label selector
    and a folder name, so `../x` or `a,b=c` never reach either."""
    from pydantic import TypeAdapter, ValidationError

    from ddpdeploy.spec import JobSpec

    field = JobSpec.model_fields["name"]  # the field's own grammar, not the whole spec's rules
    try:
        grammar = (field.annotation, *field.metadata)  # Annotated[str, <its validators>]
        TypeAdapter(Annotated[grammar]).validate_python(value)
    except ValidationError as exc:
        shown = repr(value) if len(value) <= 70 else f"{value[:60]!r}…({len(value)} characters)"
        reason = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise typer.BadParameter(f"{shown} {reason} (like the spec's name)") from None
    return value


NameArg = Annotated[
    str,
    typer.Argument(help="The job's name.", show_default=False, metavar="NAME", callback=_job_name),
]


def connect(kubeconfig: str | None, context: str | None) -> Any:
    """A connected `Kube` adapter (imports the kubernetes client only now)."""
    from ddpdeploy.adapters.kube import Kube

    return Kube(kubeconfig, context)


ViewOpt = Annotated[
    str,
    typer.Option("-o", "--output", help="table, json or yaml.", case_sensitive=False),
]
