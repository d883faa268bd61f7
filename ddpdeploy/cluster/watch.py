"""Following a job on the cluster: snapshots, the wait loop, rank 0's pod, node N's pod, the
log to follow.

The decisions (what a state means) are in ddpdeploy.cluster.jobstate; this module reads the
API through the adapter and keeps time. What is shown is the caller's: it passes the views
(ddpdeploy.commands.views) as callbacks.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ddpdeploy.adapters.kube import KubeApi
from ddpdeploy.cluster.find import Found, find_job, holds_its_name, labelled_ours, made_for
from ddpdeploy.cluster.jobstate import JobState, absent_names, job_state, logs_show_rank0
from ddpdeploy.cluster.labels import INSTANCE_LABEL, selector
from ddpdeploy.contract import CONTAINER_NAME
from ddpdeploy.errors import LogUnavailable, OperationError, UserError
from ddpdeploy.events import probe_line, split_timestamp
from ddpdeploy.obj import Obj
from ddpdeploy.targets import DEFAULT_TARGET, TARGETS, Layout, layout_for_kind
from ddpdeploy.text import plain

Snapshot = tuple[Obj | None, list[Obj], JobState]
Show = Callable[[Snapshot], None]
# A view to show snapshots in while waiting; its argument: whether it may redraw in place
# (not while log lines are being printed below it).
Views = Callable[[bool], contextlib.AbstractContextManager[Show]]
REFRESH = 2.0  # seconds: the wait view is shown again this often when nothing changes
SHOW_EVERY = 0.5  # seconds: changes are shown at most this often (the end at once)


def kind_of(job: Obj | None) -> str:
    return (job or {}).get("kind") or "job"


def layout_of_job(job: Obj | None) -> Layout:
    """The target of ``job`` (the default target's when there is none, or none reads it)."""
    layout = layout_for_kind(job["apiVersion"], job["kind"]) if job else None
    return layout or TARGETS[DEFAULT_TARGET]


def container_of(job: Obj) -> str:
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    return layout.container if layout else CONTAINER_NAME


def pods_of(kube: KubeApi, layout: Layout, name: str, namespace: str) -> list[Obj]:
    """The job's pods, in one list call with the target's label selector."""
    return kube.list("v1", "Pod", namespace, labels=selector(layout.pod_selector(name)))


def job_pods(job: Obj | None, pods: list[Obj]) -> list[Obj]:
    """The pods that are ``job``'s by the one rule (``find.made_for``): the target's pod
    selector also matches a look-alike (another job's pod, one made by hand). An earlier
    run's pod that finalizers hold is kept too: it is why the job's own pod is missing."""
    if job is None:
        return []
    return [p for p in pods if made_for(p, job) or holds_its_name(p, job)]


def snapshot_of(found: Found) -> Snapshot:
    pods = pods_of(found.kube, found.layout, found.name, found.namespace) if found.job else []
    pods = job_pods(found.job, pods)
    taken = _taken(found, pods) if found.job else {}
    return found.job, pods, job_state(found.job, pods, taken)


def _taken(found: Found, pods: list[Obj]) -> dict[str, str]:
    """Each name the job needs but has no pod of that another pod holds, and what that pod
    is (someone else's, or the job's own with its labels changed): a few gets, by name."""
    job = found.job or {}
    uid = (job.get("metadata") or {}).get("uid")
    out: dict[str, str] = {}
    for name in absent_names(job, pods)[:4]:
        try:
            got = found.kube.get("v1", "Pod", name, found.namespace)
        except OperationError:  # no right to get pods (only to list them): said as missing
            continue
        if got is None:
            continue
        owners = (got.get("metadata") or {}).get("ownerReferences") or []
        controller = next((o for o in owners if isinstance(o, dict) and o.get("controller")), None)
        if controller is not None and uid and controller.get("uid") == uid:
            # The operator counts it (its own labels are there); only ours were changed.
            out[name] = (
                f"{name} is this job's own pod but without ddpdeploy's labels (changed by "
                f"hand?): not read or counted here; label it {INSTANCE_LABEL}={found.name} again"
            )
            continue
        whose = (
            f"controller {controller.get('kind')} {controller.get('name')}"
            if controller is not None
            else "no controller"
        )
        out[name] = (
            f"{name} is taken by a pod that is not this job's ({whose}); the job cannot "
            "start that node until it is deleted"
        )
    return out


def snapshot(kube: KubeApi, name: str, namespace: str) -> Snapshot:
    return snapshot_of(find_job(kube, name, namespace, required=False))


def wait(
    kube: KubeApi,
    name: str,
    namespace: str,
    show: Show,
    timeout: float | None = None,
    until: Callable[[Snapshot], bool] = lambda snap: snap[2].done,
    interval: float = REFRESH,
    started: float | None = None,
) -> Snapshot:
    """Watch the job and its pods until ``until`` holds; a timeout (counted from
    ``started``, default now) is an OperationError naming the last state.

    The view is shown on the changes the watches bring (at most every SHOW_EVERY), and
    every ``interval`` seconds anyway; no request is made between changes."""
    started = time.monotonic() if started is None else started
    deadline = None if timeout is None else started + timeout
    found = find_job(kube, name, namespace, required=False)
    with JobWatch(found) as watching:
        shown_at, unshown, shown_once = time.monotonic(), False, False
        while True:
            # Changes are shown at most every SHOW_EVERY (a 128-pod job starting is 128
            # of them), the end at once; with none, the view is shown every ``interval``.
            pause = SHOW_EVERY if unshown else interval
            wake = shown_at + pause if shown_once else time.monotonic() + interval
            if deadline is not None:
                wake = min(wake, deadline)
            unshown = watching.take(wake) or unshown
            now = time.monotonic()
            late = deadline is not None and now >= deadline
            if not (watching.ready or late):
                continue
            snap = watching.current()
            done = until(snap)
            due = now - shown_at >= (SHOW_EVERY if unshown else interval)
            if done or late or due or not shown_once:
                show(snap)
                shown_at, unshown, shown_once = now, False, True
            if done:
                return snap
            if late:
                state = snap[2]
                why = f" ({plain(state.reason)})" if state.reason else ""  # Suspended has none
                raise OperationError(
                    f"timed out after {timeout:g}s waiting for {kind_of(snap[0])} "
                    f"{namespace}/{name}; it is {plain(state.state)}{why}; "
                    f"`ddpdeploy status {name} -n {namespace}` shows it, `ddpdeploy down` "
                    "removes it"
                )


class JobWatch:
    """The job and its pods as two watches (one thread each, into one queue) keep them:
    a snapshot is taken from what they brought, never by asking again."""

    def __init__(self, found: Found) -> None:
        self.found = found
        self.job: Obj | None = found.job
        self.pods: dict[str, Obj] = {}
        self.synced: set[str] = set()
        self.events: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        self.stop = threading.Event()

    def __enter__(self) -> JobWatch:
        found, layout = self.found, self.found.layout
        # (what, its kind, the one object's name or the pods' label selector)
        streams = [
            ("job", layout.api_version, layout.kind, found.name, None),
            ("pods", "v1", "Pod", None, selector(layout.pod_selector(found.name))),
        ]
        for what, api, kind, name, labels in streams:
            if what == "job" and not found.kube.has_kind(api, kind):
                self.synced.add(what)  # nothing of that kind can appear
                continue
            events = found.kube.watch(
                api, kind, found.namespace, name=name, labels=labels, stop=self.stop
            )
            thread = threading.Thread(
                target=self._pump, args=(what, events), name=f"watch {what}", daemon=True
            )
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()  # the threads end at their next event or watch timeout

    def _pump(self, what: str, events: Iterator[tuple[str, Any]]) -> None:
        try:
            for kind, obj in events:
                self.events.put((what, kind, obj))
                if self.stop.is_set():
                    break
        except BaseException as exc:  # noqa: BLE001 - raised again in the waiting thread
            self.events.put((what, "ERROR", exc))
        finally:
            with contextlib.suppress(Exception):
                events.close()  # type: ignore[attr-defined]

    @property
    def ready(self) -> bool:
        """Both watches have listed: a snapshot now is the whole picture."""
        return len(self.synced) == 2

    def take(self, wake: float) -> bool:
        """Wait until the next changes come (taking all that came with them) or until
        ``wake`` (a monotonic time); True when something came."""
        try:
            self._take(self.events.get(timeout=max(0.0, wake - time.monotonic())))
        except queue.Empty:
            return False
        with contextlib.suppress(queue.Empty):
            while True:
                self._take(self.events.get_nowait())
        return True

    def current(self) -> Snapshot:
        pods = sorted(self.pods.values(), key=lambda p: p["metadata"]["name"])
        if self.job is not None:
            pods = job_pods(self.job, pods)
        return self.job, pods, job_state(self.job, pods)

    def _take(self, event: tuple[str, str, Any]) -> None:
        what, kind, obj = event
        if kind == "ERROR":
            raise obj
        if what == "job":
            self.synced.add(what)
            if kind == "SYNC":
                obj = obj[0] if obj else None
            self.job = obj if kind != "DELETED" and obj and labelled_ours(obj) else None
            return
        if kind == "SYNC":
            self.synced.add(what)
            self.pods = {p["metadata"]["name"]: p for p in obj}
        elif kind == "DELETED":
            self.pods.pop(obj["metadata"]["name"], None)
        else:
            self.pods[obj["metadata"]["name"]] = obj


def job_gone(job: Obj, now: Obj | None) -> str | None:
    """How the job being read went away, as one line: deleted (its namespace too), or
    replaced by a new job of that name (`up --replace`: another uid); None while it is
    there."""
    where = f"{kind_of(job)} {job['metadata'].get('namespace')}/{job['metadata']['name']}"
    if now is None:
        return f"{where} was deleted"
    if (now.get("metadata") or {}).get("uid") != job["metadata"].get("uid"):
        return f"{where} was replaced (a new job of that name)"
    return None


def _by_hostname(pods: list[Obj], hostname: str, layout: Layout) -> str | None:
    """The pod with that hostname: a Job's or JobSet's pod name has a random suffix; a
    target whose pods are named like their hostnames names the pod even before it exists."""
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (spec.get("hostname") or meta.get("name")) == hostname:
            return meta.get("name")
    return hostname if layout.pods_named_like_hosts else None


def node_pod(job: Obj, pods: list[Obj], replica: str | None, index: int | None) -> str | None:
    """The pod `logs --replica/--index` names; None when they name none (rank 0's then).

    By hostname first; else (a pod without a hostname set) the pod whose place the target
    reads from it (its completion index) is node ``index``."""
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    if layout is None:
        return None
    host = layout.logs_hostname(job, replica, index)
    if host is None:
        return None
    found = _by_hostname(pods, host, layout)
    if found is None and replica is None and index is not None:
        live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        for pod in sorted(live, key=lambda p: (p.get("metadata") or {}).get("name", "")):
            if layout.pod_place(pod)[1] == index:
                return (pod.get("metadata") or {}).get("name")
    return found


def _span(count: int) -> str:
    return "none" if count < 1 else "0" if count == 1 else f"0-{count - 1}"


def check_named(job: Obj, replica: str | None, index: int | None) -> None:
    """`logs --replica/--index` naming a pod the job object cannot have is bad input: one
    line naming what it has (a node it has, whose pod is not there yet, is another matter)."""
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    if layout is None:
        return
    where = f"{job['kind']} {job['metadata'].get('namespace')}/{job['metadata']['name']}"
    counts = layout.replica_counts(job)
    if replica is not None and counts and layout.replica_names:  # TrainJob: no --replica
        replica = replica.lower()
        if replica not in counts:
            mode = "c10d" if layout.rank0_hostname(job) is None else "static"
            have = " and ".join(sorted(counts))
            raise UserError(
                f"--replica: {where} has {have} replicas only ({mode} rendezvous); pass "
                f"--replica {sorted(counts)[-1]}, or --index N alone for node N"
            )
        if (index or 0) >= counts[replica]:
            raise UserError(
                f"--index: {where} has no {replica} {index}; its {replica} replicas are "
                f"{_span(counts[replica])}"
            )
    elif replica is None and index is not None:
        nodes = layout.job_size(job)[0]
        if index >= nodes:
            raise UserError(
                f"--index: {where} has no node {index}; its nodes are {_span(nodes)} "
                f"(`ddpdeploy status {job['metadata']['name']}` lists its pods)"
            )


# Under c10d, how many pods' log heads `status` reads looking for rank 0, whatever the
# job's size: torch's order puts rank 0 first, the next one covers a round in flux.
RANK0_READS = 2
HEAD_BYTES = 64 * 1024  # how much of a log's head is read for rank 0's `start` and `probe`


def rank0_pod(kube: KubeApi, job: Obj, pods: list[Obj]) -> str | None:
    """The pod hosting global rank 0: node 0 under static rendezvous; under c10d the pod
    whose log shows rank 0 (its `start` event or a line torchrun prefixed with rank 0),
    read in the order c10d gives ranks (running pods first, then ended ones)."""
    return rank0_search(kube, job, pods)[0]


def rank0_search(
    kube: KubeApi, job: Obj, pods: list[Obj]
) -> tuple[str | None, dict[str, list[str]]]:
    """``rank0_pod``, and the log heads it read to find it (timestamped, by pod; none under
    static rendezvous), so that a caller that needs a head too reads none twice."""
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    host = layout.rank0_hostname(job) if layout else None
    if layout is not None and host is not None:
        return _by_hostname(pods, host, layout) or node_pod(job, pods, None, 0), {}
    namespace = job["metadata"]["namespace"]
    heads: dict[str, list[str]] = {}
    for pod in c10d_order(pods)[:RANK0_READS]:
        name = str(pod["metadata"]["name"])
        logs = kube.logs(
            name, namespace, container_of(job), timestamps=True, limit_bytes=HEAD_BYTES
        )
        try:
            heads[name] = list(logs)
        except LogUnavailable:  # the kubelet no longer has that run: no head to read
            heads[name] = []
        if logs_show_rank0([split_timestamp(line)[1] for line in heads[name]]):
            return name, heads
    return None, heads


def rank0_likeliest(job: Obj, pods: list[Obj]) -> str | None:
    """Under c10d, before any pod's log shows rank 0: the pod c10d would rank first (its
    log says whether the workers have started at all); None under static or with no pod
    started."""
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    if layout is None or layout.rank0_hostname(job) is not None:
        return None
    first = c10d_order(pods)[:1]
    return str(first[0]["metadata"]["name"]) if first else None


def c10d_order(pods: list[Obj]) -> list[Obj]:
    """Started pods, rank 0's likeliest first: c10d numbers the nodes of a round in the
    order of their addresses as strings (torch's sorted node descriptors; the pod's
    --local-addr is its IP), so the lowest IP is rank 0 when every pod joined the round."""
    order = {"Running": 0, "Succeeded": 1, "Failed": 1}

    def key(pod: Obj) -> tuple[int, bool, str, int, str]:
        status, name = pod.get("status") or {}, str(pod["metadata"]["name"])
        ip = str(status.get("podIP") or "")
        index = name.rsplit("-", 1)[-1]
        return (
            order[str(status.get("phase"))],
            not ip,
            ip,
            int(index) if index.isdigit() else 0,
            name,
        )

    return sorted((p for p in pods if (p.get("status") or {}).get("phase") in order), key=key)


def _rank0_running(kube: KubeApi) -> Callable[[Snapshot], bool]:
    def check(snap: Snapshot) -> bool:
        job, pods, state = snap
        if state.done or job is None:
            return True
        phases = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in pods}
        layout = layout_for_kind(job["apiVersion"], job["kind"])
        host = layout.rank0_hostname(job) if layout else None
        if layout is not None and host is not None:
            return phases.get(_by_hostname(pods, host, layout) or "") == "Running"
        return any(phase == "Running" for phase in phases.values())

    return check


def follow_and_wait(
    kube: KubeApi,
    name: str,
    namespace: str,
    timeout: float | None,
    follow: bool,
    views: Views,
    log_line: Callable[[str], None],
    say: Callable[[str], None],
) -> JobState:
    """Wait for the job's end (streaming rank 0's log through ``log_line`` first when
    asked, with the probe's report line through ``say`` when it passes); a job that did
    not succeed is an OperationError with its reason."""
    started = time.monotonic()
    if follow:
        with views(False) as show:
            job, pods, _ = wait(
                kube, name, namespace, show, timeout, _rank0_running(kube), started=started
            )
        pod = rank0_pod(kube, job, pods) if job else None
        if pod and job:
            say(f"--- logs of {pod} ---")
            for line in kube.logs(pod, namespace, container_of(job), follow=True):
                log_line(line)
                if (probe := probe_line(line)) is not None:
                    say(f"probe: {probe}")
    with views(not follow) as show:
        job, _, state = wait(kube, name, namespace, show, timeout, started=started)
    if not state.ok:
        hint = "" if state.state == "NotFound" else f"; `ddpdeploy down {name}` removes it"
        what = f"{plain(state.state)}: {plain(state.reason)}"  # the cluster's text, one line
        raise OperationError(f"{kind_of(job)} {name} {what}{hint}")
    return state
