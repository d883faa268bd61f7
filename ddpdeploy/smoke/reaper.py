"""This process as the child subreaper of a local run (Linux): what a run's process orphans
(a daemon that cleared its environment and left its session: `env -i`, setsid and a double
fork) is re-parented here instead of to init, so the run's end can find it by its parent
and kill it, where the environment marker (smoke.local.RUN_MARKER) cannot.

Only processes that became descendants of this one after the run began are the run's: any
child this process had before (and that child's own descendants) is left alone, and a smoke
run in another process is never a descendant of this one.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37

Stamp = tuple[int, int]  # (pid, start time in clock ticks): a pid alone may be reused


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl: Callable[..., int] = libc.prctl
        return prctl
    except (OSError, AttributeError):
        return None


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants; True when this call set it (it
    was not set before), so the caller unsets it when done. Harmless where unsupported."""
    prctl = _prctl()
    if prctl is None:
        return False
    was = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) == 0 and was.value:
        return False
    return bool(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def stop_subreaping() -> None:
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of ``pid`` from /proc/PID/stat; None once gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()  # after the command name, which may hold spaces
    try:
        return fields[0], int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _tree() -> dict[int, list[tuple[int, str, int]]]:
    """Every process by its parent: ppid -> [(pid, state, start time)]."""
    children: dict[int, list[tuple[int, str, int]]] = {}
    if not os.path.isdir("/proc"):
        return children
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            state, ppid, start = stat
            children.setdefault(ppid, []).append((int(entry.name), state, start))
    return children


def descendants(skip: frozenset[Stamp] = frozenset()) -> dict[int, tuple[str, int]]:
    """This process's descendants, pid -> (state, start time), not entering ``skip``."""
    children = _tree()
    found: dict[int, tuple[str, int]] = {}
    todo = [os.getpid()]
    while todo:
        for pid, state, start in children.get(todo.pop(), []):
            if (pid, start) in skip or pid in found:
                continue
            found[pid] = (state, start)
            todo.append(pid)
    return found


def snapshot() -> frozenset[Stamp]:
    """What is this process's before a run: none of it is the run's."""
    return frozenset((pid, start) for pid, (_, start) in descendants().items())


def kill_descendants(before: frozenset[Stamp], timeout: float = 10.0) -> None:
    """SIGKILL every descendant that is not in ``before`` (nor below it) until none is
    alive, then reap those re-parented here (the agents are reaped by their Popen)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = [pid for pid, (state, _) in descendants(before).items() if state not in "ZX"]
        if not live:
            break
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    me = os.getpid()
    for pid in descendants(before):
        stat = _stat(pid)
        if stat is not None and stat[1] == me and stat[0] in "ZX":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
