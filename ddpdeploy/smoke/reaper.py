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
from typing import NamedTuple

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


class _Proc(NamedTuple):
    state: str
    ppid: int
    pgrp: int
    start: int  # clock ticks since boot


def _stat(pid: int) -> _Proc | None:
    """What /proc/PID/stat says of ``pid``; None once gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()  # after the command name, which may hold spaces
    try:
        return _Proc(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def _table() -> dict[int, _Proc]:
    """Every process on this host."""
    table: dict[int, _Proc] = {}
    if not os.path.isdir("/proc"):
        return table
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = stat
    return table


def _below(table: dict[int, _Proc], skip: frozenset[Stamp]) -> dict[int, _Proc]:
    """This process's descendants in ``table``, not entering ``skip``."""
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    found: dict[int, _Proc] = {}
    todo = [os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), []):
            if (pid, table[pid].start) in skip or pid in found:
                continue
            found[pid] = table[pid]
            todo.append(pid)
    return found


def descendants(skip: frozenset[Stamp] = frozenset()) -> dict[int, tuple[str, int]]:
    """This process's descendants, pid -> (state, start time), not entering ``skip``."""
    return {pid: (p.state, p.start) for pid, p in _below(_table(), skip).items()}


def snapshot() -> frozenset[Stamp]:
    """What is this process's before a run: none of it is the run's."""
    return frozenset((pid, start) for pid, (_, start) in descendants().items())


def reap_orphans(keep: frozenset[int]) -> int:
    """Reap the orphans re-parented here that have exited (zombies), but not ``keep`` (the
    agents, which their Popen reaps); how many. Without it a long run whose script orphans
    processes over and over (a double fork per epoch) fills the pid table with zombies."""
    me, reaped = os.getpid(), 0
    for pid in _children(me) - keep:
        stat = _stat(pid)
        if stat is not None and stat.ppid == me and stat.state == "Z":
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped += 1
    return reaped


def _children(pid: int) -> set[int]:
    """``pid``'s children: from /proc's per-thread lists where the kernel keeps them, else
    from every process's parent."""
    found: set[int] = set()
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            found.update(int(c) for c in Path(task.path, "children").read_text().split())
    except (OSError, ValueError):
        return {child for child, proc in _table().items() if proc.ppid == pid}
    return found


KILL_TIMEOUT_S = 10.0  # how long kill_descendants goes on killing before it gives up


def state(pid: int) -> str | None:
    """``pid``'s state letter (R, S, D, Z, ...); None once gone."""
    stat = _stat(pid)
    return None if stat is None else stat.state


def kill_descendants(before: frozenset[Stamp], timeout: float | None = None) -> list[int]:
    """SIGKILL every descendant that is not in ``before`` (nor below it) until none is
    alive, then reap those re-parented here (the agents are reaped by their Popen); the
    pids still alive at ``timeout``.

    A process that forks and exits over and over moves on to a new pid between the scan
    and the kill, and a single scan can miss it altogether (gone, its child not yet
    listed, its parent a zombie): the tree must be found empty on several scans in a row,
    and each process group whose members are all the run's (zombies included) is killed
    whole, which the kernel does at once (a fork in it is in the group and killed, or
    fails)."""
    deadline = time.monotonic() + (KILL_TIMEOUT_S if timeout is None else timeout)
    empty_scans = 0
    live: list[int] = []
    while time.monotonic() < deadline:
        table = _table()
        run = _below(table, before)
        # A zombie's group too: a hopper's live pid may be newer than the listing.
        others = {p.pgrp for pid, p in table.items() if pid not in run}
        for group in {p.pgrp for p in run.values()} - others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        live = [pid for pid, p in run.items() if p.state not in "ZX"]
        if not live:
            empty_scans += 1
            if empty_scans >= _EMPTY_SCANS:
                break
            time.sleep(0.02)
            continue
        empty_scans = 0
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    me = os.getpid()
    for pid in descendants(before):
        stat = _stat(pid)
        if stat is not None and stat.ppid == me and stat.state in "ZX":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    return [] if empty_scans >= _EMPTY_SCANS else live


_EMPTY_SCANS = 3  # scans in a row that find no live descendant before the end is believed
