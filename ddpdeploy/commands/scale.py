"""`ddpdeploy scale NAME --nodes N`: resize an elastic job within its MIN:MAX."""

from __future__ import annotations

from typing import Annotated

import typer

from ddpdeploy.errors import OperationError
from ddpdeploy.kubeopts import (
    ContextOpt,
    KubeconfigOpt,
    NameArg,
    NamespaceOpt,
    connect,
    held_signals,
)


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
    from ddpdeploy import deploy
    from ddpdeploy.clusterplan import scaled_spec, with_saved_spec
    from ddpdeploy.kubeopts import interrupted
    from ddpdeploy.targets import SCALABLE, render_objects

    kube = connect(kubeconfig, context)
    ns = namespace or kube.default_namespace
    try:
        found = (kube.get(t.api_version, t.kind, name, ns) for t in SCALABLE)
        job = next(filter(None, found), None)
        if job is None:
            kinds = " or ".join(t.kind for t in SCALABLE)
            raise OperationError(f"no {kinds} {name} in namespace {ns}")
        deploy.require_ours(job, name, "scaled")
        spec = scaled_spec(job, nodes)
        objects = with_saved_spec(render_objects(spec), spec)
        for obj in objects:  # every object we would change must be ours
            meta = obj["metadata"]
            got = kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])
            if got is not None:
                deploy.require_ours(got, name, "scaled")
        for obj in objects:  # all dry-run first, then the PVC (its saved spec), then the job
            kube.apply(obj, dry_run=True)
    except KeyboardInterrupt as exc:
        raise interrupted(exc, "stopped before any change; nothing was changed") from None
    done = f"scaled {job['kind']} {ns}/{name} to {nodes} nodes"
    try:
        with held_signals():  # a few quick applies: all of them, or an error
            for obj in objects:
                kube.apply(obj)
    except KeyboardInterrupt as exc:
        raise interrupted(exc, f"{done} (the change is complete)") from None
    typer.echo(done, err=True)
