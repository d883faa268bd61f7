"""ddpkit: checkpoints, restarts and progress lines for your own torchrun script.

One file, torch and the standard library only. ddpdeploy puts its folder on PYTHONPATH in
every target (the image, `smoke --local`), so a script just imports it::

    import ddpkit

    ddpkit.init_process_group("gloo")          # restart-safe under torchrun (see below)
    state = ddpkit.load_latest(map_location="cpu")   # None on a fresh start
    start = 0 if state is None else state["step"]
    if state is not None:
        model.load_state_dict(state["model"])
    for step in range(start + 1, steps + 1):
        ...
        ddpkit.log("step", step=step, loss=float(loss))
        if step % 100 == 0:                           # every rank calls it
            ddpkit.save({"model": model.state_dict(), "step": step}, step)
    ddpkit.log("done", step=steps)

Checkpoints go to ``checkpoint_dir()``: ``$DDPDEPLOY_CHECKPOINT_DIR``, which ddpdeploy
sets in every process whenever the job has a checkpoint volume. Per checkpoint at step N:

  ckpt-step-00000000N.pt    torch.save(state)
  ckpt-step-00000000N.json  sidecar: step, world_size, host, rank, restart_count, time,
                            sha256 and file name of the .pt

The sidecar is written only once the payload is durable, so it is the commit point: a
payload without a sidecar, or whose sha256 differs from it, is never loaded. This is the
format ddpdeploy's built-in trainer writes (its checkpoint store is this module) and the
one ``ddpdeploy collect`` fetches.

Restarts: torchrun's agent shares one TCPStore with its workers, and that store outlives
a worker restart, so a plain ``init_process_group`` after a restart can read the previous
round's peer addresses and hang. ``init_process_group`` here namespaces the store per
restart; see train/README.md for which restart paths need it.

Protocol lines: ``log(event, **fields)`` prints one JSON object on stdout from global
rank 0 only. ddpdeploy reads the events ``start``, ``step`` (``step``, ``loss``,
``samples_per_s``), ``checkpoint`` (``step``, ``path``, ``host``, ``rank``; ``save`` prints
it) and ``done`` (``step``, ``weights_sha256``: see ``weights_sha256()``); all are optional.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

CHECKPOINT_DIR_ENV = "DDPDEPLOY_CHECKPOINT_DIR"
DEFAULT_KEEP = 3
_SIDECAR = re.compile(r"^ckpt-step-(\d+)\.json$")
_print_lock = threading.Lock()  # a background checkpoint writer logs too


# ---- who am I ----------------------------------------------------------------------------
def rank() -> int:
    """Global rank: the process group's once initialised, else torchrun's RANK (or 0)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# ---- protocol lines ----------------------------------------------------------------------
def log(event: str, **fields: Any) -> None:
    """One JSON protocol line on stdout, from global rank 0 only (others: nothing)."""
    if rank() == 0:
        emit({"event": event, **fields})


def emit(line: dict[str, Any]) -> None:
    """Print ``line`` as one JSON line, whole even when threads print at once."""
    with _print_lock:
        print(json.dumps(line), flush=True)


def weights_sha256(module: torch.nn.Module) -> str:
    """The ``done`` line's ``weights_sha256``: sha256 over, for each state_dict entry in key
    order, the key (UTF-8) then the tensor's raw bytes (CPU, contiguous). Pass the bare
    model (``ddp.module``), so the keys carry no ``module.`` prefix."""
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        h.update(k.encode())
        t = v.detach().cpu().contiguous().clone()  # clone: storage is exactly the tensor
        if t.nbytes:  # ctypes reads the raw bytes at C speed without needing numpy
            h.update(ctypes.string_at(t.data_ptr(), t.nbytes))
    return h.hexdigest()


def warn(message: str) -> None:
    print(f"ddpkit: warning: {message}", file=sys.stderr, flush=True)


# ---- the process group -------------------------------------------------------------------
def init_process_group(backend: str | None = None, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` that survives torchrun worker restarts.

    ``backend`` None: nccl when CUDA is available, else gloo (nccl also selects the GPU
    ``LOCAL_RANK``). Without torchrun's env (plain ``python train.py``) it makes a world of
    one. Under torchrun with the agent's shared store (``TORCHELASTIC_USE_AGENT_STORE=True``:
    static rendezvous always, c10d unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) the store
    outlives a restart; the group is then built on a prefix of it named by the restart
    count, so a restarted round never reads the previous round's keys. Other keyword
    arguments (``timeout``, ...) go to torch; an explicit ``store`` or ``init_method`` is
    passed through unchanged.
    """
    e = os.environ
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and "LOCAL_RANK" in e:
        torch.cuda.set_device(int(e["LOCAL_RANK"]))  # before the group binds a device
    if "store" in kwargs or "init_method" in kwargs:
        dist.init_process_group(backend, **kwargs)
        return
    timeout = kwargs.setdefault("timeout", timedelta(minutes=30))
    if "MASTER_ADDR" not in e:  # not under torchrun: a world of one
        kwargs.setdefault("rank", 0)
        kwargs.setdefault("world_size", 1)
        dist.init_process_group(backend, store=dist.HashStore(), **kwargs)
        return
    kwargs.setdefault("rank", int(e["RANK"]))
    kwargs.setdefault("world_size", int(e["WORLD_SIZE"]))
    if e.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # a fresh store per round already
        dist.init_process_group(backend, init_method="env://", **kwargs)
        return
    addr, port = e["MASTER_ADDR"], int(e["MASTER_PORT"])
    base = dist.TCPStore(addr, port, kwargs["world_size"], is_master=False, timeout=timeout)
    restart = int(e.get("TORCHELASTIC_RESTART_COUNT", 0))
    store = dist.PrefixStore(f"ddpkit/restart-{restart}/", base)
    dist.init_process_group(backend, store=store, **kwargs)
    _warn_if_counts_can_differ()


def _warn_if_counts_can_differ() -> None:
    # Under c10d with several agents the restart counts differ between nodes (only the
    # failed node's agent increments it), so the prefix cannot name the round there; the
    # launcher must unshare the store instead. Workers are not told the rdzv backend.
    e = os.environ
    several_nodes = int(e.get("GROUP_WORLD_SIZE", 1)) > 1
    restarts = int(e.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0
    if rank() == 0 and several_nodes and restarts:
        warn(
            "several nodes share the agent store: worker restarts under c10d rendezvous "
            "need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every torchrun agent's env"
        )


# ---- where checkpoints go ----------------------------------------------------------------
def checkpoint_dir(directory: str | os.PathLike[str] | None = None) -> str:
    """``directory`` if given, else ``$DDPDEPLOY_CHECKPOINT_DIR``; exits 2 with one line if
    neither is set (the job has no checkpoint volume)."""
    if directory is not None:
        return os.fspath(directory)
    found = os.environ.get(CHECKPOINT_DIR_ENV)
    if not found:
        print(
            f"ddpkit: error: {CHECKPOINT_DIR_ENV} is not set; give the job a checkpoint "
            "volume (checkpoint: in ddpdeploy.yaml) or pass directory= to ddpkit",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)
    return found


# ---- save and load -----------------------------------------------------------------------
def save(state: Any, step: int, *, keep: int = DEFAULT_KEEP, directory: str | None = None) -> str:
    """Checkpoint ``state`` (anything torch.save takes) as step ``step``; call on every rank.

    Global rank 0 writes it atomically with its sidecar and keeps the ``keep`` newest; the
    other ranks wait for it in a barrier, so on return the checkpoint is durable on every
    rank and the call is a step boundary. Returns the payload's path.
    """
    store = CheckpointStore(checkpoint_dir(directory), keep)
    path = store.payload_path(step)
    if rank() == 0:
        store.write(state, meta(step))
    if _distributed():
        dist.barrier()
    return path


def load_latest(
    map_location: Any = None, *, directory: str | None = None, weights_only: bool = True
) -> Any | None:
    """The newest checkpoint that verifies on every rank, loaded; None on a fresh start.

    Call on every rank (with a process group, all ranks agree on the step). A corrupt or
    half-written newest checkpoint is skipped with one line on stderr from rank 0, and the
    one before is tried.
    """
    store = CheckpointStore(checkpoint_dir(directory), DEFAULT_KEEP)
    found = latest_verified(store)
    if found is None:
        return None
    _, data = found
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)


def meta(step: int) -> dict[str, Any]:
    """The sidecar's fields besides sha256 and file name."""
    return {
        "step": int(step),
        "world_size": world_size(),
        "host": socket.gethostname(),
        "rank": rank(),
        "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
        "time": time.time(),
    }


def latest_verified(store: CheckpointStore, device: Any = None) -> tuple[int, bytes] | None:
    """(step, payload bytes) of the newest checkpoint every rank verifies, or None.

    Rank 0 lists the committed steps (after removing what a killed writer left) and
    broadcasts them; each rank checks the sha256 itself, because the folder is shared but
    a rank may see it through another node's mount. Collectives run on the default group,
    with tensors on ``device`` (default: the current GPU under nccl, else CPU).
    """
    is_main, many = rank() == 0, _distributed()
    if is_main:
        store.remove_stale_temp_files()
    device = device if device is not None else _collective_device()
    steps = store.list_steps() if is_main else []
    if many:
        steps = _broadcast_ints(steps, device)
    for step in steps:
        data, why = store.read_verified(step)
        ok = data is not None
        if many:
            flag = torch.tensor([int(ok)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            ok = bool(flag.item())
        if ok:
            assert data is not None
            return step, data
        if is_main:
            why = why or "not verified on every rank"
            path = store.payload_path(step)
            line = f"ddpkit: skipping checkpoint {path}: {why}; trying the one before"
            print(line, file=sys.stderr, flush=True)
    return None


def _collective_device() -> torch.device:
    if _distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast_ints(values: list[int], device: Any) -> list[int]:
    """Rank 0's list on every rank, as int64 tensors (torch's *_object collectives need
    numpy, which is optional)."""
    n = torch.tensor([len(values)], dtype=torch.int64, device=device)
    dist.broadcast(n, src=0)
    if int(n) == 0:
        return []
    buf = torch.tensor(values, dtype=torch.int64, device=device)
    if rank() != 0:
        buf = torch.empty(int(n), dtype=torch.int64, device=device)
    dist.broadcast(buf, src=0)
    return [int(s) for s in buf.tolist()]


# ---- the checkpoint folder ---------------------------------------------------------------
class CheckpointStore:
    """One checkpoint folder: names, atomic writes with a sha256 sidecar, retention, reads.

    No collectives: ``save``/``load_latest`` above add the agreement between ranks.
    ``pause_mid_write`` is a test hook: the writer sleeps after its first write.
    """

    def __init__(self, directory: str, keep: int, pause_mid_write: float = 0.0) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir, self.keep, self.pause_mid_write = directory, keep, pause_mid_write

    def payload_path(self, step: int) -> str:
        return os.path.join(self.dir, f"ckpt-step-{step:09d}.pt")

    def sidecar_path(self, step: int) -> str:
        return os.path.join(self.dir, f"ckpt-step-{step:09d}.json")

    def list_steps(self) -> list[int]:
        """Committed checkpoints (sidecar present), newest first."""
        if not os.path.isdir(self.dir):
            return []
        steps = [int(m.group(1)) for n in os.listdir(self.dir) if (m := _SIDECAR.match(n))]
        return sorted(steps, reverse=True)

    def remove_stale_temp_files(self) -> None:
        """Delete what a killed writer left behind: temp files, and payloads whose sidecar
        (the commit point) was never written. Rank 0, before the first save."""
        if not os.path.isdir(self.dir):
            return
        names = set(os.listdir(self.dir))
        for n in names:
            payload = n.startswith("ckpt-step-") and n.endswith(".pt")
            orphan = payload and n[: -len(".pt")] + ".json" not in names
            if n.startswith(".tmp-") or orphan:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, n))

    def write(self, state: Any, meta: dict[str, Any]) -> str:
        """Write one checkpoint atomically and durably, apply retention, print the
        ``checkpoint`` line. ``meta`` needs ``step``; it becomes the sidecar."""
        os.makedirs(self.dir, exist_ok=True)
        step = int(meta["step"])
        final = self.payload_path(step)
        with _without_zip_crc32():
            digest = _atomic_write(final, lambda f: torch.save(state, f), self.pause_mid_write)
        sidecar = dict(meta, sha256=digest, file=os.path.basename(final))
        _atomic_write(self.sidecar_path(step), lambda f: f.write(json.dumps(sidecar).encode()))
        self._apply_retention()
        fields = {"step": step, "path": final, "host": meta.get("host"), "rank": meta.get("rank")}
        emit({"event": "checkpoint", **fields})  # the writer is rank 0 by construction
        return final

    def _apply_retention(self) -> None:
        for step in self.list_steps()[self.keep :]:
            # Sidecar first: once it is gone the payload is no longer a candidate.
            for p in (self.sidecar_path(step), self.payload_path(step)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)

    def read_verified(self, step: int) -> tuple[bytes | None, str | None]:
        """(payload bytes, None) if checkpoint ``step`` matches its sidecar's sha256, else
        (None, why)."""
        try:
            with open(self.sidecar_path(step), "rb") as f:
                sidecar = json.loads(f.read())
            with open(self.payload_path(step), "rb") as f:
                data = f.read()
        except (OSError, ValueError) as e:
            return None, f"unreadable ({e})"
        if hashlib.sha256(data).hexdigest() != sidecar.get("sha256"):
            return None, "fails its sha256 check"
        return data, None


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
    """Temp file in the same folder, fsync, rename, fsync the folder: whole or absent.

    ``fill`` writes the content to the file object it is given. Returns its sha256.
    """
    d = os.path.dirname(path) or "."
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
