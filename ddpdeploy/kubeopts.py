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
NameArg = Annotated[str, typer.Argument(help="The job's name.", show_default=False)]


def connect(kubeconfig: str | None, context: str | None) -> Any:
    """A connected `Kube` adapter (imports the kubernetes client only now)."""
    from ddpdeploy.adapters.kube import Kube

    return Kube(kubeconfig, context)


ViewOpt = Annotated[
    str,
    typer.Option("-o", "--output", help="table, json or yaml.", case_sensitive=False),
]
