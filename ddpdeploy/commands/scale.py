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
    from ddpdeploy.clusterplan import JOB_API, JOB_KIND, scaled_spec, with_saved_spec
    from ddpdeploy.targets import render_objects

    kube = connect(kubeconfig, context)
    ns = namespace or kube.default_namespace
    job = kube.get(JOB_API, JOB_KIND, name, ns)
    if job is None:
        raise OperationError(f"no PyTorchJob {name} in namespace {ns}")
    spec = scaled_spec(job, nodes)
    objects = with_saved_spec(render_objects(spec), spec)
    for obj in objects:  # all dry-run first, then the PVC (its saved spec), then the job
        kube.apply(obj, dry_run=True)
    for obj in objects:
        kube.apply(obj)
    typer.echo(f"scaled PyTorchJob {ns}/{name} to {nodes} nodes", err=True)
