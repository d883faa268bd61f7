"""`ddpdeploy down NAME`: delete the job (its pods and Services go with it) and the objects
we made beside it; keep the checkpoint PVC unless --purge. Only objects ddpdeploy made for
this job are deleted: each is checked before anything is deleted, and anything else is
refused in one line naming it and its owner."""

from __future__ import annotations

from typing import Annotated

import typer

from ddpdeploy.errors import OperationError
from ddpdeploy.kubeopts import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt, connect


def down(
    name: NameArg,
    purge: Annotated[
        bool,
        typer.Option("--purge", help="Also delete the checkpoint PVC (only one ddpdeploy made)."),
    ] = False,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Delete a job; its checkpoints stay for `resume` unless --purge.

    Example: ddpdeploy down my-job
    """
    from ddpdeploy import deploy
    from ddpdeploy.kubeopts import interrupted
    from ddpdeploy.render.pod import MANAGED_BY
    from ddpdeploy.targets import JOB_KINDS

    kube = connect(kubeconfig, context)
    ns = namespace or kube.default_namespace
    say = lambda text: typer.echo(text, err=True)  # noqa: E731
    done: list[str] = []
    try:
        layout, job = deploy.find_any_job(kube, name, ns)
        if job is not None:
            deploy.require_ours(job, name, "deleted")
        # Objects we render beside the job that deleting it does not delete.
        beside = [*layout.companions(name), (*deploy.NETWORK_POLICY, name)]
        found = []
        for api, kind, other in beside:
            got = kube.get(api, kind, other, ns)
            if got is not None and job is not None:
                deploy.require_ours(got, name, "deleted")
                found.append((api, kind, other))
            elif got is not None and deploy.not_ours(got, name) is None:
                found.append((api, kind, other))  # left by an interrupted `up`
        ours = f"{deploy.INSTANCE_LABEL}={name},{deploy.MANAGED_BY_LABEL}={MANAGED_BY}"
        claims = kube.list("v1", "PersistentVolumeClaim", ns, labels=ours)
        if purge:
            for claim in claims:
                deploy.require_ours(claim, name, "deleted")
        if job is None and not found and not (purge and claims):
            raise OperationError(f"no job {name} ({JOB_KINDS}) in namespace {ns}; nothing deleted")
        if job is not None and kube.delete(layout.api_version, layout.kind, name, ns):
            done.append(f"deleted {layout.kind} {ns}/{name}")
            say(done[-1])
        for api, kind, other in found:
            if kube.delete(api, kind, other, ns):
                done.append(f"deleted {kind} {ns}/{other}")
                say(done[-1])
        for claim in claims:
            pvc = claim["metadata"]["name"]
            if purge:
                kube.delete("v1", "PersistentVolumeClaim", pvc, ns)
                done.append(f"deleted PersistentVolumeClaim {ns}/{pvc}")
                say(done[-1])
            else:
                say(
                    f"kept PersistentVolumeClaim {ns}/{pvc} (checkpoints; `ddpdeploy resume "
                    f"{name}` restarts from them, --purge deletes them)"
                )
    except KeyboardInterrupt as exc:
        what = "; ".join(done) if done else "nothing was deleted"
        raise interrupted(exc, f"{what}; run `ddpdeploy down {name} -n {ns}` again") from None
