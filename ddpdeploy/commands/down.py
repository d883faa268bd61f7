"""`ddpdeploy down NAME`: delete the job (its pods and Services go with it) and the objects
we made beside it; keep the checkpoint PVC unless --purge. Only objects ddpdeploy made for
this job are deleted: each is checked before anything is deleted; a job that is not ours is
refused in one line naming it and its owner, an object beside it that is not ours is kept and
named (ddpdeploy.cluster.apply.delete)."""

from __future__ import annotations

from typing import Annotated

import typer

from ddpdeploy.commands.options import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt


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
    from ddpdeploy.cluster.apply import delete
    from ddpdeploy.cluster.find import open_job
    from ddpdeploy.commands.views import say
    from ddpdeploy.signals import interrupted

    try:
        found = open_job(kubeconfig, context, name, namespace, verb="deleted", required=False)
    except KeyboardInterrupt as exc:
        raise interrupted(exc, "nothing was deleted") from None
    delete(found, purge, say)  # says itself what an interrupt left
