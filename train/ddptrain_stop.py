"""SIGTERM for ddptrain.py: every rank stops at the same step, whichever rank got the signal."""

from __future__ import annotations

import signal
import threading
import time

import torch
import torch.distributed as dist

STOP_CHECK_S = 0.25  # auto cadence of the agreement (--stop-check-every 0)
CALIBRATION_STEPS = 10  # auto mode checks every step until it has timed this many


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
