"""`ddpdeploy list`: the jobs ddpdeploy manages, with state, age and size."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

import typer

from ddpdeploy.commands.options import ContextOpt, KubeconfigOpt, ListOutput, NamespaceOpt
from ddpdeploy.formats import age
from ddpdeploy.obj import Obj


def list_jobs(
    namespace: NamespaceOpt = None,
    all_namespaces: Annotated[
        bool, typer.Option("-A", "--all-namespaces", help="Jobs in every namespace.")
    ] = False,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    output: ListOutput = "table",
) -> None:
    """List the jobs (PyTorchJobs, TrainJobs, Jobs) labelled managed-by ddpdeploy.

    Example: ddpdeploy list -A
    """
    from ddpdeploy.adapters.kube import Forbidden
    from ddpdeploy.cluster.find import connect
    from ddpdeploy.cluster.jobstate import conditions_state, job_size, job_state
    from ddpdeploy.cluster.labels import ours_selector
    from ddpdeploy.cluster.watch import job_pods
    from ddpdeploy.commands import views
    from ddpdeploy.errors import OperationError
    from ddpdeploy.targets import TARGETS

    kube = connect(kubeconfig, context)
    ns = None if all_namespaces else namespace or kube.default_namespace
    ours = ours_selector()
    jobs = []
    refused: list[str] = []
    kinds_served = 0
    for t in TARGETS.values():
        if not kube.has_kind(t.api_version, t.kind):  # a CRD the cluster lacks holds no jobs
            continue
        kinds_served += 1
        try:
            jobs += kube.list(t.api_version, t.kind, ns, labels=ours)
        except Forbidden as exc:
            # One kind the user may not list (RBAC for PyTorchJobs only) hides no other.
            refused.append(f"{t.kind}s: {exc}")
    if refused and len(refused) == kinds_served:  # nothing listed: the refusal alone
        raise OperationError(f"could not list {'; '.join(refused)}")
    # The pods too, in one call, so that a job's state is the one `status` gives it (an
    # Unschedulable or crash-looping pod, not the Pending or Running of its conditions).
    pods: list[Obj] | None = None
    if jobs:
        try:
            pods = kube.list("v1", "Pod", ns, labels=ours)
        except Forbidden:
            pods = None  # the states of the jobs' own conditions, as `status` then says
    now = datetime.now(timezone.utc)
    rows = []
    for job in sorted(jobs, key=lambda j: (j["metadata"]["namespace"], j["metadata"]["name"])):
        meta = job["metadata"]
        nodes, gpus = job_size(job)
        rows.append(
            {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "kind": job["kind"],
                "state": (
                    conditions_state(job) if pods is None else job_state(job, job_pods(job, pods))
                ).state,
                "age": age(meta.get("creationTimestamp"), now),
                "nodes": nodes,
                "gpus": gpus,
            }
        )
    if output == "json":
        views.print_json(rows)
    else:
        views.print_out(views.list_table(rows), width=200)
    if refused:  # a partial list is not a success
        kinds = "; ".join(refused)
        raise OperationError(f"could not list {kinds} (the list above lacks them)")
