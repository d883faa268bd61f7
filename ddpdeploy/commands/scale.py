"""`ddpdeploy scale NAME --nodes N`: resize an elastic job within its MIN:MAX."""

from __future__ import annotations

from typing import Annotated

import typer

from ddpdeploy.errors import OperationError
from ddpdeploy.kubeopts import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt, connect


def scale(
    name: NameArg,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="The new node count.")],
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Set an elastic job's node (Worker) count.

    Example: ddpdeploy scale my-job --nodes 4
    """
    from ddpdeploy.clusterplan import scaled_spec, with_saved_spec
    from ddpdeploy.targets import SCALABLE, render_objects

    kube = connect(kubeconfig, context)
    ns = namespace or kube.default_namespace
    found = (kube.get(t.api_version, t.kind, name, ns) for t in SCALABLE)
    job = next(filter(None, found), None)
    if job is None:
        kinds = " or ".join(t.kind for t in SCALABLE)
        raise OperationError(f"no {kinds} {name} in namespace {ns}")
    spec = scaled_spec(job, nodes)
    objects = with_saved_spec(render_objects(spec), spec)
    for obj in objects:  # all dry-run first, then the PVC (its saved spec), then the job
        kube.apply(obj, dry_run=True)
    for obj in objects:
        kube.apply(obj)
    typer.echo(f"scaled {job['kind']} {ns}/{name} to {nodes} nodes", err=True)
