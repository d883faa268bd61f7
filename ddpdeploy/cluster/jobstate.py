"""A job's conditions and its pods -> one state and the reason behind it, for every target
(PyTorchJob, TrainJob, batch/v1 Job).

Pure: plain dicts in (as the API returns them), a value out; no client, no clock. `up
--wait`, `status` and `list` all read a job through here, so they agree on what "stuck"
means. What differs per target (its success condition, where a pod's replica and index
are) is the target's (ddpdeploy.targets).
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddpdeploy.events import own_text, parse_event, split_ranks, summary_failures
from ddpdeploy.formats import counted
from ddpdeploy.obj import Obj
from ddpdeploy.targets import Layout, layout_for_kind

# Container waiting reasons that no amount of waiting fixes.
IMAGE_PULL = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")
CONFIG_ERRORS = ("CreateContainerConfigError", "CreateContainerError")
# The scheduler's reasons a node turned a pod down that end by themselves: what runs there
# now frees up (another job ends) or an autoscaler adds a node. One such node is enough.
# A claim not bound yet (Immediate binding: the provisioner makes its volume, seconds after
# `up` made the claim) is the same: the scheduler tries again once it is bound.
_PRESSURE = re.compile(
    r"^(\d+ (Insufficient \S+|Too many pods)|(\d+ )?pod has unbound immediate "
    r"PersistentVolumeClaims)$",
    re.ASCII,
)


@dataclass(frozen=True)
class PodView:
    name: str
    replica: str
    index: int | None  # None: the pod's index label or annotation is no plain number
    phase: str
    restarts: int
    detail: str  # why it is not running, or ""


@dataclass(frozen=True)
class JobState:
    state: str  # Pending, Running, Restarting, Succeeded, Failed, or a stuck pod's reason
    reason: str
    done: bool  # no point in waiting longer
    ok: bool = False


def _statuses(pod: Obj) -> list[Obj]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _unschedulable(pod: Obj) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        unscheduled = cond.get("type") == "PodScheduled" and cond.get("status") == "False"
        if unscheduled and cond.get("reason") == "Unschedulable":
            return cond.get("message") or "no node fits the pod"
    return None


def _last_exit(status: Obj) -> str:
    term = (status.get("lastState") or {}).get("terminated") or {}
    if not term:
        return ""
    why = f" ({term['reason']})" if term.get("reason") else ""
    return f", last exit code {term.get('exitCode')}{why}"


def crash_line(message: str) -> str | None:
    """The failed rank's own last line in a container's termination message (with
    terminationMessagePolicy FallbackToLogsOnError the kubelet keeps the log's last 2 KB
    there): the rank torchrun's summary names (its root cause first), else the last rank
    that printed; else the container's last line that is no rank's (a failure before
    torchrun started); None when there is none. Lines end at newlines only, as every other
    reader of a log splits them (str.splitlines also breaks at U+2028 and form feeds)."""
    lines = message.split("\n")
    # A rank's partial line runs on into the next rank's: each part is its own rank's.
    own = [(r, t) for line in lines for r, t in split_ranks(line) if r is not None]
    said = {rank: own_text(text).strip() for rank, text in own if own_text(text).strip()}
    failed = sorted(summary_failures("", lines), key=lambda f: not f.root)
    if failed and failed[0].root:
        # torchrun named the root cause: it is the cause even when it printed nothing (a
        # SIGSEGV); another rank's line is only the consequence ("Connection closed by peer").
        root = failed[0]
        if root.rank in said:
            return f"rank {root.rank}: {said[root.rank]}"
        silent = (
            f"rank {root.rank} (root cause) exited with {_exit(root.code)} and printed "
            "nothing in the log's last 2 KB"
        )
        if not said:
            return silent
        # Another rank's last line, said to be that: its own error when every rank failed
        # alike (an argparse error), or the consequence of the root cause's exit.
        last = next(r for r, _ in reversed(own) if r in said)
        return f"{silent}; the last rank line there is rank {last}'s: {said[last]}"
    for failure in failed:
        if failure.rank in said:
            return f"rank {failure.rank}: {said[failure.rank]}"
    if said:
        last = next(r for r, _ in reversed(own) if r in said)
        return f"rank {last}: {said[last]}"
    # A rank's line with nothing of its own ("[rank1]:") is no line to show.
    rest = [line.strip() for line in lines if line.strip() and split_ranks(line)[0][0] is None]
    return rest[-1] if rest else None


def _exit(code: int) -> str:
    """A worker's exit as torchrun's summary gives it: a negative code is a signal."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"{signal.Signals(-code).name} ({code})"
        return f"signal {-code}"
    return f"exit code {code}"


def _restarted(count: int) -> str:
    return "restarted once" if count == 1 else f"restarted {count} times"


def _memory_limit(pod: Obj, container: str) -> str:
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") == container:
            return str(((c.get("resources") or {}).get("limits") or {}).get("memory") or "")
    return ""


def _held(pod: Obj) -> JobState | None:
    """A deleted pod whose containers have stopped, kept by finalizers: it holds its name,
    so no pod of that name (the job's next run) can be made until they are removed."""
    meta = pod.get("metadata") or {}
    finalizers = meta.get("finalizers") or []
    if not meta.get("deletionTimestamp") or not finalizers:
        return None
    # Still stopping (its grace period) while a container runs. Stopped shows as terminated,
    # or, once the 1.20 kubelet has removed the dead container, as waiting.
    if any((st.get("state") or {}).get("running") is not None for st in _statuses(pod)):
        return None
    name = meta.get("name", "?")
    return JobState(
        "Terminating",
        f"pod {name} was deleted but does not go: finalizer(s) {', '.join(finalizers)} hold "
        f"it, so no new pod of that name can start (remove them: kubectl patch pod {name} "
        '--type merge -p \'{"metadata":{"finalizers":null}}\')',
        done=True,
    )


def _earlier_run(pod: Obj, job: Obj) -> bool:
    """A deleted pod whose controller is another object of the job's name (an earlier run:
    `down` then `resume`); the watch passes such pods only while they hold their name."""
    meta = pod.get("metadata") or {}
    if not meta.get("deletionTimestamp"):
        return False
    uid = (job.get("metadata") or {}).get("uid")
    for owner in meta.get("ownerReferences") or []:
        if isinstance(owner, dict) and owner.get("controller"):
            # Only the job's kind has its uid: a TrainJob's pods are its JobSet's Job's,
            # whose uid is never the TrainJob's, so theirs tells no run from another.
            job_ref = (job.get("kind"), (job.get("metadata") or {}).get("name"))
            same = (owner.get("kind"), owner.get("name")) == job_ref
            return bool(uid) and same and owner.get("uid") != uid
    return False


def _stopping(old: list[Obj], waited: bool = True) -> str:
    """Why the new pods are missing: the earlier run's pods still stop (their grace period);
    ``waited``: a new pod waits for their names (else they are only named)."""
    names = sorted((p.get("metadata") or {}).get("name", "?") for p in old)
    ends = max(str((p.get("metadata") or {}).get("deletionTimestamp")) for p in old)
    pods = f"pod {names[0]}" if len(names) == 1 else f"pods {', '.join(names)}"
    verb = "is" if len(names) == 1 else "are"
    then = f"; the new pods start when {'it is' if verb == 'is' else 'they are'} gone"
    return (
        f"{pods} of an earlier run of this job {verb} still stopping (grace period, until "
        f"{ends} at the latest){then if waited else ''}"
    )


def _elastic_needs(job: Obj, layout: Layout, pods: list[Obj], high: int) -> set[str]:
    """The names an elastic job may still make a pod of: below its maximum, and only while
    fewer pods than that exist (at its maximum no new pod waits for any name)."""
    if len(pods) >= high:
        return set()
    name = (job.get("metadata") or {}).get("name", "")
    have = {(p.get("metadata") or {}).get("name") for p in pods}
    wanted = {
        layout.node_hostname(name, i, replica)
        for replica in layout.replica_counts(job) or {"Worker": 0}
        for i in range(high)
    }
    return wanted - have


def pod_view(pod: Obj, layout: Layout) -> PodView:
    """One pod of a job of ``layout``'s target, as views show it."""
    meta = pod.get("metadata") or {}
    statuses = _statuses(pod)
    detail = ""
    for st in statuses:
        waiting = (st.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            detail = f"{waiting['reason']}: {waiting.get('message') or st.get('image', '')}".strip()
            break
    if not detail and (msg := _unschedulable(pod)):
        detail = f"Unschedulable: {msg}"
    if meta.get("deletionTimestamp"):
        finalizers = meta.get("finalizers") or []
        held = f" (finalizers: {', '.join(finalizers)})" if finalizers else ""
        detail = f"Terminating{held}" + (f"; {detail}" if detail else "")
    replica, index = layout.pod_place(pod)
    return PodView(
        name=meta.get("name", ""),
        replica=replica,
        index=index,
        phase=(pod.get("status") or {}).get("phase") or "Pending",
        restarts=sum(int(st.get("restartCount") or 0) for st in statuses),
        detail=detail,
    )


def _stuck(pod: Obj) -> JobState | None:
    """A reason this pod will not get anywhere by itself, or None."""
    name = (pod.get("metadata") or {}).get("name", "?")
    for st in _statuses(pod):
        waiting = (st.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        message = waiting.get("message") or ""
        if reason in IMAGE_PULL:
            what = f"cannot pull image {st.get('image', '?')}"
            return JobState(reason, f"pod {name}: {what}: {message}".rstrip(": "), done=True)
        if reason in CONFIG_ERRORS:
            return JobState(reason, f"pod {name}: {message or reason}", done=True)
        if reason == "CrashLoopBackOff":
            count = int(st.get("restartCount") or 0)
            term = (st.get("lastState") or {}).get("terminated") or {}
            container = st.get("name") or "?"
            if term.get("reason") == "OOMKilled":
                limit = _memory_limit(pod, container)
                text = (
                    f"pod {name}: container {container} went over its memory limit"
                    f"{f' ({limit})' if limit else ''} and was killed ({_restarted(count)}); "
                    "raise --memory (per node: request and limit)"
                )
                return JobState("OOMKilled", text, done=True)
            text = f"pod {name}: container {container} {_restarted(count)}{_last_exit(st)}"
            if line := crash_line(str(term.get("message") or "")):
                text += f": {line}"
            return JobState(reason, text, done=True)
    if (msg := _unschedulable(pod)) is not None:
        # Waited out when a node only lacks room now (`up` said so when it applied the
        # job); a pod no node will ever take (selector, taints) ends the wait.
        return JobState("Unschedulable", f"pod {name}: {msg}", done=not _room_may_free(msg))
    return _held(pod)


def _room_may_free(message: str) -> bool:
    """Whether some node turned the pod down only for what is in use on it now
    ("0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had taint ...")."""
    _, _, reasons = message.partition("nodes are available: ")
    first = reasons.split(". ", 1)[0].rstrip(".")  # newer schedulers add "preemption: ..."
    return any(_PRESSURE.match(r.strip()) for r in first.split(","))


def _last_failure(pods: list[Obj]) -> str:
    """A running job whose container failed and was started again (a crash loop between two
    back-offs looks like this): the first such pod's last failure, with its rank's line."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        for st in _statuses(pod):
            term = (st.get("lastState") or {}).get("terminated") or {}
            if not term or term.get("exitCode") == 0:
                continue
            name = (pod.get("metadata") or {}).get("name", "?")
            count = int(st.get("restartCount") or 0)
            text = f"; pod {name}: container {st.get('name')} {_restarted(count)}{_last_exit(st)}"
            line = crash_line(str(term.get("message") or ""))
            return text + (f": {line}" if line else "")
    return ""


def _condition(job: Obj, kind: str) -> Obj | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def job_state(job: Obj | None, pods: list[Obj], taken: Mapping[str, str] | None = None) -> JobState:
    """The job's state: its terminal conditions first, then its deletion (a finalizer may
    hold it for good), then any stuck pod, then progress. ``taken``: a missing pod's name
    -> the line that says which other pod holds it (``absent_names``: which to look up)."""
    return _deleting(job, _job_state(job, pods, taken or {}))


def absent_names(job: Obj, pods: list[Obj]) -> list[str]:
    """The pod names a fixed-size job needs that none of ``pods`` (all the job's, an
    earlier run's too) has: what a caller may look up by name (a pod the job's label
    selector or ownership rule does not take holds it)."""
    layout = layout_for_kind(job.get("apiVersion", ""), job.get("kind", ""))
    # Only a target whose pod is named as its host: a TrainJob's pod is <host>-<random>, so
    # a pod named as the bare host is never one it needs (a StatefulSet's `j-node-0-1`).
    if layout is None or not layout.pods_named_like_hosts:
        return []
    return _missing(job, layout, pods)


def held_by(job: Obj) -> str:
    """What keeps a deleted ``job`` (one with a deletionTimestamp): its finalizers, and
    whose they are to remove; "" when none is left (it goes)."""
    meta = job.get("metadata") or {}
    finalizers = [str(f) for f in meta.get("finalizers") or []]
    if not finalizers:
        return ""
    kind, name = str(job.get("kind", "")).lower(), meta.get("name", "?")
    return (
        f"held by finalizer(s) {', '.join(finalizers)}: whoever set them must remove them "
        f"(kubectl patch {kind} {name} -n {meta.get('namespace', '?')} --type merge -p "
        '\'{"metadata":{"finalizers":null}}\')'
    )


def _deleting(job: Obj | None, state: JobState) -> JobState:
    """A job being deleted is Terminating, said ahead of its pods' progress (they run on
    while a finalizer holds it); a job that ended keeps its end."""
    since = ((job or {}).get("metadata") or {}).get("deletionTimestamp")
    if not since or state.state in ("Succeeded", "Failed", "NotFound", "Unknown"):
        return state
    held = held_by(job or {})
    now = f"{state.state}: {state.reason}" if state.reason else state.state
    return JobState(
        "Terminating", f"being deleted since {since}{f', {held}' if held else ''}; {now}", False
    )


def _job_state(job: Obj | None, pods: list[Obj], taken: Mapping[str, str]) -> JobState:
    if job is None:
        return JobState("NotFound", "the job no longer exists", done=True)
    layout = layout_for_kind(job.get("apiVersion", ""), job.get("kind", ""))
    if layout is None:
        return JobState("Unknown", f"no target reads a {job.get('kind')!r} object", done=True)
    if cond := _condition(job, layout.succeeded):
        return JobState("Succeeded", cond.get("message") or "", done=True, ok=True)
    if cond := _condition(job, layout.failed):
        return JobState("Failed", cond.get("message") or cond.get("reason") or "", done=True)
    earlier = {id(p) for p in pods if _earlier_run(p, job)}  # not this run's: counted apart
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        # An earlier run's pod matters only as what holds a name (its old crash is no news).
        if stuck := (_held(pod) if id(pod) in earlier else _stuck(pod)):
            return stuck
    if cond := _condition(job, "Restarting"):
        return JobState("Restarting", cond.get("message") or "", done=False)
    old = [p for p in pods if id(p) in earlier]
    pods = [p for p in pods if id(p) not in earlier]
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if _condition(job, "Running") or running:
        missing = _missing(job, layout, pods)
        # An old pod explains a missing one only by holding its name: a job of a fixed size
        # says which names it needs; an elastic one any name below its maximum, while it
        # has fewer pods than that (cluster3 F11: at its maximum none waits).
        elastic = layout.elastic_range(job)
        needs = set(missing) if elastic is None else _elastic_needs(job, layout, pods, elastic[1])
        held = [p for p in old if (p.get("metadata") or {}).get("name") in needs]
        note = _last_failure(pods) + (f"; {_stopping(held)}" if held else "")
        if elastic is not None and (idle := [p for p in old if p not in held]):
            note += f"; {_stopping(idle, waited=False)}"
        unheld = [m for m in missing if m not in {p["metadata"]["name"] for p in held}]
        for name in (m for m in unheld if m in taken):
            # Another pod holds the name: "yet" would promise what cannot happen.
            note += f"; {taken[name]}"
        unheld = [m for m in unheld if m not in taken]
        if unheld:
            # A name the operator cannot take (someone else's pod holds it) leaves the job a
            # node short for good: counted against the job's size, and named.
            note += f"; no pod {', '.join(unheld[:4])}{' …' if len(unheld) > 4 else ''} yet"
        of = len(pods) + len(missing)
        return JobState("Running", f"{len(running)}/{of} pods running{note}", done=False)
    if _condition(job, "Suspended"):
        return JobState("Suspended", "", done=False)
    if old:
        return JobState("Pending", _stopping(old), done=False)
    return JobState(
        "Pending", f"{counted(len(pods), 'pod')} created" if pods else "no pods yet", done=False
    )


def conditions_state(job: Obj) -> JobState:
    """The job's state from its own object alone, for when its pods cannot be read (RBAC
    forbids listing them): its terminal conditions as ``job_state`` reads them, else the
    condition the controller set last (Running, Restarting, Suspended, Created), else
    Pending; the reason says that the pods were not read."""
    unread = "its pods could not be read"
    layout = layout_for_kind(job.get("apiVersion", ""), job.get("kind", ""))
    if layout is None:
        return job_state(job, [])
    if _condition(job, layout.succeeded) or _condition(job, layout.failed):
        return job_state(job, [])  # final: the pods do not change it
    conds = [
        c
        for c in (job.get("status") or {}).get("conditions") or []
        if isinstance(c, dict) and c.get("status") == "True" and isinstance(c.get("type"), str)
    ]
    if not conds:
        return _deleting(job, JobState("Pending", f"no condition yet; {unread}", done=False))
    last = conds[-1]  # the operators append; the newest is last
    # The operators' messages end in a full stop ("PyTorchJob j is running."): not ".;".
    message = str(last.get("message") or last.get("reason") or "").rstrip(" .")
    state = JobState(last["type"], f"{message}; {unread}" if message else unread, done=False)
    return _deleting(job, state)


def _missing(job: Obj, layout: Layout, pods: list[Obj]) -> list[str]:
    """The hostnames of the pods a fixed-size job asks for that do not exist (a PyTorchJob's
    pod is named so; a TrainJob's is found by its completion index); none for an elastic
    range, whose size may lawfully be below its maximum."""
    if layout.elastic_range(job) is not None:
        return []
    name = (job.get("metadata") or {}).get("name", "")
    have = {(p.get("metadata") or {}).get("name") for p in pods}
    if not layout.pods_named_like_hosts:  # a TrainJob's pods: <host>-<random>; by place
        places = [layout.pod_place(p) for p in pods]
        have = {layout.node_hostname(name, i, r) for r, i in places if i is not None}
    wanted = [
        layout.node_hostname(name, i, replica)  # a PyTorchJob's pod is named as its host
        for replica, count in layout.replica_counts(job).items()
        for i in range(count)
    ]
    return [w for w in wanted if w not in have]


def job_size(job: Obj) -> tuple[int, int]:
    """(nodes, GPUs per node) of a job object of any target."""
    layout = layout_for_kind(job.get("apiVersion", ""), job.get("kind", ""))
    return layout.job_size(job) if layout else (0, 0)


def start_event(lines: list[str]) -> dict[str, Any] | None:
    """The fields of rank 0's `start` event in a trainer log (only rank 0 logs JSON), read
    by the smoke room's parser of the same protocol; None when there is none."""
    for line in lines:
        for _, text in split_ranks(line.strip()):
            event = parse_event(text)
            if event is not None and event.kind == "start":
                return event.fields
    return None


def logs_show_rank0(lines: list[str]) -> bool:
    """True when a pod's log shows global rank 0 ran there: its `start` event, or any line
    torchrun prefixed with rank 0 (a plain script logs no events, and under c10d no pod
    holds rank 0 by name)."""
    if start_event(lines) is not None:
        return True
    return any(rank == 0 for t in lines for rank, _ in split_ranks(t.strip()))
