"""Following a job on the cluster: snapshots, the wait loop, rank 0's pod, node N's pod, the
log to follow.

The decisions (what a state means) are in ddpdeploy.cluster.jobstate; this module reads the
API through the adapter and keeps time. What is shown is the caller's: it passes the views
(ddpdeploy.commands.views) as callbacks.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

from ddpdeploy.adapters.kube import Kube
from ddpdeploy.cluster.find import Found, find_job
from ddpdeploy.cluster.jobstate import JobState, job_state, logs_show_rank0
from ddpdeploy.cluster.labels import selector
from ddpdeploy.contract import CONTAINER_NAME
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.smoke.events import probe_line
from ddpdeploy.targets import DEFAULT_TARGET, TARGETS, Layout, layout_for_kind
from ddpdeploy.text import plain

Obj = dict[str, Any]
Snapshot = tuple[Obj | None, list[Obj], JobState]
Show = Callable[[Snapshot], None]
# A view to show snapshots in while waiting; its argument: whether it may redraw in place
# (not while log lines are being printed below it).
Views = Callable[[bool], contextlib.AbstractContextManager[Show]]


def kind_of(job: Obj | None) -> str:
    return (job or {}).get("kind") or "job"


def layout_of_job(job: Obj | None) -> Layout:
    """The target of ``job`` (the default target's when there is none, or none reads it)."""
    layout = layout_for_kind(job["apiVersion"], job["kind"]) if job else None
    return layout or TARGETS[DEFAULT_TARGET]


def container_of(job: Obj) -> str:
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    return layout.container if layout else CONTAINER_NAME


def parse_duration(text: str, flag: str = "--timeout") -> float:
    """ "90", "90s", "15m", "2h" -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise UserError(f"{flag}: {text!r} is not a duration; use e.g. 90s, 15m or 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def pods_of(kube: Kube, layout: Layout, name: str, namespace: str) -> list[Obj]:
    """The job's pods, in one list call with the target's label selector."""
    return kube.list("v1", "Pod", namespace, labels=selector(layout.pod_selector(name)))


def snapshot_of(found: Found) -> Snapshot:
    pods = pods_of(found.kube, found.layout, found.name, found.namespace) if found.job else []
    return found.job, pods, job_state(found.job, pods)


def snapshot(kube: Kube, name: str, namespace: str) -> Snapshot:
    return snapshot_of(find_job(kube, name, namespace, required=False))


def wait(
    kube: Kube,
    name: str,
    namespace: str,
    show: Show,
    timeout: float | None = None,
    until: Callable[[Snapshot], bool] = lambda snap: snap[2].done,
    interval: float = 1.0,
    started: float | None = None,
) -> Snapshot:
    """Poll until ``until`` holds; a timeout (counted from ``started``, default now) is an
    OperationError naming the last state."""
    started = time.monotonic() if started is None else started
    deadline = None if timeout is None else started + timeout
    while True:
        snap = snapshot(kube, name, namespace)
        show(snap)
        if until(snap):
            return snap
        if deadline is not None and time.monotonic() >= deadline:
            state = snap[2]
            raise OperationError(
                f"timed out after {timeout:g}s waiting for {kind_of(snap[0])} {namespace}/{name}; "
                f"it is {plain(state.state)} ({plain(state.reason)}); "
                f"`ddpdeploy status {name} -n {namespace}` shows it, `ddpdeploy down` removes it"
            )
        time.sleep(interval)


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
    name = job["metadata"]["name"]
    if layout is None:
        return None
    host = layout.logs_hostname(name, replica, index)
    if host is None:
        return None
    found = _by_hostname(pods, host, layout)
    if found is None and replica is None and index is not None:
        live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        for pod in sorted(live, key=lambda p: (p.get("metadata") or {}).get("name", "")):
            if layout.pod_place(pod)[1] == index:
                return (pod.get("metadata") or {}).get("name")
    return found


def rank0_pod(kube: Kube, job: Obj, pods: list[Obj]) -> str | None:
    """The pod hosting global rank 0: node 0 under static rendezvous; under c10d the
    running pod whose trainer logged rank 0's `start` event (only rank 0 logs JSON)."""
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    host = layout.rank0_hostname(job) if layout else None
    if layout is not None and host is not None:
        return _by_hostname(pods, host, layout) or node_pod(job, pods, None, 0)
    namespace = job["metadata"]["namespace"]
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        head: list[str] = []
        for line in kube.logs(pod["metadata"]["name"], namespace, container_of(job)):
            head.append(line)
            if len(head) >= 200:
                break
        if logs_show_rank0(head):
            return pod["metadata"]["name"]
    return None


def _rank0_running(kube: Kube) -> Callable[[Snapshot], bool]:
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
    kube: Kube,
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
