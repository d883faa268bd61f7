"""Every pod's log of a job, merged: each line attributed to its global rank (torchrun's
line prefix, RANK_OUTPUT_ENV) and its node (the pod's place in the target's layout).

Under c10d the global ranks follow join order, so a node's ranks are read from its lines,
never computed from its place. Lines without a rank prefix (the agent's own, a launcher's)
belong to their node only. Previous containers (of pods that restarted) come first. Read
with the kubelet's timestamps, so lines of different pods merge in the order written.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ddpdeploy.adapters.kube import Kube
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.smoke.events import Progress, parse_event, progress, split_rank, split_timestamp
from ddpdeploy.targets import Layout

Obj = dict[str, Any]


@dataclass(frozen=True)
class Source:
    pod: str
    node: int
    previous: bool = False  # the container's last terminated run


@dataclass(frozen=True)
class Line:
    rank: int | None  # None: the node's agent (or a launcher), no rank prefix
    node: int
    text: str
    previous: bool = False
    when: float = 0.0  # the kubelet's timestamp (0 when it gave none)


@dataclass(frozen=True)
class Select:
    """What `logs` shows: some ranks, some nodes (None: all), the last ``tail`` lines and
    those of the last ``since_s`` seconds of each container."""

    ranks: frozenset[int] | None = None
    nodes: frozenset[int] | None = None
    tail: int | None = None
    since_s: int | None = None

    def keeps(self, line: Line) -> bool:
        return self.ranks is None or line.rank in self.ranks


def _restarts(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(st.get("restartCount") or 0) for st in statuses)


def node_numbers(layout: Layout, pods: list[Obj]) -> dict[str, int]:
    """pod name -> node number, from the pod's place in the target's layout: its index,
    after the replicas before its own (PyTorchJob: master-0 is node 0, worker-i node i+1);
    a replica's count is its highest index seen + 1. Pods being deleted are left out."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    places = {(p.get("metadata") or {}).get("name", ""): layout.pod_place(p) for p in live}
    size: dict[str, int] = {}
    for replica, index in places.values():
        size[replica] = max(size.get(replica, 0), index + 1)
    order = [r for r in layout.replica_names if r in size] + sorted(
        r for r in size if r not in layout.replica_names
    )
    offset = {r: sum(size[q] for q in order[: order.index(r)]) for r in order}
    return {name: offset[replica] + index for name, (replica, index) in places.items()}


def sources(layout: Layout, pods: list[Obj], select: Select) -> list[Source]:
    """The containers to read, previous runs first, each in node order."""
    numbers = node_numbers(layout, pods)
    chosen = [p for p in pods if (p.get("metadata") or {}).get("name") in numbers]
    if select.nodes is not None:
        missing = sorted(select.nodes - set(numbers.values()))
        if missing:
            raise UserError(
                f"--node: the job has no pod for node {missing[0]}; it has nodes "
                f"0-{max(numbers.values(), default=-1)} (`ddpdeploy status` lists its pods)"
            )
        chosen = [p for p in chosen if numbers[p["metadata"]["name"]] in select.nodes]
    chosen.sort(key=lambda p: numbers[p["metadata"]["name"]])
    named = [(p["metadata"]["name"], _restarts(p)) for p in chosen]
    previous = [Source(pod, numbers[pod], True) for pod, restarts in named if restarts > 0]
    return [*previous, *(Source(pod, numbers[pod]) for pod, _ in named)]


def attribute(raw: str, source: Source) -> Line:
    when, text = split_timestamp(raw)
    rank, text = split_rank(text)
    return Line(rank, source.node, text, source.previous, when or 0.0)


def _read(
    kube: Kube, namespace: str, container: str, source: Source, select: Select, follow: bool
) -> Iterator[Line]:
    for raw in kube.logs(
        source.pod,
        namespace,
        container,
        follow=follow and not source.previous,
        tail=select.tail,
        previous=source.previous,
        since_seconds=select.since_s,
        timestamps=True,
    ):
        line = attribute(raw, source)
        if select.keeps(line):
            yield line


Failed = Callable[[Source, Exception], None]


READERS = 16  # pods read at once: one after another, 128 pods were 128 round trips in a row


def merged(
    kube: Kube, namespace: str, container: str, todo: list[Source], select: Select, failed: Failed
) -> list[Line]:
    """Every source's lines, previous runs first, then in the order they were written. A
    source that cannot be read goes to ``failed`` and the others are still shown. Up to
    READERS sources are read at once; ``failed`` is called here, in ``todo``'s order."""

    def read(source: Source) -> list[Line] | OperationError:
        try:
            return list(_read(kube, namespace, container, source, select, follow=False))
        except OperationError as exc:  # one pod's failure is reported, not fatal
            return exc

    pool = ThreadPoolExecutor(max_workers=max(1, min(READERS, len(todo))))
    try:
        results = list(pool.map(read, todo))
    finally:  # Ctrl-C: the command exits now, not after the reads under way
        pool.shutdown(wait=False, cancel_futures=True)
    lines: list[Line] = []
    for source, got in zip(todo, results, strict=True):
        if isinstance(got, OperationError):
            failed(source, got)
        else:
            lines += got
    # A stable sort: lines written at the same instant keep ``todo``'s order.
    return sorted(lines, key=lambda line: (not line.previous, line.when))


_END = object()


def followed(
    kube: Kube, namespace: str, container: str, todo: list[Source], select: Select, failed: Failed
) -> Iterator[Line]:
    """The previous runs' lines, then every running container's at once, one reader thread
    per pod, merged as they come; ends when every stream has ended."""
    previous = [s for s in todo if s.previous]
    yield from merged(kube, namespace, container, previous, select, failed)
    current = [s for s in todo if not s.previous]
    out: queue.Queue[Any] = queue.Queue()

    def pump(source: Source) -> None:
        try:
            for line in _read(kube, namespace, container, source, select, follow=True):
                out.put(line)
        except OperationError as exc:  # reported by the main thread
            out.put((source, exc))
        finally:
            out.put(_END)

    for source in current:  # daemons: Ctrl-C in the main thread ends the command
        threading.Thread(target=pump, args=(source,), daemon=True).start()
    running = len(current)
    while running:
        try:
            item = out.get(timeout=0.5)  # a timeout keeps the main thread interruptible
        except queue.Empty:
            continue
        if item is _END:
            running -= 1
        elif isinstance(item, tuple):
            failed(*item)
        else:
            yield item


# ---- rank 0's progress, for `status` --------------------------------------------------------

TAIL = 200  # rank 0's latest lines that `status` reads
HEAD_BYTES = 64 * 1024  # ...and, when they hold no `start`, the log's head for it


def rank0_progress(kube: Kube, job: Obj, pods: list[Obj], now: float) -> Progress | str:
    """Rank 0's latest events through the log endpoint (nothing runs in the pod); one line
    saying why when its log cannot be read (no pod yet, no kubelet, forbidden)."""
    from ddpdeploy.cluster.watch import container_of, rank0_pod

    namespace = job["metadata"]["namespace"]
    try:
        pod = rank0_pod(kube, job, pods)
        if pod is None or not any((p.get("metadata") or {}).get("name") == pod for p in pods):
            return "training: no pod has logged rank 0's start yet"
        container = container_of(job)
        tail = list(kube.logs(pod, namespace, container, tail=TAIL, timestamps=True))
        if not any(_kind(line) == "start" for line in tail):
            head = kube.logs(pod, namespace, container, timestamps=True, limit_bytes=HEAD_BYTES)
            tail = [line for line in head if _kind(line) in ("start", "probe")] + tail
    except OperationError as exc:
        return f"training: cannot read rank 0's log: {exc}"
    return progress(tail, now)


def _kind(line: str) -> str | None:
    rank, text = split_rank(split_timestamp(line)[1])
    event = parse_event(text) if rank in (None, 0) else None
    return event.kind if event else None
