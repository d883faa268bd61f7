"""`ddpdeploy logs NAME`: the training log of one replica's pod (rank 0's by default)."""

from __future__ import annotations

from typing import Annotated

import typer

from ddpdeploy.errors import OperationError
from ddpdeploy.kubeopts import ContextOpt, KubeconfigOpt, NameArg, NamespaceOpt, connect


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
    from ddpdeploy import jobwatch
    from ddpdeploy.targets import JOB_KINDS, REPLICA_NAMES

    if replica is not None and replica.lower() not in REPLICA_NAMES:
        raise typer.BadParameter(f"use {' or '.join(REPLICA_NAMES)}", param_hint="--replica")
    kube = connect(kubeconfig, context)
    ns = namespace or kube.default_namespace
    job, pods, _ = jobwatch.snapshot(kube, name, ns)
    if job is None:
        raise OperationError(f"no job {name} ({JOB_KINDS}) in namespace {ns}")
    pod = jobwatch.node_pod(job, pods, replica, index) or jobwatch.rank0_pod(kube, job, pods)
    if pod is None:
        raise OperationError(
            f"no pod of {name} has logged rank 0's start yet; pass --replica and --index"
        )
    for line in kube.logs(pod, ns, jobwatch.container_of(job), follow=follow, tail=tail):
        typer.echo(line)
