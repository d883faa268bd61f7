"""Distributed setup for ddptrain.py: torchrun's env, the process group, the device, exit."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from ddptrain_args import warn


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


def setup(backend: str, timeout_s: int) -> DistEnv:
    """Read torchrun's env, pick backend and device, and create the default process group."""
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
    _init_process_group(env, timedelta(seconds=timeout_s))
    _warn_if_restarts_cannot_work(env)
    return env


def _init_process_group(env: DistEnv, timeout: timedelta) -> None:
    """Create the default process group so that torchrun worker restarts work.

    torchrun's agent shares one TCPStore with its workers (TORCHELASTIC_USE_AGENT_STORE=True)
    and that store outlives a restart: keys of the previous round (peers' gloo/nccl
    addresses) are still there, and restarted workers connect to dead peers ("Connection
    refused"). With a single agent (or static rendezvous, where every agent restarts only
    after its own workers failed) the restart count is the same on every worker of a round,
    so it namespaces the keys. With c10d and several agents the counts differ between nodes;
    there the launcher must set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which makes the agents
    publish a fresh MASTER_PORT each round and rank 0's worker host a fresh store (env://).
    """
    e = os.environ
    kw = {"rank": env.rank, "world_size": env.world_size, "timeout": timeout}
    if "MASTER_ADDR" not in e:
        dist.init_process_group(env.backend, store=dist.HashStore(), **kw)
    elif e.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        addr, port = e["MASTER_ADDR"], int(e["MASTER_PORT"])
        base = dist.TCPStore(addr, port, env.world_size, is_master=False, timeout=timeout)
        store = dist.PrefixStore(f"ddptrain/restart-{env.restart_count}/", base)
        dist.init_process_group(env.backend, store=store, **kw)
    else:
        dist.init_process_group(env.backend, init_method="env://", **kw)


def _warn_if_restarts_cannot_work(env: DistEnv) -> None:
    e = os.environ
    shared_store = e.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    restarts = int(e.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0
    if env.is_main and int(e.get("GROUP_WORLD_SIZE", 1)) > 1 and shared_store and restarts:
        warn(
            "several nodes share the agent store: worker restarts under c10d rendezvous "
            "need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every torchrun agent's env"
        )


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
