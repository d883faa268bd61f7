"""`ddpdeploy resume NAME`: resubmit a failed or deleted job from its saved spec, on the
same checkpoint volume, so that the trainer resumes from its newest checkpoint."""

from __future__ import annotations

import typer

from ddpdeploy.kubeopts import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt, connect


def resume(
    name: NameArg,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Recreate a finished or deleted job as it was last submitted.

    Example: ddpdeploy resume my-job
    """
    from ddpdeploy import deploy
    from ddpdeploy.clusterplan import with_saved_spec
    from ddpdeploy.kubeopts import interrupted
    from ddpdeploy.targets import render_objects

    kube = connect(kubeconfig, context)
    ns = namespace or kube.default_namespace
    try:
        spec = deploy.find_saved_spec(kube, name, ns)
        objects = with_saved_spec(render_objects(spec), spec)
        plan = deploy.preflight(kube, spec, objects, create_namespace=False)
    except KeyboardInterrupt as exc:
        raise interrupted(exc, "stopped before any change; nothing was changed") from None
    deploy.apply(kube, plan, replace=True, say=lambda text: typer.echo(text, err=True))
    typer.echo(f"resubmitted; `ddpdeploy status {name} -n {ns}` shows progress", err=True)
