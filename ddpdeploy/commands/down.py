"""`ddpdeploy down NAME`: delete the job (its pods and Services go with it); keep the
checkpoint PVC unless --purge."""

from __future__ import annotations

from typing import Annotated

import typer

from ddpdeploy.errors import OperationError
from ddpdeploy.kubeopts import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt, connect


def down(
    name: NameArg,
    purge: Annotated[
        bool, typer.Option("--purge", help="Also delete the job's checkpoint PVC.")
    ] = False,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Delete a job; its checkpoints stay for `resume` unless --purge.

    Example: ddpdeploy down my-job
    """
    from ddpdeploy.jobwatch import find_job
    from ddpdeploy.render.pod import MANAGED_BY
    from ddpdeploy.targets import JOB_KINDS

    kube = connect(kubeconfig, context)
    ns = namespace or kube.default_namespace
    layout, job = find_job(kube, name, ns)
    deleted = job is not None and kube.delete(layout.api_version, layout.kind, name, ns)
    if deleted:
        typer.echo(f"deleted {layout.kind} {ns}/{name}", err=True)
        for api, kind, other in layout.companions(name):
            if kube.delete(api, kind, other, ns):
                typer.echo(f"deleted {kind} {ns}/{other}", err=True)
    ours = f"app.kubernetes.io/instance={name},app.kubernetes.io/managed-by={MANAGED_BY}"
    claims = kube.list("v1", "PersistentVolumeClaim", ns, labels=ours)
    if not deleted and not (purge and claims):
        raise OperationError(f"no job {name} ({JOB_KINDS}) in namespace {ns}; nothing deleted")
    for claim in claims:
        pvc = claim["metadata"]["name"]
        if purge:
            kube.delete("v1", "PersistentVolumeClaim", pvc, ns)
            typer.echo(f"deleted PersistentVolumeClaim {ns}/{pvc}", err=True)
        else:
            typer.echo(
                f"kept PersistentVolumeClaim {ns}/{pvc} (checkpoints; `ddpdeploy resume {name}` "
                "restarts from them, --purge deletes them)",
                err=True,
            )
