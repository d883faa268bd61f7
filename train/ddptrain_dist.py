"""Distributed setup for ddptrain.py: torchrun's env, the process group (ddpkit's), the
device, exit."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import ddpkit
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """Who this process is (torchrun's env), its backend and its device."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    restart_count: int
    host: str
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(
    backend: str, timeout_s: int, probe: bool = True, probe_min_busbw: float | None = None
) -> DistEnv:
    """Read torchrun's env, pick backend and device, create the default process group and
    run ddpkit's collective probe on it (unless ``probe`` is False)."""
    e = os.environ
    local_rank = int(e.get("LOCAL_RANK", 0))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # before the process group binds a device
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    alone = "MASTER_ADDR" not in e  # plain `python ddptrain.py`: a world of one
    env = DistEnv(
        rank=0 if alone else int(e.get("RANK", 0)),
        local_rank=local_rank,
        world_size=1 if alone else int(e.get("WORLD_SIZE", 1)),
        local_world_size=int(e.get("LOCAL_WORLD_SIZE", 1)),
        group_rank=int(e.get("GROUP_RANK", 0)),
        restart_count=int(e.get("TORCHELASTIC_RESTART_COUNT", 0)),
        host=socket.gethostname(),
        backend=backend,
        device=device,
    )
    # ddpkit's restart-safe group (the store namespaced per torchrun restart): the same
    # call a user's script makes, see ddpkit.init_process_group and train/README.md.
    ddpkit.init_process_group(
        backend,
        timeout=timedelta(seconds=timeout_s),
        probe=probe,
        probe_min_busbw=probe_min_busbw,
    )
    return env


def exit_now(code: int) -> NoReturn:
    """Leave the process group and exit without tearing down torch's objects.

    Everything is durable and flushed here. torch 2.13 can deadlock at exit with gloo: when
    DDP's Reducer (which still holds the process group) is freed, the main thread joins the
    group's worker thread while holding the GIL, and that thread may be freeing the last
    work object, which needs the GIL. Seen as a rare hang after "done" with two agents
    (py-spy: ~ProcessGroupGloo in std::thread::join vs gil_scoped_acquire in
    ~AsyncBarrierWork).
    """
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
