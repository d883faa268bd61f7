"""Following a job on the cluster: snapshots, the wait loop, the live view, rank 0's pod.

The decisions (what a state means) are in jobstate; this module reads the API through the
adapter, keeps time, and draws.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ddpdeploy.adapters.kube import Kube
from ddpdeploy.contract import CONTAINER_NAME
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.jobstate import (
    JobState,
    PodView,
    job_state,
    logs_show_rank0,
    pod_view,
)
from ddpdeploy.render.pod import MANAGED_BY
from ddpdeploy.targets import DEFAULT_TARGET, TARGETS, Layout, layout_for_kind

Obj = dict[str, Any]
Snapshot = tuple[Obj | None, list[Obj], JobState]


def find_job(kube: Kube, name: str, namespace: str) -> tuple[Layout, Obj | None]:
    """The job ``name`` of whichever target made it (the target's layout, and the object or
    None), among the job kinds the cluster serves; only ours count (our managed-by label)."""
    for layout in TARGETS.values():
        if not kube.has_kind(layout.api_version, layout.kind):
            continue
        job = kube.get(layout.api_version, layout.kind, name, namespace)
        if job is not None and _ours(job):
            return layout, job
    return TARGETS[DEFAULT_TARGET], None


def _ours(obj: Obj) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY


def kind_of(job: Obj | None) -> str:
    return (job or {}).get("kind") or "job"


def layout_of_job(job: Obj | None) -> Layout:
    """The target of ``job`` (the default target's when there is none, or none reads it)."""
    layout = layout_for_kind(job["apiVersion"], job["kind"]) if job else None
    return layout or TARGETS[DEFAULT_TARGET]


def container_of(job: Obj) -> str:
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    return layout.container if layout else CONTAINER_NAME


def parse_duration(text: str) -> float:
    """ "90", "90s", "15m", "2h" -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise UserError(f"--timeout: {text!r} is not a duration; use e.g. 90s, 15m or 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def snapshot(kube: Kube, name: str, namespace: str) -> Snapshot:
    layout, job = find_job(kube, name, namespace)
    selector = ",".join(f"{k}={v}" for k, v in layout.pod_selector(name).items())
    pods = kube.list("v1", "Pod", namespace, labels=selector)
    return job, pods, job_state(job, pods)


def wait(
    kube: Kube,
    name: str,
    namespace: str,
    show: Callable[[Snapshot], None],
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
                "it is "
                f"{state.state} ({state.reason}); `ddpdeploy status {name} -n {namespace}` "
                "shows it, `ddpdeploy down` removes it"
            )
        time.sleep(interval)


def table(name: str, snap: Snapshot) -> Table:
    job, pods, state = snap
    layout = layout_of_job(job)
    title = f"{kind_of(job)} {name}: {state.state}" + (f" — {state.reason}" if state.reason else "")
    out = Table(title=title, title_justify="left")
    for col in ("POD", "REPLICA", "PHASE", "RESTARTS", "DETAIL"):
        out.add_column(col)
    for view in sorted((pod_view(p, layout) for p in pods), key=lambda v: (v.replica, v.index)):
        out.add_row(view.name, view.replica, view.phase, str(view.restarts), view.detail)
    return out


def _lines(name: str, snap: Snapshot) -> list[str]:
    job, pods, state = snap
    layout = layout_of_job(job)
    lines = [f"{name}: {state.state}" + (f" ({state.reason})" if state.reason else "")]
    for v in sorted((pod_view(p, layout) for p in pods), key=lambda v: v.name):
        detail = f" {v.detail}" if v.detail else ""
        lines.append(f"  {v.name}: {v.phase}, {v.restarts} restarts{detail}")
    return lines


class WaitView:
    """A live table on a terminal; elsewhere (CI, pipes) a line block per change."""

    def __init__(self, name: str, live: bool | None = None) -> None:
        self.name = name
        self.console = Console(stderr=True)
        use_live = self.console.is_terminal if live is None else live
        self._live = Live(console=self.console, auto_refresh=False) if use_live else None
        self._last: list[str] = []

    def __enter__(self) -> WaitView:
        if self._live:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._live.stop()

    def __call__(self, snap: Snapshot) -> None:
        if self._live:
            self._live.update(table(self.name, snap), refresh=True)
            return
        lines = _lines(self.name, snap)
        if lines != self._last:
            print("\n".join(lines), file=sys.stderr, flush=True)
            self._last = lines


def status_doc(name: str, namespace: str, snap: Snapshot) -> Obj:
    job, pods, state = snap
    return {
        "name": name,
        "namespace": namespace,
        "state": state.state,
        "reason": state.reason,
        "conditions": ((job or {}).get("status") or {}).get("conditions") or [],
        "pods": [_pod_doc(pod_view(p, layout_of_job(job))) for p in pods],
    }


def _pod_doc(view: PodView) -> Obj:
    return {
        "name": view.name,
        "replica": view.replica,
        "index": view.index,
        "phase": view.phase,
        "restarts": view.restarts,
        "detail": view.detail,
    }


def _by_hostname(pods: list[Obj], hostname: str, layout: Layout) -> str | None:
    """The pod with that hostname: a Job's or JobSet's pod name has a random suffix; a
    target whose pods are named like their hostnames names the pod even before it exists."""
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (spec.get("hostname") or meta.get("name")) == hostname:
            return meta.get("name")
    return hostname if layout.pods_named_like_hosts else None


def node_pod(job: Obj, pods: list[Obj], replica: str | None, index: int | None) -> str | None:
    """The pod `logs --replica/--index` names; None when they name none (rank 0's then)."""
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    name = job["metadata"]["name"]
    if layout is None:
        return None
    host = layout.logs_hostname(name, replica, index)
    return None if host is None else _by_hostname(pods, host, layout)


def rank0_pod(kube: Kube, job: Obj, pods: list[Obj]) -> str | None:
    """The pod hosting global rank 0: node 0 under static rendezvous; under c10d the
    running pod whose trainer logged rank 0's `start` event (only rank 0 logs JSON)."""
    layout = layout_for_kind(job["apiVersion"], job["kind"])
    host = layout.rank0_hostname(job) if layout else None
    if layout is not None and host is not None:
        return _by_hostname(pods, host, layout)
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
    kube: Kube, name: str, namespace: str, timeout: float | None, follow: bool
) -> JobState:
    """Wait for the job's end (streaming rank 0's log first when asked); a job that did not
    succeed is an OperationError with its reason."""
    started = time.monotonic()
    if follow:
        with WaitView(name, live=False) as view:
            job, pods, _ = wait(
                kube, name, namespace, view, timeout, _rank0_running(kube), started=started
            )
        pod = rank0_pod(kube, job, pods) if job else None
        if pod and job:
            print(f"--- logs of {pod} ---", file=sys.stderr, flush=True)
            for line in kube.logs(pod, namespace, container_of(job), follow=True):
                print(line, flush=True)
    with WaitView(name, live=None if not follow else False) as view:
        job, _, state = wait(kube, name, namespace, view, timeout, started=started)
    if not state.ok:
        hint = "" if state.state == "NotFound" else f"; `ddpdeploy down {name}` removes it"
        raise OperationError(f"{kind_of(job)} {name} {state.state}: {state.reason}{hint}")
    return state
