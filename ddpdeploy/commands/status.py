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
    from ddpdeploy.cluster.jobstate import conditions_state
    from ddpdeploy.cluster.podlogs import rank0_progress
    from ddpdeploy.cluster.watch import kind_of, snapshot_of
    from ddpdeploy.commands import views
    from ddpdeploy.errors import OperationError
    from ddpdeploy.render.output import to_yaml

    hint = "; `ddpdeploy list -n {namespace}` shows the jobs"
    found = open_job(kubeconfig, context, name, namespace, hint=hint)
    unread: str | None = None
    try:
        snap = snapshot_of(found)
    except OperationError as exc:
        # The job was read, its pods were not (RBAC forbids listing them, the list failed):
        # its own state is still shown, then the one line, exit 1 (a partial answer).
        if found.job is None:
            raise
        snap, unread = (found.job, [], conditions_state(found.job)), str(exc)
    job, pods, _ = snap
    training = rank0_progress(found.kube, job, pods, time.time()) if job and pods else None
    if output == "table":
        if unread is None:
            views.print_out(views.table(name, snap))
        else:
            views.print_out(views.title(name, snap))
        views.print_training(training)
    else:
        doc = views.status_doc(name, found.namespace, snap, training)
        if unread is not None:
            doc["pods"], doc["pods_error"] = None, unread
        if output == "json":
            views.print_json(doc)
        else:
            write_stdout(to_yaml(doc))
    if unread is not None:
        where = f"{kind_of(job)} {found.namespace}/{name}"
        raise OperationError(
            f"could not read the pods of {where}: {unread}; its own state is above"
        )
