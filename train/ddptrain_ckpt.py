"""Checkpoints for ddptrain.py: what one holds (``TrainState``), every rank's RNG, and the
manager that snapshots, writes in the background and resumes.

The folder is ddpkit's store (the module a user's script imports): per checkpoint at
optimizer step N, ``ckpt-step-{N:09d}.pt`` (the payload; a step saved again while that
name is committed gets ``ckpt-step-{N:09d}.<16 hex>.pt``) and ``ckpt-step-{N:09d}.json``
(its sidecar: step, world size, host, rank, restart count, time, run, run_id, sha256, and
``file``, the payload's name), the sidecar's rename the one commit, with retention and verified
reads; ddpkit also decides which checkpoint every rank resumes from. This file adds the
trainer's asynchronous snapshot and every rank's RNG state on top.

A payload (torch.save, loaded with weights_only=True) is a dict:
  model        ddp.module.state_dict()
  optimizer    optimizer.state_dict()
  scheduler    the LR scheduler's state_dict()
  step         optimizer steps done
  epoch, pos   where the next step starts: the epoch, and optimizer steps already done in it
  world_size, batch_size, grad_accum   the layout that `pos` counts in
  rng          one entry per rank: that rank's RNG states (python, torch, numpy if present,
               cuda if present), gathered to rank 0 by the checkpoint manager

No collective here goes through numpy (torch's *_object collectives do, and numpy is
optional): RNG states travel as serialised bytes in uint8 tensors (``pack``: not torch.save,
which smoke would count as a save on every rank).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import random
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import ddpkit
import torch
import torch.distributed as dist
from ddptrain_args import Args, bad_args
from ddptrain_dist import DistEnv
from torch import nn

WRITER_NICE = 10  # added to the writer's nice once its snapshot is taken (see below)


def _numpy() -> types.ModuleType | None:
    """numpy when installed (seeded and checkpointed then); torch does not need it."""
    try:
        return importlib.import_module("numpy")
    except ImportError:
        return None


np = _numpy()


# ---- the training state: what a checkpoint holds ---------------------------------------
@dataclass(frozen=True)
class Layout:
    """What one epoch's steps depend on; a mid-epoch checkpoint resumes only in the same."""

    world_size: int
    batch_size: int
    grad_accum: int


class TrainState:
    """Step, epoch and position in it, RNG, and the model/optimizer/scheduler they go with."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        layout: Layout,
        steps_per_epoch: int,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.layout = layout
        self.steps_per_epoch = steps_per_epoch
        self.step, self.epoch, self.pos = 0, 0, 0
        self._buffer_names = {n for n, _ in model.named_buffers()}

    def advance(self) -> None:
        """One optimizer step done; roll over to the next epoch at its end."""
        self.step += 1
        self.pos += 1
        if self.pos == self.steps_per_epoch:
            self.epoch, self.pos = self.epoch + 1, 0

    def save_parts(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The payload minus "rng", split by when each part changes next.

        ``now``: what the next forward changes in place (BatchNorm buffers) and small
        values; the caller copies it at once. ``deferred``: parameters and optimizer state,
        which change only in the next optimizer.step(), so they can be copied while the
        next forward/backward runs. ``now["model"]`` lists every key (None where the value
        is deferred) to keep the state_dict's key order.
        """
        model_sd = self.model.state_dict()
        buffers = self._buffer_names
        now = {
            "model": {k: (v if k in buffers else None) for k, v in model_sd.items()},
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "pos": self.pos,
            "world_size": self.layout.world_size,
            "batch_size": self.layout.batch_size,
            "grad_accum": self.layout.grad_accum,
        }
        deferred = {
            "model": {k: v for k, v in model_sd.items() if k not in buffers},
            "optimizer": self.optimizer.state_dict(),
        }
        return now, deferred

    def load(self, payload: dict[str, Any], where: str, rank: int, seed: int) -> None:
        """Restore from a payload; exits 2 if it was written mid-epoch in another layout."""
        saved = Layout(payload["world_size"], payload["batch_size"], payload["grad_accum"])
        if saved != self.layout and payload["pos"] != 0:
            now = self.layout
            bad_args(
                f"checkpoint {where} was written mid-epoch with world size {saved.world_size}, "
                f"batch size {saved.batch_size}, grad accum {saved.grad_accum}; resume it with "
                f"the same values (now {now.world_size}, {now.batch_size}, {now.grad_accum})"
            )
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        self.step, self.epoch, self.pos = payload["step"], payload["epoch"], payload["pos"]
        if saved.world_size == self.layout.world_size:
            set_rng_state(payload["rng"][rank])
        else:  # new layout at an epoch boundary: fresh, still per-rank, RNG streams
            seed_everything(seed + rank + 1_000_003 * self.step)


def seed_everything(seed: int) -> None:
    """Seed python, numpy (if present) and torch. The trainer seeds rank r with seed + r:
    per-rank randomness (dropout, augmentation) should differ, and the model still starts
    identical everywhere because DDP broadcasts rank 0's weights when it wraps the model."""
    random.seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def get_rng_state() -> dict[str, Any]:
    """This rank's RNG states in a form torch.load(weights_only=True) accepts."""
    st: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        st["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss]
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    py = st["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    torch.set_rng_state(st["torch"].cpu())
    if np is not None and "numpy" in st:
        kind, keys, pos, has_gauss, gauss = st["numpy"]
        np.random.set_state((kind, keys.cpu().numpy().astype("uint32"), pos, has_gauss, gauss))
    if torch.cuda.is_available() and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"].cpu())


# ---- the checkpoint manager ------------------------------------------------------------
def make_checkpointer(args: Args, env: DistEnv) -> CheckpointManager | NoCheckpoint:
    """The manager for --checkpoint-dir (--checkpoint-every, --keep), or a no-op one.
    --debug-slow-save pauses the writer mid-write (ddpkit's test hook)."""
    if args.checkpoint_dir is None:
        return NoCheckpoint()
    store = ddpkit.CheckpointStore(args.checkpoint_dir, args.keep, args.debug_slow_save)
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

    def __init__(self, store: ddpkit.CheckpointStore, every: int, env: DistEnv) -> None:
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

        def load(f: BinaryIO) -> Any:
            return torch.load(f, map_location=device, weights_only=True)

        found = ddpkit.latest_verified(self.store, load, device)
        if found is None:
            return None
        step, payload = found
        path = self.store.committed_payload(step)
        state.load(payload, path, self.env.rank, seed)
        self._last_saved = state.step
        return path

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
            copied = _copy_to_cpu(now)
            self._start(lambda: self._write(copied, deferred, meta, rng))
        else:
            self._start(lambda: _gather_to_rank0(rng, self._group, self.env.world_size))
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
        return self.store.committed_payload(step)

    # ---- the background thread ---------------------------------------------------------
    def _start(self, work: Callable[[], object]) -> None:
        self._thread = threading.Thread(target=self._guard, args=(work,), daemon=True)
        self._thread.start()

    def _guard(self, work: Callable[[], object]) -> None:
        try:
            work()
        except BaseException as e:  # surfaced to the main thread by _wait()
            self._error = e
        finally:
            if self._snapshot_done is not None:
                self._snapshot_done.set()  # never leave the training loop waiting

    def _write(
        self,
        now: dict[str, Any],
        deferred: dict[str, dict[str, Any]],
        meta: dict[str, Any],
        rng: dict[str, Any],
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


def _gather_to_rank0(
    obj: dict[str, Any], group: dist.ProcessGroup, world_size: int
) -> list[dict[str, Any]] | None:
    """gather_object without numpy: every rank's ``obj`` (see ``pack``) on rank 0."""
    mine = torch.frombuffer(bytearray(pack(obj)), dtype=torch.uint8)
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
    return [unpack(b) for b in raw]


# ---- RNG states as bytes, without torch.save -------------------------------------------
# torch.save (and pickle, whose tensors torch.save their storage) logs the "torch.save" API
# usage, which smoke reads as "this rank saved": every rank serialising its RNG state for
# the gather made smoke warn that ranks on several nodes save to the shared volume. So the
# states travel as a JSON tree, each tensor replaced by its dtype, shape and place in the
# raw bytes that follow. JSON also makes the bytes from other ranks plain data to rank 0.
_HEADER = 8  # the tree's length, little-endian


def pack(obj: Any) -> bytes:
    """``obj`` (dicts with string keys, lists, tuples, tensors, str, int, float, bool,
    None) as bytes that ``unpack`` turns back into an equal object of the same types."""
    blobs: list[bytes] = []
    offset = [0]

    def tree(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            raw = ctypes.string_at(t.data_ptr(), t.nbytes) if t.nbytes else b""
            blobs.append(raw)
            offset[0] += len(raw)
            return {"tensor": [str(t.dtype).removeprefix("torch."), list(t.shape),
                               offset[0] - len(raw), len(raw)]}  # fmt: skip
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise TypeError(f"pack: dict keys must be str, got {list(x)!r}")
            return {"dict": {k: tree(v) for k, v in x.items()}}
        if isinstance(x, tuple):
            return {"tuple": [tree(v) for v in x]}
        if isinstance(x, list):
            return [tree(v) for v in x]
        if x is None or isinstance(x, str | int | float):  # bool is an int
            return x
        raise TypeError(f"pack: cannot pack a {type(x).__name__}")

    head = json.dumps(tree(obj)).encode()
    return len(head).to_bytes(_HEADER, "little") + head + b"".join(blobs)


def unpack(data: bytes) -> Any:
    """What ``pack`` packed; ValueError for anything else."""
    n = int.from_bytes(data[:_HEADER], "little")
    body = data[_HEADER + n :]

    def value(x: Any) -> Any:
        if isinstance(x, list):
            return [value(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "dict" in x:
            return {k: value(v) for k, v in x["dict"].items()}
        if "tuple" in x:
            return tuple(value(v) for v in x["tuple"])
        name, shape, start, size = x["tensor"]
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype) or start + size > len(body):
            raise ValueError(f"unpack: not a packed tensor: {x!r}"[:200])
        if not size:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(bytearray(body[start : start + size]), dtype=dtype)
        return flat.reshape(shape)

    return value(json.loads(data[_HEADER : _HEADER + n]))
