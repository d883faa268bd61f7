"""Checkpoints for ddptrain.py: snapshot, async atomic write, verify, retain, resume.

Layout in the checkpoint directory, per checkpoint at optimizer step N:
  ckpt-step-000000N.pt    torch.save payload (its contents: see ddptrain_state.py)
  ckpt-step-000000N.json  sidecar: step, world size, host, rank, restart count, time, sha256
The sidecar is written (atomically) only after the payload is durable, so it is the commit
point: a payload without a sidecar, or whose sha256 does not match, is never loaded. The
folder's format, writes, retention, verification and the ranks' agreement on resume are
ddpkit's (the module a user's script imports); this file adds the trainer's asynchronous
snapshot and every rank's RNG state on top.

No collective here goes through numpy (torch's *_object collectives do, and numpy is
optional): candidate steps travel as an int64 tensor, RNG states as serialised bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import ddpkit
import torch
import torch.distributed as dist
from ddptrain_dist import DistEnv
from ddptrain_state import TrainState, get_rng_state

WRITER_NICE = 10  # added to the writer's nice once its snapshot is taken (see below)


def make_checkpointer(
    args: argparse.Namespace, env: DistEnv, slow_save: float = 0.0
) -> CheckpointManager | NoCheckpoint:
    """The manager for --checkpoint-dir (--checkpoint-every, --keep), or a no-op one."""
    if args.checkpoint_dir is None:
        return NoCheckpoint()
    store = CheckpointDir(args.checkpoint_dir, args.keep, slow_save)
    return CheckpointManager(store, args.checkpoint_every, env)


class NoCheckpoint:
    """Checkpointing off: every call is a no-op, so the training loop has no `if ckpt`."""

    def resume(self, state: TrainState, seed: int) -> str | None:
        return None

    def due(self, step: int) -> bool:
        return False

    def save(self, state: TrainState) -> None:
        pass

    def wait_snapshot(self) -> None:
        pass

    def finish(self, state: TrainState, stopped: bool) -> None:
        pass

    def path(self, step: int) -> str | None:
        return None


class CheckpointManager:
    """The checkpoint protocol between ranks: resume, save (async) and finish.

    Rank 0 snapshots and writes; every other rank hands its RNG state to rank 0's writer in
    a background thread. Both run on ``group``, a gloo process group used only for
    checkpoints, so they never interleave with DDP's collectives on the default group.
    """

    def __init__(self, store: CheckpointDir, every: int, env: DistEnv) -> None:
        self.store, self.every, self.env = store, every, env
        self._group = dist.new_group(backend="gloo")
        self._thread: threading.Thread | None = None
        self._snapshot_done: threading.Event | None = None
        self._error: BaseException | None = None
        self._last_saved = -1
        self._stall_s, self._saves = 0.0, 0

    # ---- resume ------------------------------------------------------------------------
    def resume(self, state: TrainState, seed: int) -> str | None:
        """Load the newest checkpoint every rank can verify; its payload path, or None."""
        device = self.env.device  # nccl: collectives and tensors on the GPU

        def load(data: bytes) -> Any:
            return torch.load(io.BytesIO(data), map_location=device, weights_only=True)

        found = ddpkit.latest_verified(self.store, load, device)
        if found is None:
            return None
        step, payload = found
        state.load(payload, self.store.payload_path(step), self.env.rank, seed)
        self._last_saved = state.step
        return self.store.payload_path(step)

    # ---- save --------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def save(self, state: TrainState) -> None:
        """Checkpoint the state after this step; training goes on while it is written."""
        self._stall_s += self._save(state)
        self._saves += 1

    def _save(self, state: TrainState) -> float:
        t0 = time.perf_counter()
        self._wait()  # one write in flight at a time bounds memory to one extra copy
        rng = get_rng_state()  # this step boundary's state
        if self.env.is_main:
            now, deferred = state.save_parts()
            meta = {
                "step": state.step,
                "world_size": self.env.world_size,
                "host": self.env.host,
                "rank": self.env.rank,
                "restart_count": self.env.restart_count,
                "time": time.time(),
                "run": ddpkit.run_record(),  # what ran: image, spec, versions, seed
            }
            self._snapshot_done = threading.Event()
            # `now` changes in the next forward: copied here, before returning.
            self._start(self._write, _copy_to_cpu(now), deferred, meta, rng)
        else:
            self._start(_gather_to_rank0, rng, self._group, self.env.world_size)
        self._last_saved = state.step
        return time.perf_counter() - t0

    def wait_snapshot(self) -> None:
        """Before optimizer.step(): block until the writer has copied what it changes."""
        if self._snapshot_done is not None:
            t0 = time.perf_counter()
            self._snapshot_done.wait()
            self._snapshot_done = None
            self._stall_s += time.perf_counter() - t0

    def finish(self, state: TrainState, stopped: bool) -> None:
        """Save the final state (the SIGTERM stop already did), wait until it is durable."""
        if not stopped and self._last_saved != state.step:
            self._save(state)  # the final state is resumable too
        self._wait()  # rank 0: durable; others: RNG handed over, before anyone exits
        if self._saves and self.env.is_main:
            mean_ms = 1000 * self._stall_s / self._saves
            print(
                f"ddptrain: {self._saves} checkpoint(s), mean training stall {mean_ms:.2f} ms",
                file=sys.stderr,
                flush=True,
            )

    def path(self, step: int) -> str | None:
        return self.store.payload_path(step)

    # ---- the background thread ---------------------------------------------------------
    def _start(self, fn: Callable[..., Any], *args: Any) -> None:
        self._thread = threading.Thread(target=self._guard, args=(fn, *args), daemon=True)
        self._thread.start()

    def _guard(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:  # surfaced to the main thread by _wait()
            self._error = e
        finally:
            if self._snapshot_done is not None:
                self._snapshot_done.set()  # never leave the training loop waiting

    def _write(
        self, now: dict[str, Any], deferred: dict[str, dict[str, Any]], meta: dict, rng: Any
    ) -> None:
        """Rank 0's writer: finish the snapshot, collect every rank's RNG, write."""
        done = self._snapshot_done
        # Tensor copies release the GIL, so this overlaps the next forward/backward.
        for key, part in deferred.items():
            now[key] = {**(now.get(key) or {}), **_copy_to_cpu(part)}
        if done is not None:
            done.set()
        _yield_cpu_to_training()
        now["rng"] = _gather_to_rank0(rng, self._group, self.env.world_size)
        self.store.write(now, meta)

    def _wait(self) -> None:
        """Block until the background work (if any) is done; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._snapshot_done = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"checkpoint write failed: {err}") from err


def _yield_cpu_to_training() -> None:
    """Lower this thread's CPU priority (Linux: nice is per thread) for the rest of the
    write: serialising, hashing and fsync are background work that should not slow the
    training threads on a busy host. Each checkpoint gets a new thread at normal priority,
    so the snapshot copy, which training waits for, is not slowed down."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        nice = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, nice + WRITER_NICE))


def _copy_to_cpu(obj: Any) -> Any:
    """Deep copy of a (nested) state with every tensor copied to CPU.

    The copy is what lets training continue while the writer thread serialises: the live
    tensors are updated in place by the next optimizer step.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _copy_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copy_to_cpu(v) for v in obj)
    return obj


def _gather_to_rank0(obj: Any, group: Any, world_size: int) -> list[Any] | None:
    """gather_object without numpy: every rank's ``obj`` (torch.save-able) on rank 0."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    mine = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64), group=group)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: mine.numel()] = mine
    is_dst = dist.get_rank() == 0
    parts = [torch.empty_like(padded) for _ in range(world_size)] if is_dst else None
    dist.gather(padded, parts, dst=0, group=group)
    if parts is None:
        return None
    raw = [ctypes.string_at(p.data_ptr(), int(n)) for p, n in zip(parts, sizes, strict=True)]
    return [torch.load(io.BytesIO(b), weights_only=True) for b in raw]


class CheckpointDir(ddpkit.CheckpointStore):
    """The checkpoint folder: ddpkit's store (names, atomic writes with a sha256 sidecar,
    retention, verified reads), so the trainer and a user's script write one format.
    ``slow_save`` is the --debug-slow-save hook: the writer pauses mid-write."""

    def __init__(self, directory: str, keep: int, slow_save: float = 0.0) -> None:
        super().__init__(directory, keep, pause_mid_write=slow_save)
