"""The CPU budget: how many worker processes a smoke run may start on this host."""

from __future__ import annotations

import os

from ddpdeploy.errors import UserError

# Workers (all nodes together) per CPU core before a smoke run is refused without --force:
# 4 lets the README's 2 x 2 job and a 2 x 4 run on two cores; beyond that gloo timeouts
# and a frozen machine are likelier than a useful answer.
MAX_WORKERS_PER_CORE = 4


def check_cpu_budget(nodes: int, procs: int, force: bool, cores: int | None = None) -> None:
    """Refuse a run that would start far more workers than this host has cores."""
    cores = cores or usable_cores()
    workers = nodes * procs
    limit = MAX_WORKERS_PER_CORE * cores
    if workers > limit and not force:
        raise UserError(
            f"--nodes/--procs: {nodes} x {procs} = {workers} worker processes on {cores} CPU "
            f"core(s) is more than {limit} ({MAX_WORKERS_PER_CORE} per core) and would thrash "
            "this machine; use fewer nodes or procs, or pass --force"
        )


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (taskset, cgroups)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
