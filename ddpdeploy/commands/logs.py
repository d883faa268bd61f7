"""`ddpdeploy logs NAME`: the training log of one replica's pod (rank 0's by default)."""

from __future__ import annotations

from typing import Annotated

import typer

from ddpdeploy.errors import OperationError
from ddpdeploy.kubeopts import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt


def logs(
    name: NameArg,
    replica: Annotated[
        str | None,
        typer.Option(
            "--replica",
            help="PyTorchJob: master or worker (default: the pod hosting rank 0); other "
            "targets: --index alone names the node.",
        ),
    ] = None,
    index: Annotated[
        int | None, typer.Option("--index", min=0, help="Replica (or node) index; default 0.")
    ] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep streaming.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", min=0, help="Last N lines only.")] = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Print a job's training log.

    Example: ddpdeploy logs my-job --replica worker --index 1 --tail 50 --follow
    """
    from ddpdeploy.cluster.find import open_job
    from ddpdeploy.cluster.watch import container_of, node_pod, rank0_pod, snapshot_of
    from ddpdeploy.commands.views import log_line
    from ddpdeploy.targets import REPLICA_NAMES

    if replica is not None and replica.lower() not in REPLICA_NAMES:
        raise typer.BadParameter(f"use {' or '.join(REPLICA_NAMES)}", param_hint="--replica")
    found = open_job(kubeconfig, context, name, namespace)
    job, pods, _ = snapshot_of(found)
    assert job is not None  # found is required
    kind = job["kind"]
    pod = node_pod(job, pods, replica, index)
    named = found.layout.logs_hostname(name, replica, index) is not None
    if pod is None and named:  # a node was named and has no pod: not rank 0's instead
        raise OperationError(
            f"--index: {kind} {found.namespace}/{name} has no pod for node {index} (yet); "
            f"`ddpdeploy status {name} -n {found.namespace}` lists its pods"
        )
    pod = pod or rank0_pod(found.kube, job, pods)
    if pod is None:
        hint = "pass --replica and --index" if found.layout.replica_names else "pass --index"
        raise OperationError(f"no pod of {name} has logged rank 0's start yet; {hint}")
    for line in found.kube.logs(pod, found.namespace, container_of(job), follow=follow, tail=tail):
        log_line(line)
