"""Every pod's log of a job, merged: each line attributed to its global rank (torchrun's
line prefix, RANK_OUTPUT_ENV) and its node (the pod's place in the target's layout).

Under c10d the global ranks follow join order, so a node's ranks are read from its lines,
never computed from its place. Lines without a rank prefix (the agent's own, a launcher's)
belong to their node only. Previous containers (of pods that restarted) come first. Read
with the kubelet's timestamps, so lines of different pods merge in the order written.
Followed, the job's pods are watched too: the next run of a container (a restart, a pod
replaced, a new pod) is read from its start once the stream of the one before has ended.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ddpdeploy.adapters.kube import KubeApi
from ddpdeploy.cluster.find import made_for
from ddpdeploy.cluster.saved import saved_spec
from ddpdeploy.cluster.watch import (
    HEAD_BYTES,
    JobWatch,
    container_of,
    job_gone,
    rank0_likeliest,
    rank0_search,
)
from ddpdeploy.errors import ApiSilent, ApiUnreachable, LogUnavailable, OperationError, UserError
from ddpdeploy.events import (
    NO_EVENTS,
    Progress,
    last_error,
    parse_event,
    progress,
    split_ranks,
    split_timestamp,
    worker_lines,
)
from ddpdeploy.formats import ago, counted
from ddpdeploy.obj import Obj
from ddpdeploy.targets import Layout
from ddpdeploy.text import first_of

if TYPE_CHECKING:
    from ddpdeploy.cluster.find import Found
    from ddpdeploy.cluster.watch import JobWatch


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


def _places(
    layout: Layout, job: Obj, pods: list[Obj]
) -> tuple[dict[str, tuple[str, int]], dict[str, int], dict[str, int]]:
    """(pod name -> (replica, index), replica -> size, replica -> its first node number)
    for the live pods with an index. A replica's size is the job's own count of it, as
    `status` counts the pods it asks for; one the job does not count takes its highest
    index seen + 1."""
    places: dict[str, tuple[str, int]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        replica, index = layout.pod_place(pod)
        if not meta.get("deletionTimestamp") and index is not None:
            places[str(meta.get("name", ""))] = (replica, index)
    counted = layout.replica_counts(job)
    size = dict(counted)
    for replica, index in places.values():
        if replica not in counted:
            size[replica] = max(size.get(replica, 0), index + 1)
    order = [r for r in layout.replica_names if r in size] + sorted(
        r for r in size if r not in layout.replica_names
    )
    offset = {r: sum(size[q] for q in order[: order.index(r)]) for r in order}
    return places, size, offset


def node_numbers(layout: Layout, job: Obj, pods: list[Obj]) -> dict[str, int]:
    """pod name -> node number, from the pod's place in the target's layout: its index,
    after the replicas before its own (PyTorchJob: master-0 is node 0, worker-i node i+1),
    each sized by the job's own replica counts, so a pod's number never depends on which
    other pods exist now. Left out: pods being deleted, pods with no index, and a pod
    beyond its replica's count that another replica follows (it would take that one's
    numbers)."""
    return _numbers(*_places(layout, job, pods))


def _numbers(
    places: dict[str, tuple[str, int]], size: dict[str, int], offset: dict[str, int]
) -> dict[str, int]:
    last = next(reversed(offset), None)  # the replica no other follows
    return {
        name: offset[replica] + index
        for name, (replica, index) in places.items()
        if index < size[replica] or replica == last
    }


def sources(layout: Layout, job: Obj, pods: list[Obj], select: Select) -> list[Source]:
    """The containers to read, previous runs first, each in node order."""
    places, size, offset = _places(layout, job, pods)
    numbers = _numbers(places, size, offset)
    chosen = [p for p in pods if (p.get("metadata") or {}).get("name") in numbers]
    if select.nodes is not None:
        nodes = max(sum(size.values()), max(numbers.values(), default=-1) + 1)
        missing = sorted(select.nodes - set(numbers.values()))
        if missing:
            yet = " yet" if missing[0] < nodes else ""
            raise UserError(
                f"--node: the job has no pod for node {missing[0]}{yet}; it has nodes "
                f"0-{nodes - 1} (`ddpdeploy status` lists its pods)"
            )
        chosen = [p for p in chosen if numbers[p["metadata"]["name"]] in select.nodes]
    chosen.sort(key=lambda p: numbers[p["metadata"]["name"]])
    named = [(p["metadata"]["name"], _restarts(p)) for p in chosen]
    previous = [Source(pod, numbers[pod], True) for pod, restarts in named if restarts > 0]
    return [*previous, *(Source(pod, numbers[pod]) for pod, _ in named)]


def world_size(job: Obj) -> int | None:
    """The most global ranks the job can have: its saved spec's (most) nodes times the
    processes per node; None when it has no saved spec that reads."""
    try:
        spec = saved_spec(job)
    except UserError:
        return None
    return None if spec is None else spec.max_nodes * spec.procs_per_node


def check_ranks(job: Obj, select: Select) -> None:
    """`--rank R` beyond the job's world is refused, as `--node` beyond its pods is."""
    world = world_size(job)
    beyond = sorted(r for r in select.ranks or () if world is not None and r >= world)
    if world is not None and beyond:
        raise UserError(
            f"--rank: the job has no rank {beyond[0]}; its global ranks are 0-{world - 1} "
            f"(world size {world})"
        )


def phase_of(pod: Obj, container: str) -> str:
    """``Pending``, ``Pending (ContainerCreating)``, ``Running``: a pod as `logs` names it
    when it has nothing to show."""
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    for st in status.get("containerStatuses") or []:
        if isinstance(st, dict) and st.get("name") == container:
            waiting = (st.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                return f"{phase} ({waiting['reason']})"
    return phase


def nothing_shown(pods: list[Obj], select: Select, container: str) -> str:
    """The one line `logs` says when it read every pod and found no line to show: why, as
    far as the pods tell (their phases), so that an empty answer is never silent."""
    named = [f"{(p.get('metadata') or {}).get('name')} {phase_of(p, container)}" for p in pods]
    listed = first_of(named, 8)
    started = [p for p in pods if run_of(p, container) is not None]
    if not started:
        why = "no container has started yet"
    elif select.ranks is not None:
        ranks = ",".join(map(str, sorted(select.ranks)))
        why = f"no line of rank {ranks}" + (" in that time" if select.since_s else "")
        if select.tail is not None:
            # The kubelet cuts each container's log before the rank filter: the rank's lines
            # may be there, only further back (cluster3 F7).
            why += (
                f" in each container's last {counted(select.tail, 'line')} (--tail counts "
                "every rank's lines; raise it or drop --tail)"
            )
    elif select.since_s is not None:
        why = "no line in that time"
    else:
        why = "the logs are empty"
    return f"no log lines: {why} (pods: {listed})"


def attribute(raw: str, source: Source) -> list[Line]:
    """A log line as the lines of the ranks in it: a rank's partial line and the next
    rank's run on in one (``split_ranks``), each shown and selected as its own rank's."""
    when, text = split_timestamp(raw)
    return [
        Line(rank, source.node, own, source.previous, when or 0.0)
        for rank, own in split_ranks(text)
    ]


def _read(
    kube: KubeApi, namespace: str, container: str, source: Source, select: Select, follow: bool
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
        for line in attribute(raw, source):
            if select.keeps(line):
                yield line


Failed = Callable[[Source, Exception], None]


READERS = 16  # pods read at once: one after another, 128 pods were 128 round trips in a row


def merged(
    kube: KubeApi,
    namespace: str,
    container: str,
    todo: list[Source],
    select: Select,
    failed: Failed,
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


# ---- following: every stream at once, and the next run of a container ------------------

FINAL = ("Succeeded", "Failed")  # job states after which no container starts again
TICK = 0.25  # seconds: the follow loop looks at the pods' watch this often while quiet
Notice = Callable[[str], None]


@dataclass(frozen=True)
class Run:
    """One run of a pod's container: the pod object (its uid) and the restart it is."""

    uid: str
    restarts: int


def run_of(pod: Obj, container: str) -> Run | None:
    """The run of ``container`` a read of the pod's log gets now (the running one, or the
    last that ran while the next waits); None while none has started (the kubelet answers
    "waiting to start")."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    st = next((s for s in statuses if s.get("name") == container), None) or {}
    state, last = st.get("state") or {}, st.get("lastState") or {}
    if not ("running" in state or "terminated" in state or "terminated" in last):
        return None
    return Run((pod.get("metadata") or {}).get("uid", ""), int(st.get("restartCount") or 0))


@dataclass
class Followed:
    """What the follow has read: the run of each pod read (or being read), the pods with a
    stream open now, and the uids of the pods it started with (``made_for`` the job, as
    every pod `snapshot_of` gives; a newcomer is checked by the same rule)."""

    shown: dict[str, Run]
    open: set[str]
    known: set[str]


def next_runs(
    layout: Layout, job: Obj, pods: list[Obj], seen: Followed, nodes: frozenset[int] | None
) -> list[tuple[Source, Run, str]]:
    """The runs to read now, each with its line for the user: a container that restarted,
    a pod replaced (a new uid), a new pod of the job. A pod whose stream is still open
    waits for it to end (a container's exit ends it), so no line is read twice."""
    container = layout.container
    numbers = node_numbers(layout, job, pods)
    out: list[tuple[Source, Run, str]] = []
    for pod in sorted(pods, key=lambda p: numbers.get(p["metadata"]["name"], -1)):
        name = pod["metadata"]["name"]
        run = run_of(pod, container)
        if name not in numbers or name in seen.open or run is None or seen.shown.get(name) == run:
            continue
        if run.uid not in seen.known and not made_for(pod, job):
            continue
        node = numbers[name]
        if nodes is not None and node not in nodes:
            continue
        before = seen.shown.get(name)
        if before is not None and before.uid == run.uid:
            what = f"container restarted (restart {run.restarts}); following the new one"
        elif before is not None:
            what = f"pod {name} replaced (a new pod); following it"
        elif run.uid in seen.known:
            what = "container started; following it"
        else:
            what = f"new pod {name}; following it"
        out.append((Source(name, node), run, f"[node{node}] {what}"))
    return out


_END = object()


class _Streams:
    """The followed streams, one reader thread each, into one queue."""

    def __init__(self, kube: KubeApi, namespace: str, container: str) -> None:
        self.kube, self.namespace, self.container = kube, namespace, container
        self.out: queue.Queue[Any] = queue.Queue()

    def start(self, source: Source, select: Select) -> None:
        def pump() -> None:
            try:
                for line in _read(
                    self.kube, self.namespace, self.container, source, select, follow=True
                ):
                    self.out.put(line)
            except OperationError as exc:  # reported by the main thread
                self.out.put((source, exc))
            finally:
                self.out.put((_END, source.pod))

        # A daemon: Ctrl-C in the main thread ends the command.
        threading.Thread(target=pump, name=f"log {source.pod}", daemon=True).start()


def followed(
    found: Found,
    job: Obj,
    pods: list[Obj],
    todo: list[Source],
    select: Select,
    failed: Failed,
    notice: Notice,
) -> Iterator[Line]:
    """The previous runs' lines, then every running container's at once, merged as they
    come. The job and its pods are watched meanwhile: a container that restarts, a pod
    replaced or a new pod of the job is read from its start (``notice`` says so). Ends
    once the job is final (or gone) and every stream has ended; without the watch (it
    failed: ``notice`` says so), when every stream has ended."""

    container = container_of(job)
    previous = [s for s in todo if s.previous]
    yield from merged(found.kube, found.namespace, container, previous, select, failed)
    streams = _Streams(found.kube, found.namespace, container)
    by_name = {p["metadata"]["name"]: p for p in pods}
    seen = Followed({}, set(), {p["metadata"].get("uid", "") for p in pods})
    again = replace(select, tail=None, since_s=None)  # a new run is read from its start
    # The watch first: its lists are under way before the streams' first lines come.
    with JobWatch(found) as watching:
        for source in (s for s in todo if not s.previous):
            run = run_of(by_name[source.pod], container)
            if run is None:  # not started: read when the watch shows it running
                continue
            seen.shown[source.pod] = run
            seen.open.add(source.pod)
            streams.start(source, select)
        waiting = [by_name[s.pod] for s in todo if not s.previous and s.pod not in seen.open]
        if waiting:  # said once, or a job whose pods wait (no room, no claim) is silence
            named = [f"{p['metadata']['name']} ({phase_of(p, container)})" for p in waiting]
            notice(
                f"waiting for pod(s) {first_of(named, 8)} to start their container; "
                "each is followed once it starts (`ddpdeploy status` says why they wait)"
            )
        yield from _follow_loop(found, job, watching, streams, seen, again, failed, notice)


def _follow_loop(
    found: Found,
    job: Obj,
    watching: JobWatch,
    streams: _Streams,
    seen: Followed,
    again: Select,
    failed: Failed,
    notice: Notice,
) -> Iterator[Line]:
    watch: JobWatch | None = watching
    changed, final = True, False
    gone: str | None = None  # how the job followed went away (deleted, replaced), if it did
    while True:
        if watch is not None:
            try:
                changed = watch.take(time.monotonic()) or changed  # what came, no waiting
            except ApiUnreachable as exc:
                if not seen.open:  # nothing left to follow: ending at once would be exit 0
                    raise OperationError(f"{exc}; stopped following") from None
                notice(f"warning: {exc}; a container that restarts now is not followed")
                watch, final = None, True
            except OperationError as exc:
                notice(f"warning: {exc}; a container that restarts now is not followed")
                watch, final = None, True
        if changed and watch is not None and watch.ready:
            now_job, now_pods, state = watch.current()
            gone = gone or job_gone(job, now_job)
            final = gone is not None or state.state in FINAL
            for source, run, line in next_runs(found.layout, job, now_pods, seen, again.nodes):
                notice(line)
                seen.shown[source.pod] = run
                seen.open.add(source.pod)
                streams.start(source, again)
        changed = False
        if final and not seen.open:
            if watch is not None and gone is not None:  # deleted, then a new one made?
                gone = job_gone(job, watch.current()[0]) or gone
            if gone is not None:  # as `up --wait` ends on a job that vanished: exit 1
                raise OperationError(f"{gone}; stopped following")
            return
        try:
            item = streams.out.get(timeout=TICK)  # a timeout keeps the main thread interruptible
        except queue.Empty:
            continue
        if isinstance(item, Line):
            yield item
        elif item[0] is _END:
            seen.open.discard(item[1])
            changed = True  # a restart seen while it was open is read now
        elif isinstance(item[1], ApiSilent):
            raise item[1]  # the API server, not one pod: every stream waits on it
        else:
            failed(*item)


# ---- rank 0's progress, for `status` --------------------------------------------------------

TAIL = 200  # rank 0's latest lines that `status` reads (and, with no `start`, its head)
# With no rank-0 step among those (the other ranks on its pod printed them all), read this
# many back once; past that `status` says what it did not look at (cluster3 F5).
FURTHER = 5000


def _stepped(lines: list[str]) -> bool:
    return any(_kinds(line) & {"step", "done"} for line in lines)


def rank0_progress(kube: KubeApi, job: Obj, pods: list[Obj], now: float) -> Progress | str:
    """Rank 0's latest events through the log endpoint (nothing runs in the pod); with
    none, what its pod and log tell instead (``quiet_line``); one line saying why when its
    log cannot be read (no pod yet, no kubelet, forbidden)."""

    namespace = job["metadata"]["namespace"]
    unseen = "training: no pod has logged rank 0's start yet"
    try:
        pod, heads = rank0_search(kube, job, pods)
        guessed = pod is None and (pod := rank0_likeliest(job, pods)) is not None
        obj = next((p for p in pods if (p.get("metadata") or {}).get("name") == pod), None)
        if pod is None or obj is None:
            return unseen
        container = container_of(job)
        window: int | None = None  # the lines read, when rank 0's steps may be further back
        try:
            tail = list(kube.logs(pod, namespace, container, tail=TAIL, timestamps=True))
            if len(tail) >= TAIL and not _stepped(tail):
                tail = list(kube.logs(pod, namespace, container, tail=FURTHER, timestamps=True))
                window = FURTHER if len(tail) >= FURTHER and not _stepped(tail) else None
        except LogUnavailable:  # the run is gone: the pod's status tells how it ended
            tail = []
        if not any("start" in _kinds(line) for line in tail):
            head = heads.get(pod)  # read a moment ago when looking for rank 0
            if head is None:
                try:
                    head = list(
                        kube.logs(
                            pod, namespace, container, timestamps=True, limit_bytes=HEAD_BYTES
                        )
                    )
                except LogUnavailable:
                    head = []
            tail = [line for line in head if _kinds(line) & {"start", "probe"}] + tail
    except OperationError as exc:
        return f"training: cannot read rank 0's log: {exc}"
    got = replace(progress(tail, now), window=window)
    if got.events:
        return got
    previous: list[str] = []
    if _last_exit(obj, container) is not None:
        try:  # the run before: how it ended
            previous = list(
                kube.logs(pod, namespace, container, tail=TAIL, previous=True, timestamps=True)
            )
        except OperationError:  # LogUnavailable too: lastState's message tells instead
            previous = []
    quiet = quiet_line(obj, container, tail, previous, now)
    if guessed and quiet == NO_EVENTS:  # its workers print, but rank 0 may be elsewhere
        return unseen
    return replace(got, quiet=quiet)


def _status(pod: Obj, container: str) -> Obj:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    found = next((s for s in statuses if isinstance(s, dict) and s.get("name") == container), None)
    return found or {}


def _last_exit(pod: Obj, container: str) -> Obj | None:
    """The container's last run that ended (lastState.terminated), when it restarted."""
    st = _status(pod, container)
    last = (st.get("lastState") or {}).get("terminated")
    return last if isinstance(last, dict) and int(st.get("restartCount") or 0) > 0 else None


def _when(stamp: Any, now: float) -> str:
    """``2026-01-02T03:04:05Z (3m07s ago)`` from the cluster's RFC 3339 time."""
    from datetime import datetime

    try:
        then = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "?"
    return f"{stamp} ({ago(now - then)})"


def quiet_line(pod: Obj, container: str, tail: list[str], previous: list[str], now: float) -> str:
    """What `status` says when rank 0 logged no event: what is known, never a guess about
    the script. A container that restarted: the restart and the line its last run ended
    with (the previous log, else the current one). No worker line yet: torchrun starts
    the workers once every node has joined the rendezvous, so it waits for its peers
    (since the container started). Else the workers run and print no event."""
    st = _status(pod, container)
    last = _last_exit(pod, container)
    if last is not None:
        code = last.get("exitCode")
        why = f"exit code {code}" + (f", {last['reason']}" if last.get("reason") else "")
        error = last_error(previous) or last_error(tail) or str(last.get("message") or "")
        count = int(st.get("restartCount") or 0)
        line = f"training: restarting (restart {count}; the last run ended with {why})"
        return f"{line}: {error}" if error else line
    if not worker_lines(tail):
        started = ((st.get("state") or {}).get("running") or {}).get("startedAt")
        since = f" since {_when(started, now)}" if started else ""
        return (
            f"training: waiting for peers{since} (rendezvous): no worker has started; torchrun "
            "starts them once every node has joined"
        )
    return NO_EVENTS


def _kinds(line: str) -> set[str]:
    """The kinds of rank 0's events on a log line (one may run on from a partial line)."""
    texts = [t for rank, t in split_ranks(split_timestamp(line)[1]) if rank in (None, 0)]
    return {event.kind for t in texts if (event := parse_event(t)) is not None}
