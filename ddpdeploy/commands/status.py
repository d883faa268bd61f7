"""`ddpdeploy status NAME`: the job's state, its reason, each replica's pod, and the
training itself as rank 0's latest events tell it (read through the log endpoint)."""

from __future__ import annotations

from ddpdeploy.commands.options import (
    ContextOpt,
    KubeconfigOpt,
    NameArg,
    NamespaceOpt,
    StatusOutput,
)


def status(
    name: NameArg,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: StatusOutput = "table",
) -> None:
    """Show a job's state, its pods and its training (step, ETA, loss, checkpoint, probe,
    stragglers, hang, what ran) from rank 0's latest events.

    Example: ddpdeploy status my-job -o yaml
    """
    import time

    from ddpdeploy.adapters.stdout import write_stdout
    from ddpdeploy.cluster.find import open_job
    from ddpdeploy.cluster.podlogs import rank0_progress
    from ddpdeploy.cluster.watch import snapshot_of
    from ddpdeploy.commands import views
    from ddpdeploy.render.output import to_yaml

    hint = "; `ddpdeploy list -n {namespace}` shows the jobs"
    found = open_job(kubeconfig, context, name, namespace, hint=hint)
    snap = snapshot_of(found)
    job, pods, _ = snap
    training = rank0_progress(found.kube, job, pods, time.time()) if job and pods else None
    if output == "table":
        views.print_out(views.table(name, snap))
        views.print_training(training)
        return
    doc = views.status_doc(name, found.namespace, snap, training)
    if output == "json":
        views.print_json(doc)
    else:
        write_stdout(to_yaml(doc))
