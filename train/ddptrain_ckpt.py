"""Checkpoint manager for ddptrain.py: snapshot, async atomic write, verify, retain, load.

Layout in the checkpoint directory, per checkpoint at optimizer step N:
  ckpt-step-000000N.pt    torch.save payload
  ckpt-step-000000N.json  sidecar: step, world size, host, rank, restart count, time, sha256
The sidecar is written (atomically) only after the payload is durable, so it is the commit
point: a payload without a sidecar, or whose sha256 does not match, is never loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_NAME = re.compile(r"^ckpt-step-(\d+)\.json$")


def _to_cpu_copy(obj: Any) -> Any:
    """Deep copy of a (nested) state with every tensor copied to CPU.

    The copy is what lets training continue while the writer thread serialises: the live
    tensors are updated in place by the next optimizer step.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu_copy(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu_copy(v) for v in obj)
    return obj


def _fsync_dir(path: str) -> None:
    # The rename is durable only once the directory entry itself is synced.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write_bytes(path: str, data: bytes | memoryview, pause_mid_write: float = 0.0) -> None:
    """Temp file, fsync, rename, fsync the directory: the file is whole or absent."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            if pause_mid_write:
                # Test hook: widen the window in which a kill lands mid-write.
                half = len(data) // 2
                f.write(data[:half])
                f.flush()
                time.sleep(pause_mid_write)
                data = data[half:]
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(d)


class CheckpointManager:
    """Owns save (snapshot + background write), retention and load for one directory."""

    def __init__(
        self,
        directory: str,
        keep: int,
        log: Callable[[dict[str, Any]], None],
        debug_slow_save: float = 0.0,
    ) -> None:
        self.dir = directory
        self.keep = keep
        self.log = log
        self.debug_slow_save = debug_slow_save
        self._thread: threading.Thread | None = None
        self._snapshot_done: threading.Event | None = None
        self._error: BaseException | None = None

    # ---- paths -------------------------------------------------------------------------
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
            orphan = n.startswith("ckpt-step-") and n.endswith(".pt") and (
                n[: -len(".pt")] + ".json" not in names
            )
            if n.startswith(".tmp-") or orphan:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, n))

    # ---- save --------------------------------------------------------------------------
    def send_rng_async(self, rng: Any, group: Any) -> None:
        """Ranks != 0: hand this rank's RNG state to rank 0's writer, off the training path.

        The gather runs on ``group``, a process group used only for checkpoints, so it can
        run in a thread without interleaving with DDP's collectives on the default group.
        """
        self.wait()
        self._thread = threading.Thread(
            target=self._guard, args=(dist.gather_object, rng, None, 0, group), daemon=True
        )
        self._thread.start()

    def _guard(self, fn: Callable[..., Any], *a: Any) -> None:
        try:
            fn(*a)
        except BaseException as e:  # surfaced to the main thread by wait()
            self._error = e

    def save_async(
        self,
        now: dict[str, Any],
        deferred: dict[str, dict[str, Any]],
        meta: dict[str, Any],
        rng: Any = None,
        group: Any = None,
        world_size: int = 1,
    ) -> float:
        """Checkpoint without stopping training for the write.

        ``now`` (state the next forward may change in place: BN buffers, RNG, counters) is
        copied to CPU before returning. ``deferred`` (parameters and optimizer state, which
        only the next optimizer step changes) is copied by the writer thread while the next
        forward/backward runs; the caller must call wait_snapshot() before that optimizer
        step. Each ``deferred[k]`` dict is merged into ``now[k]`` (keeping ``now[k]``'s key
        order when it lists every key, as the trainer arranges for the model).
        With ``group``, the writer also gathers every rank's RNG state (``rng`` is this
        rank's) into ``now["rng"]`` (see send_rng_async). Returns the seconds blocked.
        """
        t0 = time.perf_counter()
        self.wait()  # one write in flight at a time bounds memory to one extra copy
        snapshot = _to_cpu_copy(now)
        self._snapshot_done = threading.Event()
        self._thread = threading.Thread(
            target=self._write_guarded,
            args=(snapshot, deferred, dict(meta), rng, group, world_size),
            daemon=True,
        )
        self._thread.start()
        return time.perf_counter() - t0

    def wait_snapshot(self) -> float:
        """Block until the deferred part is copied; returns the seconds blocked."""
        if self._snapshot_done is None:
            return 0.0
        t0 = time.perf_counter()
        self._snapshot_done.wait()
        self._snapshot_done = None
        return time.perf_counter() - t0

    def wait(self) -> None:
        """Block until the in-flight write (if any) is durable; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._snapshot_done = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"checkpoint write failed: {err}") from err

    def _write_guarded(
        self,
        snapshot: dict[str, Any],
        deferred: dict[str, dict[str, Any]],
        meta: dict[str, Any],
        rng: Any,
        group: Any,
        world_size: int,
    ) -> None:
        done = self._snapshot_done
        try:
            try:
                # Tensor copies release the GIL, so this overlaps the next forward/backward.
                for key, part in deferred.items():
                    copied = _to_cpu_copy(part)
                    merged = dict(snapshot.get(key) or {})
                    for k, v in copied.items():
                        merged[k] = v
                    snapshot[key] = merged
            finally:
                if done is not None:
                    done.set()
            if group is not None:
                rngs: list[Any] = [None] * world_size
                dist.gather_object(rng, rngs, dst=0, group=group)
                snapshot["rng"] = rngs
            self.write(snapshot, meta)
        except BaseException as e:  # surfaced to the main thread by wait()
            self._error = e

    def write(self, snapshot: dict[str, Any], meta: dict[str, Any]) -> str:
        """Synchronously and atomically write one checkpoint, then apply retention."""
        os.makedirs(self.dir, exist_ok=True)
        step = int(meta["step"])
        final = self.payload_path(step)
        # Serialise to memory first so the sha256 is computed without re-reading the file.
        buf = io.BytesIO()
        torch.save(snapshot, buf)
        data = buf.getbuffer()
        digest = hashlib.sha256(data).hexdigest()
        _atomic_write_bytes(final, data, self.debug_slow_save)
        sidecar = dict(meta, sha256=digest, file=os.path.basename(final))
        _atomic_write_bytes(self.sidecar_path(step), json.dumps(sidecar).encode())
        self._apply_retention()
        self.log({"event": "checkpoint", "step": step, "path": final,
                  "host": meta.get("host"), "rank": meta.get("rank")})
        return final

    def _apply_retention(self) -> None:
        for step in self.list_steps()[self.keep :]:
            # Sidecar first: once it is gone the payload is no longer a candidate.
            for p in (self.sidecar_path(step), self.payload_path(step)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)

    # ---- load --------------------------------------------------------------------------
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
            print(
                f"ddptrain: checkpoint {self.payload_path(step)} fails its sha256 check; "
                "skipping it",
                file=sys.stderr,
            )
            return None
        return data


def load_payload(data: bytes, device: torch.device) -> dict[str, Any]:
    # weights_only: the payload holds tensors, numbers, strings, lists and dicts only.
    return torch.load(io.BytesIO(data), map_location=device, weights_only=True)
