"""`ddpdeploy logs NAME`: every pod's log merged, each line named by its global rank and
node; `--replica/--index` print one pod's log as it is."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.commands.options import (
    ContextOpt,
    KubeconfigOpt,
    NameArg,
    NamespaceOpt,
    count_option,
)
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.signals import aborted
from ddpdeploy.text import show

if TYPE_CHECKING:
    from ddpdeploy.cluster.find import Found
    from ddpdeploy.cluster.podlogs import Select
    from ddpdeploy.obj import Obj


def logs(
    name: NameArg,
    rank: Annotated[
        list[str] | None,
        typer.Option(
            "--rank",
            help="Only these global ranks' lines: repeat it or give a list (--rank 0,3).",
        ),
    ] = None,
    node: Annotated[
        list[int] | None,
        count_option("--node", minimum=0, help="Only node I's pods (repeatable)."),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only lines of the last 10m (90s, 2h, ...).")
    ] = None,
    replica: Annotated[
        str | None,
        typer.Option(
            "--replica",
            help="One pod as it is: a PyTorchJob's master or worker (with --index); "
            "--index N alone names node N's pod on every target.",
        ),
    ] = None,
    index: Annotated[
        int | None,
        count_option(
            "--index",
            minimum=0,
            help="Replica (or node) index; default 0.",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "-f",
            "--follow",
            help="Keep streaming. Merged, it reads a container's next run too (a restart, "
            "a replaced pod) and ends when the job has succeeded or failed.",
        ),
    ] = False,
    tail: Annotated[
        int | None,
        count_option(
            "--tail",
            minimum=1,
            help="Last N lines of each container only.",
        ),
    ] = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Print a job's training log: every pod's lines, each prefixed with its global rank
    and node ([rank5 node1] ...), previous containers of restarted pods first; --follow
    goes on to the next run of a container that restarts, or of a pod replaced.

    Example: ddpdeploy logs my-job --rank 0,3 --since 10m --follow
    """
    from ddpdeploy.cluster.find import open_job
    from ddpdeploy.cluster.podlogs import Select
    from ddpdeploy.formats import parse_duration
    from ddpdeploy.targets import REPLICA_NAMES

    if replica is not None and replica.lower() not in REPLICA_NAMES:
        raise typer.BadParameter(f"use {' or '.join(REPLICA_NAMES)}", param_hint="--replica")
    if (replica is not None or index is not None) and (rank or node):
        flag = "--rank" if rank else "--node"
        raise typer.BadParameter(
            "--replica/--index print one pod's log as it is; drop one of them", param_hint=flag
        )
    select = Select(
        ranks=_ranks(rank),
        nodes=frozenset(node) if node else None,
        tail=_at_most(tail, "--tail", "lines"),
        since_s=_since(since, parse_duration),
    )
    found = open_job(kubeconfig, context, name, namespace)
    try:
        if replica is not None or index is not None:
            _one_pod(found, name, replica, index, follow, select)
        else:
            _merged(found, name, follow, select)
    except KeyboardInterrupt as exc:
        # One line and the signal's own code, as every command ends on Ctrl-C or SIGTERM.
        # The reader threads sit in TLS reads nothing interrupts, and finalizing the
        # interpreter under them can abort: leave at once.
        line, code = aborted(exc)
        with contextlib.suppress(OSError):  # a closed pipe: nothing more to say
            sys.stdout.flush()
            print(line, file=sys.stderr, flush=True)
        os._exit(code)


# The log endpoint's tailLines and sinceSeconds are int64: a larger number is refused here,
# in one line, rather than by the server once per pod.
INT64_MAX = 2**63 - 1
MAX_RANK = 2**31 - 1  # a world size is an int32 (nodes x processes per node)
# The kubelet turns sinceSeconds into a Go time.Duration (int64 nanoseconds): more seconds
# than that holds wrap around to a start in the future, and every log reads as empty.
MAX_SINCE_S = INT64_MAX // 10**9


def _at_most(value: int | None, flag: str, unit: str) -> int | None:
    if value is not None and value > INT64_MAX:
        raise UserError(f"{flag}: {value} {unit} is more than the API takes; at most {INT64_MAX}")
    return value


def _since(text: str | None, parse: Callable[[str, str], float]) -> int | None:
    if text is None:
        return None
    seconds = parse(text, "--since")
    if seconds > MAX_SINCE_S:
        raise UserError(
            f"--since: {show(text)} is longer than the API takes ({MAX_SINCE_S} seconds); "
            "leave --since out for the whole log"
        )
    return max(1, int(seconds))


def _ranks(values: list[str] | None) -> frozenset[int] | None:
    if not values:
        return None
    out: set[int] = set()
    for part in (p.strip() for v in values for p in v.split(",")):
        if not re.fullmatch(r"[0-9]{1,10}", part) or int(part) > MAX_RANK:
            raise typer.BadParameter(
                f"{show(part)} is not a rank; give global ranks like 0 or 0,3", param_hint="--rank"
            )
        out.add(int(part))
    return frozenset(out)


def _merged(found: Found, name: str, follow: bool, select: Select) -> None:
    from ddpdeploy.cluster.podlogs import (
        Source,
        check_ranks,
        followed,
        merged,
        nothing_shown,
        sources,
    )
    from ddpdeploy.cluster.watch import container_of, snapshot_of
    from ddpdeploy.commands.views import rank_line, say
    from ddpdeploy.errors import LogUnavailable
    from ddpdeploy.text import plain

    job, pods, _ = snapshot_of(found)
    assert job is not None  # found is required
    check_ranks(job, select)
    todo = sources(found.layout, job, pods, select)
    if not todo:
        raise OperationError(f"{job['kind']} {found.namespace}/{name} has no pods yet")
    unread: list[str] = []
    gone: list[str] = []

    def failed(source: Source, exc: Exception) -> None:
        if isinstance(exc, LogUnavailable):  # a run the kubelet no longer has: said, once
            gone.append(source.pod)
            say(f"[node{source.node}{' previous' if source.previous else ''}] {plain(exc)}")
            return
        unread.append(source.pod)
        say(f"warning: {plain(exc)}")

    if follow:  # the notices (a restart, a new pod) through say, which makes them plain
        lines = followed(found, job, pods, todo, select, failed, say)
    else:
        lines = iter(merged(found.kube, found.namespace, container_of(job), todo, select, failed))
    shown = 0
    for line in lines:
        rank_line(line.rank, line.node, line.text, line.previous)
        shown += 1
    if not shown and not unread and not gone:  # say why, rather than nothing at all
        read = [p for p in pods if p["metadata"]["name"] in {s.pod for s in todo}]
        say(nothing_shown(read, select, container_of(job)))
    if unread:
        pods_unread = ", ".join(sorted(set(unread)))
        if set(unread) >= {s.pod for s in todo}:  # no other pod's line to point at
            raise OperationError(f"could not read the log of any pod of the job ({pods_unread})")
        raise OperationError(
            f"could not read the log of pod {pods_unread}; the other pods' lines are above"
        )


def _one_pod(
    found: Found, name: str, replica: str | None, index: int | None, follow: bool, select: Select
) -> None:
    from ddpdeploy.cluster.find import find_job
    from ddpdeploy.cluster.watch import (
        check_named,
        container_of,
        job_gone,
        node_pod,
        rank0_pod,
        snapshot_of,
    )
    from ddpdeploy.commands.views import log_line

    job, pods, _ = snapshot_of(found)
    assert job is not None  # found is required
    kind = job["kind"]
    check_named(job, replica, index)
    pod = node_pod(job, pods, replica, index)
    named = found.layout.logs_hostname(job, replica, index) is not None
    if pod is None and named:  # a node was named and has no pod: not rank 0's instead
        raise OperationError(
            f"--index: {kind} {found.namespace}/{name} has no pod for node {index} (yet); "
            f"`ddpdeploy status {name} -n {found.namespace}` lists its pods"
        )
    pod = pod or rank0_pod(found.kube, job, pods)
    if pod is None:
        hint = "pass --replica and --index" if found.layout.replica_names else "pass --index"
        raise OperationError(f"no pod of {name} has logged rank 0's start yet; {hint}")
    container = container_of(job)
    if follow:  # a stream of a container not started yet ends at once, with no line
        _wait_started(found, job, pod, container)
    shown = 0
    for line in found.kube.logs(
        pod, found.namespace, container, follow=follow, tail=select.tail,
        since_seconds=select.since_s,
    ):  # fmt: skip
        log_line(line)
        shown += 1
    if not shown and not follow:  # say why, as the merged logs do, rather than nothing
        from ddpdeploy.cluster.podlogs import nothing_shown
        from ddpdeploy.commands.views import say

        now = found.kube.get("v1", "Pod", pod, found.namespace)
        say(nothing_shown([now] if now else [], select, container))
    if follow:  # the stream ended: the job going away is said, as `logs -f` merged says it
        now = find_job(
            found.kube, name, found.namespace, layouts=(found.layout,), required=False
        ).job
        if (gone := job_gone(job, now)) is not None:
            raise OperationError(f"{gone}; stopped following")


def _wait_started(found: Found, job: Obj, pod: str, container: str) -> None:
    """Until ``pod``'s container has started (once said on stderr): `logs -f` on a pod
    still Pending ended at once, exit 0, without a line. Ends with one line when the pod
    or the job goes away meanwhile."""
    import time

    from ddpdeploy.cluster.find import find_job
    from ddpdeploy.cluster.podlogs import phase_of, run_of
    from ddpdeploy.cluster.watch import job_gone
    from ddpdeploy.commands.views import say

    told = False
    while True:
        now = found.kube.get("v1", "Pod", pod, found.namespace)
        if now is not None and run_of(now, container) is not None:
            return
        current = find_job(
            found.kube, found.name, found.namespace, layouts=(found.layout,), required=False
        ).job
        if (gone := job_gone(job, current)) is not None:
            raise OperationError(f"{gone}; stopped following")
        if now is None:
            raise OperationError(f"pod {pod} is gone before its container started")
        if not told:
            say(f"waiting for pod {pod} to start its container ({phase_of(now, container)})")
            told = True
        time.sleep(1)
