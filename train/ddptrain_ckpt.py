"""Checkpoints for ddptrain.py: snapshot, async atomic write, verify, retain, resume.

Layout in the checkpoint directory, per checkpoint at optimizer step N:
  ckpt-step-000000N.pt    torch.save payload (its contents: see ddptrain_state.py)
  ckpt-step-000000N.json  sidecar: step, world size, host, rank, restart count, time, sha256
The sidecar is written (atomically) only after the payload is durable, so it is the commit
point: a payload without a sidecar, or whose sha256 does not match, is never loaded.

No collective here goes through numpy (torch's *_object collectives do, and numpy is
optional): candidate steps travel as an int64 tensor, RNG states as serialised bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import io
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from ddptrain_args import warn
from ddptrain_dist import DistEnv
from ddptrain_state import TrainState, get_rng_state

_NAME = re.compile(r"^ckpt-step-(\d+)\.json$")
WRITER_NICE = 10  # added to the writer's nice once its snapshot is taken (see below)
Log = Callable[[dict[str, Any]], None]


def make_checkpointer(
    args: argparse.Namespace, env: DistEnv, log: Log, slow_save: float = 0.0
) -> CheckpointManager | NoCheckpoint:
    """The manager for --checkpoint-dir (--checkpoint-every, --keep), or a no-op one."""
    if args.checkpoint_dir is None:
        return NoCheckpoint()
    store = CheckpointDir(args.checkpoint_dir, args.keep, log, slow_save)
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
        if self.env.is_main:
            self.store.remove_stale_temp_files()
        for step in self._candidates():
            data = self.store.read_verified(step)
            if not self._on_every_rank(data is not None):
                if self.env.is_main:
                    warn(f"skipping checkpoint step {step}: not verified on every rank")
                continue
            assert data is not None
            payload = torch.load(io.BytesIO(data), map_location=self.env.device, weights_only=True)
            state.load(payload, self.store.payload_path(step), self.env.rank, seed)
            self._last_saved = state.step
            return self.store.payload_path(step)
        return None

    def _candidates(self) -> list[int]:
        """Rank 0's list of committed steps, newest first, on every rank."""
        steps = self.store.list_steps() if self.env.is_main else []
        n = torch.tensor([len(steps)], dtype=torch.int64, device=self.env.device)
        dist.broadcast(n, src=0)
        if int(n) == 0:
            return []
        buf = torch.tensor(steps, dtype=torch.int64, device=self.env.device)
        if not self.env.is_main:
            buf = torch.empty(int(n), dtype=torch.int64, device=self.env.device)
        dist.broadcast(buf, src=0)
        return [int(s) for s in buf.tolist()]

    def _on_every_rank(self, ok: bool) -> bool:
        flag = torch.tensor([int(ok)], device=self.env.device)  # nccl: on the GPU
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

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


class CheckpointDir:
    """One checkpoint directory: names, atomic writes with a sha256 sidecar, retention."""

    def __init__(self, directory: str, keep: int, log: Log, slow_save: float = 0.0) -> None:
        self.dir, self.keep, self.log = directory, keep, log
        self.slow_save = slow_save  # test hook: the writer pauses mid-write

    def payload_path(self, step: int) -> str:
        return os.path.join(self.dir, f"ckpt-step-{step:09d}.pt")

    def sidecar_path(self, step: int) -> str:
        return os.path.join(self.dir, f"ckpt-step-{step:09d}.json")

    def list_steps(self) -> list[int]:
        """Committed checkpoints (sidecar present), newest first."""
        if not os.path.isdir(self.dir):
            return []
        steps = [int(m.group(1)) for n in os.listdir(self.dir) if (m := _NAME.match(n))]
        return sorted(steps, reverse=True)

    def remove_stale_temp_files(self) -> None:
        """Delete what a killed writer left behind (rank 0, before the first save): temp
        files, and payloads whose sidecar (the commit point) was never written."""
        if not os.path.isdir(self.dir):
            return
        names = set(os.listdir(self.dir))
        for n in names:
            payload = n.startswith("ckpt-step-") and n.endswith(".pt")
            orphan = payload and n[: -len(".pt")] + ".json" not in names
            if n.startswith(".tmp-") or orphan:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, n))

    def write(self, snapshot: dict[str, Any], meta: dict[str, Any]) -> str:
        """Synchronously and atomically write one checkpoint, then apply retention."""
        os.makedirs(self.dir, exist_ok=True)
        step = int(meta["step"])
        final = self.payload_path(step)
        with _without_zip_crc32():
            digest = _atomic_write(final, lambda f: torch.save(snapshot, f), self.slow_save)
        sidecar = dict(meta, sha256=digest, file=os.path.basename(final))
        _atomic_write(self.sidecar_path(step), lambda f: f.write(json.dumps(sidecar).encode()))
        self._apply_retention()
        event = {"event": "checkpoint", "step": step, "path": final}
        self.log({**event, "host": meta.get("host"), "rank": meta.get("rank")})
        return final

    def _apply_retention(self) -> None:
        for step in self.list_steps()[self.keep :]:
            # Sidecar first: once it is gone the payload is no longer a candidate.
            for p in (self.sidecar_path(step), self.payload_path(step)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)

    def read_verified(self, step: int) -> bytes | None:
        """The payload bytes of checkpoint ``step`` if its sha256 matches its sidecar."""
        try:
            with open(self.sidecar_path(step), "rb") as f:
                sidecar = json.loads(f.read())
            with open(self.payload_path(step), "rb") as f:
                data = f.read()
        except (OSError, ValueError) as e:
            print(f"ddptrain: checkpoint step {step} unreadable: {e}", file=sys.stderr)
            return None
        if hashlib.sha256(data).hexdigest() != sidecar.get("sha256"):
            path = self.payload_path(step)
            print(
                f"ddptrain: checkpoint {path} fails its sha256 check; skipping it", file=sys.stderr
            )
            return None
        return data


@contextlib.contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """torch.save computes a crc32 per zip record, as much CPU again as the sha256 that
    already guards the payload; torch.load does not need it. The option is process-wide:
    another torch.save in this process during a write skips it too, harmlessly."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


class _HashingFile:
    """A write-only file that hashes what passes through, so nothing is read back."""

    def __init__(self, f: Any, pause_after_first_write: float = 0.0) -> None:
        self.f, self.sha256, self.pause = f, hashlib.sha256(), pause_after_first_write

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        n = self.f.write(data)
        if self.pause:  # test hook: widen the window in which a kill lands mid-write
            self.f.flush()
            time.sleep(self.pause)
            self.pause = 0.0
        return n

    def flush(self) -> None:
        self.f.flush()


def _atomic_write(path: str, fill: Callable[[Any], Any], pause_mid_write: float = 0.0) -> str:
    """Temp file, fsync, rename, fsync the directory: the file is whole or absent.

    ``fill`` writes the content to the file object it is given. Returns its sha256.
    """
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            out = _HashingFile(f, pause_mid_write)
            fill(out)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(d)
    return out.sha256.hexdigest()


def _fsync_dir(path: str) -> None:
    # The rename is durable only once the directory entry itself is synced.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
