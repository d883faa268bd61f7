"""`ddpdeploy resume NAME`: resubmit a failed or deleted job from its saved spec, on the
same checkpoint volume, so that the trainer resumes from its newest checkpoint."""

from __future__ import annotations

from ddpdeploy.commands.options import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt


def resume(
    name: NameArg,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Recreate a finished or deleted job as it was last submitted.

    Example: ddpdeploy resume my-job
    """
    from ddpdeploy.cluster import apply
    from ddpdeploy.cluster.find import open_job
    from ddpdeploy.commands.views import say
    from ddpdeploy.signals import nothing_changed_on_interrupt

    with nothing_changed_on_interrupt():  # apply says what an interrupt in it left
        found = open_job(kubeconfig, context, name, namespace, verb="resumed", required=False)
        spec, record = apply.resumable(found, say)  # the record: `up --build`'s, kept
        checked = apply.prepare(found.kube, spec, say, record=record)
        created = apply.apply(found.kube, checked, replace=True, say=say)
    if spec.checkpoint is None:
        say(f"{name} has no checkpoint volume: it starts from step 0")
    for obj in created:
        if obj["kind"] == "PersistentVolumeClaim":  # new, so empty: nothing to resume from
            say(
                f"PersistentVolumeClaim {found.namespace}/{obj['metadata']['name']} was "
                "missing and is new: no checkpoint exists, the job starts from step 0"
            )
    say(f"resubmitted; `ddpdeploy status {name} -n {found.namespace}` shows progress")
