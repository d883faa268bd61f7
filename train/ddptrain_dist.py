"""Distributed set-up for ddptrain.py: torchrun's env, the process group (ddpkit's) and the
device; the SIGTERM stop every rank agrees on; exit."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import ddpkit
import torch
import torch.distributed as dist
from ddptrain_args import Args

STOP_CHECK_S = 0.25  # auto cadence of the stop agreement (--stop-check-every 0)
CALIBRATION_STEPS = 10  # auto mode checks every step until it has timed this many


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


def setup(args: Args) -> DistEnv:
    """Read torchrun's env, pick backend and device, create the default process group and
    run ddpkit's collective probe on it (unless --no-probe); ddpkit's run record and
    diagnostics settings from the flags."""
    ddpkit.set_seed(args.seed)
    ddpkit.diagnostics(
        ranks_every=args.ranks_every, straggler_factor=args.straggler_factor,
        hang_timeout_s=args.hang_timeout_s, hang_dir=args.checkpoint_dir,
    )  # fmt: skip
    e, backend = os.environ, args.backend
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
        timeout=timedelta(seconds=args.timeout_s),
        probe=not args.no_probe,
        probe_min_busbw=args.probe_min_busbw,
    )
    return env


# ---- SIGTERM: every rank stops at the same step, whichever rank got the signal -----------
class StopAgreement:
    """The SIGTERM handler only sets a flag; ranks agree on it with an all-reduce(MAX).

    Every ``every`` steps each rank reads the previous all-reduce and starts the next one
    asynchronously, so the agreement overlaps a step of training instead of adding a round
    trip to every step. Auto mode (every=0) checks every step until it has timed
    CALIBRATION_STEPS steps; then the ranks agree (MAX of their proposals, carried by the
    same all-reduce) on the number of steps that take about STOP_CHECK_S.
    """

    def __init__(self, every: int) -> None:
        self._requested = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self._requested.set())
        self._auto = every == 0
        self._every = every or 1
        self._since_check = 0
        self._pending: tuple[dist.Work, torch.Tensor] | None = None
        self._device = torch.device("cpu")
        self._calibrate_at: int | None = None
        self._first_step, self._t_first = 0, 0.0

    def start(self, step: int, device: torch.device) -> None:
        """Called just before the first step (``step`` steps are already done)."""
        self._device = device
        self._first_step, self._t_first = step, time.perf_counter()
        self._calibrate_at = step + CALIBRATION_STEPS if self._auto else None

    def should_stop(self, step: int) -> bool:
        """After optimizer step ``step``: True on every rank at the same step."""
        self._since_check += 1
        if self._since_check < self._every:
            return False
        self._since_check = 0
        stop = self._read_previous()
        self._start_next(step)
        return stop

    def finish(self) -> None:
        """Complete the all-reduce in flight: every rank runs the same collectives."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None

    def _read_previous(self) -> bool:
        if self._pending is None:
            return False
        work, flag = self._pending
        work.wait()
        stop, cadence = flag.tolist()
        if cadence > 0:  # the agreed cadence (auto mode)
            self._every = int(cadence)
        return bool(stop)

    def _start_next(self, step: int) -> None:
        proposal = 0
        if self._calibrate_at is not None and step >= self._calibrate_at:
            per_step = (time.perf_counter() - self._t_first) / max(1, step - self._first_step)
            proposal = max(1, min(1000, round(STOP_CHECK_S / max(per_step, 1e-6))))
            self._calibrate_at = None
        flag = torch.tensor([int(self._requested.is_set()), proposal], device=self._device)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)


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
