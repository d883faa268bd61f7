"""`ddpdeploy status NAME`: the job's state, its reason, and each replica's pod."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.kubeopts import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt, ViewOpt, connect


def status(
    name: NameArg,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: ViewOpt = "table",
) -> None:
    """Show a job's state and pods.

    Example: ddpdeploy status my-job -o yaml
    """
    from ddpdeploy import jobwatch
    from ddpdeploy.render.output import to_yaml
    from ddpdeploy.targets import JOB_KINDS

    fmt = output.lower()
    if fmt not in ("table", "json", "yaml"):
        raise UserError(f"-o/--output: {output!r} is not a format; use table, json or yaml")
    kube = connect(kubeconfig, context)
    ns = namespace or kube.default_namespace
    snap = jobwatch.snapshot(kube, name, ns)
    if snap[0] is None:
        raise OperationError(
            f"no job {name} ({JOB_KINDS}) in namespace {ns}; "
            f"`ddpdeploy list -n {ns}` shows the jobs"
        )
    if fmt == "table":
        Console().print(jobwatch.table(name, snap))
        return
    doc = jobwatch.status_doc(name, ns, snap)
    typer.echo(json.dumps(doc, indent=2) if fmt == "json" else to_yaml(doc), nl=fmt == "json")
