"""ddpkit: checkpoints, restarts and progress lines for your own torchrun script.

One file, torch and the standard library only. ddpdeploy puts its folder on PYTHONPATH in
every target (the image, `smoke --local`), so a script just imports it::

    import ddpkit

    ddpkit.init_process_group("gloo")          # restart-safe under torchrun (see below)
    state = ddpkit.load_latest(map_location="cpu")   # None on a fresh start
    start = 0 if state is None else state["step"]
    if state is not None:
        model.load_state_dict(state["model"])
    ddpkit.log("start", total_steps=steps)     # smoke's progress bar; restarts show here
    for step in range(start + 1, steps + 1):
        ...
        ddpkit.log("step", step=step, loss=float(loss))
        if step % 100 == 0:                           # every rank calls it
            ddpkit.save({"model": model.state_dict(), "step": step}, step)
    ddpkit.log("done", step=steps)

Checkpoints go to ``checkpoint_dir()``: ``$DDPDEPLOY_CHECKPOINT_DIR``, which ddpdeploy
sets in every process whenever the job has a checkpoint volume. Per checkpoint at step N,
named ``ckpt-step-{N:09d}`` (read back by ``^ckpt-step-(\\d{9,18})\\.json$``, as
``ddpdeploy collect`` reads them):

  ckpt-step-000000500.pt    torch.save(state)
  ckpt-step-000000500.json  sidecar: step, world_size, host, rank, restart_count, time,
                            run (run_record(): what ran), run_id, sha256 and file, the
                            payload's name

The sidecar is renamed into place only once the payload is durable, and that one rename
is the commit: a payload no sidecar names, or whose sha256 differs from it, is never
loaded. A step saved again while its ckpt-step-000000500.pt is committed gets a payload
of its own name (ckpt-step-000000500.<16 hex>.pt); the old pair stays whole until the
new sidecar replaces it, and then the old payload is deleted. This is the
format ddpdeploy's built-in trainer writes (its checkpoint store is this module) and the
one ``ddpdeploy collect`` fetches. Retention (``keep``) counts and deletes only this run's
own checkpoints (its ``run_id``, a payload that verifies); see ``CheckpointStore``.

Restarts: torchrun's agent shares one TCPStore with its workers, and that store outlives
a worker restart, so a plain ``init_process_group`` after a restart can read the previous
round's peer addresses and hang. ``init_process_group`` here namespaces the store per
restart; see train/README.md for which restart paths need it.

Protocol lines: ``log(event, **fields)`` prints one JSON object on stdout from global
rank 0 only. ddpdeploy reads the events ``start`` (``total_steps``), ``step`` (``step``,
``loss``, ``samples_per_s``), ``checkpoint`` (``step``, ``path``, ``host``, ``rank``;
``save`` prints it) and ``done`` (``step``, ``weights_sha256``: see ``weights_sha256()``);
all are optional. ``start`` is filled in with what ddpkit knows (world size, backend,
host, restart count, the checkpoint ``load_latest`` resumed from), and a script that logs
a step before any ``start`` gets one sent for it: a restart is what tells smoke that the
workers recovered.

Diagnostics (docs/events.md): ``init_process_group`` runs ``probe()``, a short all-reduce
sweep whose ``probe`` event gives the bus bandwidth, the slowest rank's host and the
transport; ``with timed("data"):`` / ``timed("forward")`` and ``step_done(step)`` feed the
``ranks`` event (stragglers) and arm the hang watchdog (``hang`` event, every rank's stacks,
exit 124); ``end_steps()`` after the last step. ``finish()`` ends the script: the group
destroyed, then an exit without torch's teardown, which can abort a finished gloo run.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import faulthandler
import fcntl
import glob
import hashlib
import json
import math
import operator
import os
import pickle
import platform
import re
import socket
import stat
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, BinaryIO, NoReturn, SupportsIndex, TypeVar, cast

import torch
import torch.distributed as dist

CHECKPOINT_DIR_ENV = "DDPDEPLOY_CHECKPOINT_DIR"
DEFAULT_KEEP = 3
# The one spelling of a checkpoint's name, as ddpdeploy's collect reads it too: the step
# zero-padded to 9 digits; at most 18, so a step always fits an int64 tensor.
_SIDECAR = re.compile(r"^ckpt-step-(\d{9,18})\.json\Z", re.ASCII)  # \Z: $ takes a final \n
# A payload: ckpt-step-{N:09d}.pt, or ckpt-step-{N:09d}.<16 hex>.pt for a step saved again
# while the first name was committed (the sidecar's `file` says which; CheckpointStore.write).
_PAYLOAD = re.compile(r"^ckpt-step-(\d{9,18})(?:\.[0-9a-f]{16})?\.pt\Z", re.ASCII)
MAX_STEP = 10**18 - 1
# What _write_temp's mkstemp names (8 characters of its alphabet): only those are ours to
# delete; a user's .tmp-notes.json in the folder is not.
_TEMP_NAME = re.compile(r"^\.tmp-[a-z0-9_]{8}\.(pt|json)\Z", re.ASCII)
MAX_SIDECAR = 1 << 20  # a sidecar is ~600 bytes; anything this big is not one
# A temp file untouched this long is a dead writer's. A live writer moves its file's mtime
# with every write(), and one still saving (a replaced pod in its SIGTERM grace, 30 s by
# default) is seconds old; ten minutes leaves room for a slow mount's long write or fsync
# and for clock skew between the nodes that share the folder.
STALE_TEMP_S = 600.0
# The folder's lock (flock) while a pair is committed and while retention checks what it
# deletes: the kernel drops it with its process, so a killed writer leaves none held.
LOCK_NAME = ".ddpkit.lock"
LOCK_WAIT_ENV = "DDPDEPLOY_CHECKPOINT_LOCK_S"  # seconds to wait for it (default 300)
# Retention renames a step's sidecar to this before it deletes the payloads, and deletes it
# last: a retention interrupted in between leaves it, and a later one finishes the step (a
# payload no sidecar names was left for good). No sidecar, payload or temp name.
_DELETING = re.compile(r"^\.ddpkit-deleting-ckpt-step-(\d{9,18})\.json\Z", re.ASCII)
_print_lock = threading.Lock()  # a background checkpoint writer logs too
T = TypeVar("T")


# ---- the environment ---------------------------------------------------------------------
def _exit_on_env(name: str, value: str, wanted: str) -> NoReturn:
    """One line naming the variable and what it must hold, exit 2: a bare ValueError from
    int() named neither (torchrun and ddpdeploy set these; a hand-set one can be wrong)."""
    _exit_2(f"ddpkit: error: {name}={value!r} is not {wanted}; fix or unset it")


def _exit_2(line: str) -> NoReturn:
    """``line`` on stderr, exit 2. With a process group up, the way ``finish()`` ends (the
    group destroyed, atexit run, no interpreter teardown): a plain SystemExit tore down a
    live gloo group, which torch 2.13 aborted now and then (SIGABRT, "terminate called
    without an active exception") in place of the exit 2 (ddpkit5 K6)."""
    sys.stderr.write(line + "\n")  # one write: the ranks' lines in a shared file stay whole
    sys.stderr.flush()
    if dist.is_available() and dist.is_initialized():
        finish(2)
    raise SystemExit(2)


_WHOLE = re.compile(r"\s*-?[0-9]+\s*", re.ASCII)


def _env_int(name: str, default: int, low: int = 0) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    # fullmatch, not isdigit() after lstrip("-"): "--1" passed that and int() raised
    if not _WHOLE.fullmatch(value) or int(value) < low:
        _exit_on_env(name, value, f"a whole number of at least {low}")
    return int(value)


def _env_ints(name: str, low: int = 0) -> list[int]:
    """A comma-separated list of whole numbers (empty items skipped)."""
    value = os.environ.get(name, "")
    items = [x for x in value.split(",") if x.strip()]
    if not all(_WHOLE.fullmatch(x) and int(x) >= low for x in items):
        _exit_on_env(name, value, f"a list of whole numbers of at least {low}, comma-separated")
    return [int(x) for x in items]


def _env_float(name: str, default: float, low: float = 0.0) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (value.isascii() and math.isfinite(number) and number >= low):
        wanted = "a finite number" + (f" of at least {low:g}" if low > -math.inf else "")
        _exit_on_env(name, value, wanted)
    return number


# ---- who am I ----------------------------------------------------------------------------
def rank() -> int:
    """Global rank: the process group's once initialised, else torchrun's RANK (or 0)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", 0)


def world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1, low=1)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# ---- protocol lines ----------------------------------------------------------------------
_started: list[bool] = []  # a `start` line went out from this process
_resumed: dict[str, Any] = {}  # what load_latest found, for the `start` line


def log(event: str, **fields: Any) -> None:
    """One JSON protocol line on stdout, from global rank 0 only (others: nothing).

    ``start`` gets the fields ddpkit knows (``world_size``, ``backend``, ``host``,
    ``restart_count``, and after ``load_latest`` ``resumed``, ``resume_path``,
    ``resume_step``) unless given; any other event logged before a ``start`` sends one
    first, so each (re)start of the workers shows, as smoke's recovery needs.

    A field holds what JSON holds; a one-element tensor or a numpy scalar is sent as its
    ``.item()``. Anything else raises TypeError on every rank, naming the field."""
    if not isinstance(event, str) or not event:
        raise TypeError(
            f"ddpkit.log({event!r:.40}): the event must be a name, e.g. 'step' (start, step, "
            f"checkpoint, done or your own), got {type(event).__name__}"
        )
    fields = _json_fields(event, fields)
    if rank() == 0:
        if event == "start":
            emit({"event": "start", **_start_fields(), **fields})
        else:
            if not _started:
                emit({"event": "start", **_start_fields()})
            emit({"event": event, **fields})
    if event == "step":
        _logged_step(fields.get("step"))
        _on_step(fields.get("step"), False)  # smoke --kill-at STEP's hold, when asked


def _logged_step(step: object) -> None:
    """A ``step`` line stands for step_done in a script that does not call it (the port
    docs/own-script.md shows): the step's wall time, and the hang watchdog armed. No
    collective, so a script that logs on rank 0 only does not hang here; the watchdog's
    store namespace needs the round init_process_group joined."""
    t = _timing
    if t.by_step_done or not isinstance(step, int) or isinstance(step, bool):
        return
    now = time.perf_counter()
    if t.last_t is not None:
        t.slowest_step = max(t.slowest_step, now - t.last_t)
    t.last_t, t.step = now, step
    if _round_id:
        _Watchdog.arm()


def _item(value: Any) -> Any:
    """json's ``default``: a one-element tensor or numpy value as its Python number (a
    ``loss`` tensor for ``loss.item()`` is the common slip); anything else is refused."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if type(value).__module__ == "numpy" and getattr(value, "size", None) == 1:
        return value.item()  # numpy scalars and 1-element arrays, without importing numpy
    raise TypeError(type(value).__name__)


def _json_fields(event: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as JSON will carry them, checked on every rank alike (only rank 0 prints,
    and a refusal on rank 0 alone left the other ranks in their next collective)."""
    try:
        return cast(dict[str, Any], json.loads(json.dumps(fields, default=_item)))
    except (TypeError, ValueError, RecursionError):
        pass
    for name, value in fields.items():
        try:
            json.dumps(value, default=_item)
        except (TypeError, ValueError, RecursionError) as e:
            what = type(value).__name__
            why = f"is of type {what}" if isinstance(e, TypeError) else f"cannot be JSON ({e})"
            raise TypeError(
                f"ddpkit.log({event!r}): field {name} {why}, which a protocol line cannot "
                f"carry; pass a number, string, list or dict (e.g. float({name}))"
            ) from None
    raise TypeError(f"ddpkit.log({event!r}): its fields are not JSON")


def emit(line: dict[str, Any]) -> None:
    """Print ``line`` as one JSON line, whole even when threads print at once."""
    with _print_lock:
        if line.get("event") == "start":
            _started.append(True)
        # One write, newline included: print() writes the text and the newline apart, and
        # under PYTHONUNBUFFERED torchrun's tee can prefix the lone newline as a line of
        # its own, leaving "[rank0]:" glued to the end of this one.
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


def _start_fields() -> dict[str, Any]:
    return {
        "world_size": world_size(),
        "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "host": socket.gethostname(),
        "restart_count": _env_int("TORCHELASTIC_RESTART_COUNT", 0),
        **_resumed,
    }


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


# ---- smoke --kill-at STEP: every rank holds at that step until the kill is done ----------
# Set by ddpdeploy in the chaos run only: without them nothing below runs. The runner kills
# one worker while every rank waits here, then creates the release file, so the kill lands
# at the asked step however fast the run is (a kill sent on the step line alone could reach
# the container after the ranks had finished: then one node's agent had already succeeded
# and, under static rendezvous, the restarted node waited for it until the store timeout).
HOLD_STEP_ENV = "DDPDEPLOY_CHAOS_HOLD_STEP"  # a step, or several: 5,10,15
HOLD_RELEASE_ENV = "DDPDEPLOY_CHAOS_RELEASE"  # the file: each kill done appends one byte
HOLD_MAX_S_ENV = "DDPDEPLOY_CHAOS_HOLD_S"  # the bound: never wait longer than this


class _ChaosHold:
    """Wait (bounded) at the i-th chaos step until the release file has i + 1 bytes; once
    per step and process, and not at all for a step already released (restarted workers
    pass the earlier steps again)."""

    def __init__(self, steps: list[int], release: str, max_s: float) -> None:
        self.steps, self.release, self.max_s = steps, release, max_s
        self.held: set[int] = set()

    @classmethod
    def from_env(cls) -> _ChaosHold | None:
        steps = _env_ints(HOLD_STEP_ENV)
        release = os.environ.get(HOLD_RELEASE_ENV)
        if not steps or not release:
            return None
        return cls(steps, release, _env_float(HOLD_MAX_S_ENV, 60.0))

    def _releases(self) -> int:
        try:
            return os.path.getsize(self.release)
        except OSError:
            return 0

    def __call__(self, step: object, announce: bool) -> None:
        if not isinstance(step, SupportsIndex):
            return  # a step line without an integer step
        n = operator.index(step)
        if n not in self.steps or n in self.held:
            return
        needed = self.steps.index(n) + 1
        if self._releases() >= needed:
            return
        self.held.add(n)
        if announce and rank() == 0:  # the runner's cue, also when this step prints no line
            emit({"event": "step", "step": n, "hold": True})
        deadline = time.monotonic() + self.max_s
        with _no_step_clock():  # the watchdog does not count the hold as a step that hangs
            while self._releases() < needed and time.monotonic() < deadline:
                time.sleep(0.02)


def _first_step(step: object, announce: bool) -> None:
    """The first step of this process: read the chaos env once and install the hold only
    when it is set; every later step calls what is installed (a no-op without it)."""
    global _on_step
    _on_step = _ChaosHold.from_env() or _no_hold
    _on_step(step, announce)


def _no_hold(step: object, announce: bool) -> None:
    pass


_on_step: Callable[[object, bool], None] = _first_step


# ---- the process group -------------------------------------------------------------------
def init_process_group(
    backend: str | None = None,
    *,
    probe: bool | None = None,
    probe_min_busbw: float | None = None,
    **kwargs: Any,
) -> None:
    """``torch.distributed.init_process_group`` that survives torchrun worker restarts.

    ``backend`` None: nccl when CUDA is available, else gloo (nccl also selects the GPU
    ``LOCAL_RANK``). Without torchrun's env (plain ``python train.py``) it makes a world of
    one. Under torchrun with the agent's shared store (``TORCHELASTIC_USE_AGENT_STORE=True``:
    static rendezvous always, c10d unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) the store
    outlives a restart; the group is then built on a prefix of it named by the restart
    count, so a restarted round never reads the previous round's keys. Other keyword
    arguments (``timeout``, ...) go to torch; an explicit ``store`` or ``init_method`` is
    passed through unchanged.

    Once the group is up, every rank runs the collective ``probe()`` (``probe=False``, or
    ``DDPDEPLOY_PROBE=0``, skips it; ``probe_min_busbw`` is its floor). Under nccl, NCCL's
    INIT/NET debug lines go to a per-rank file (unless NCCL_DEBUG is yours) so the probe
    can say which transport NCCL chose.
    """
    e = os.environ
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        _route_nccl_debug()
        flight_recorder_env(os.environ)
    _init_group(backend, **kwargs)
    if probe if probe is not None else e.get("DDPDEPLOY_PROBE", "1") != "0":
        _probe(probe_min_busbw)
    _join_round()  # a no-op after the probe; log("step") arms the watchdog without one


def _launcher_rank() -> int:
    """RANK as the launcher set it, checked against WORLD_SIZE: a rank outside the world
    (a hand-set env, a copied one) would wait at the rendezvous for peers that never come."""
    e = os.environ
    if not e.get("RANK") or not e.get("WORLD_SIZE"):
        missing = " and ".join(n for n in ("RANK", "WORLD_SIZE") if not e.get(n))
        print(
            f"ddpkit: error: MASTER_ADDR is set but {missing} is not; start the script with "
            "torchrun (which sets all of them), or set RANK, WORLD_SIZE and MASTER_PORT too",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1, low=1)
    if rank >= world:
        _exit_on_env("RANK", e["RANK"], f"a rank below WORLD_SIZE={world} (0 to {world - 1})")
    return rank


def _init_group(backend: str, **kwargs: Any) -> None:
    e = os.environ
    if backend == "nccl" and "LOCAL_RANK" in e:
        # before the group binds a device
        torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
    if isinstance(kwargs.get("timeout"), timedelta):  # the lock wait's cap follows it
        _group_timeout[:] = [kwargs["timeout"].total_seconds()]
    if "store" in kwargs or "init_method" in kwargs:
        dist.init_process_group(backend, **kwargs)
        return
    timeout = kwargs.setdefault("timeout", timedelta(minutes=30))
    if isinstance(timeout, timedelta):
        _group_timeout[:] = [timeout.total_seconds()]
    if e.get("MASTER_ADDR") == "":  # torch's env:// would call it "not set"
        print(
            "ddpkit: error: MASTER_ADDR is set but empty; unset it to run as a world of one, "
            "or start the script with torchrun (which sets it to rank 0's host)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)
    if "MASTER_ADDR" not in e:  # not under torchrun: a world of one
        kwargs.setdefault("rank", 0)
        kwargs.setdefault("world_size", 1)
        # torch.distributed's stores are public but not re-exported to type checkers
        dist.init_process_group(backend, store=dist.HashStore(), **kwargs)  # type: ignore[attr-defined]
        return
    kwargs.setdefault("rank", _launcher_rank())
    kwargs.setdefault("world_size", _env_int("WORLD_SIZE", 1, low=1))
    port = _env_int("MASTER_PORT", 29500, low=1)  # torch's env:// reads it too
    if port > 65535:
        _exit_on_env("MASTER_PORT", e["MASTER_PORT"], "a TCP port (1 to 65535)")
    if e.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # a fresh store per round already
        dist.init_process_group(backend, init_method="env://", **kwargs)
        return
    addr = e["MASTER_ADDR"]
    # torch.distributed's stores are public but not re-exported to type checkers
    base = dist.TCPStore(  # type: ignore[attr-defined]
        addr, port, kwargs["world_size"], is_master=False, timeout=timeout
    )
    restart = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
    store = dist.PrefixStore(f"ddpkit/restart-{restart}/", base)  # type: ignore[attr-defined]
    dist.init_process_group(backend, store=store, **kwargs)
    _warn_if_counts_can_differ()


def _warn_if_counts_can_differ() -> None:
    # Under c10d with several agents the restart counts differ between nodes (only the
    # failed node's agent increments it), so the prefix cannot name the round there; the
    # launcher must unshare the store instead. Workers are not told the rdzv backend.
    several_nodes = _env_int("GROUP_WORLD_SIZE", 1, low=1) > 1
    restarts = _env_int("TORCHELASTIC_MAX_RESTARTS", 0) > 0
    if rank() == 0 and several_nodes and restarts:
        warn(
            "several nodes share the agent store: worker restarts under c10d rendezvous "
            "need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every torchrun agent's env"
        )


# ---- where checkpoints go ----------------------------------------------------------------
def checkpoint_dir(directory: str | os.PathLike[str] | None = None) -> str:
    """``directory`` if given (ValueError if empty), else ``$DDPDEPLOY_CHECKPOINT_DIR``;
    exits 2 with one line if neither is set, or the variable is empty (the job has no
    checkpoint volume). A bad DDPDEPLOY_CHECKPOINT_LOCK_S or DDPDEPLOY_SAVE_WARN_S exits
    here too, on every rank as it resumes, not inside the first save."""
    _env_float(LOCK_WAIT_ENV, 300.0)
    _env_float(SAVE_WARN_ENV, 30.0)
    if directory is not None:
        given = os.fspath(directory) if isinstance(directory, str | os.PathLike) else directory
        if not isinstance(given, str) or "\0" in given:
            raise TypeError(
                f"directory= must name a folder as text (a str or a pathlib.Path), got "
                f"{type(given).__name__} {str(given)[:80]!r}"
            )
        if not given.strip():  # "" lists nothing: load_latest found no checkpoint, a fresh start
            raise ValueError(
                f"directory={given!r} names no folder; pass the checkpoint folder, or "
                f"directory=None for ${CHECKPOINT_DIR_ENV}"
            )
        return given
    found = os.environ.get(CHECKPOINT_DIR_ENV)
    if not found:
        state = "is not set" if found is None else "is set but empty"
        _exit_2(
            f"ddpkit: error: {CHECKPOINT_DIR_ENV} {state}; give the job a checkpoint "
            "volume (checkpoint: in ddpdeploy.yaml) or pass directory= to ddpkit"
        )
    if found != found.strip():
        _exit_on_env(
            CHECKPOINT_DIR_ENV, found, "a usable folder name (it starts or ends with whitespace)"
        )
    # Resolved once: a relative folder read again after the script's chdir would be another
    # folder, and load_latest would find nothing there (a silent fresh start).
    return _resolved_dirs.setdefault(found, os.path.abspath(os.path.expanduser(found)))


_resolved_dirs: dict[str, str] = {}


# ---- save and load -----------------------------------------------------------------------
class CheckpointError(RuntimeError):
    """A checkpoint was not written, or one that verifies cannot be loaded. ``save`` and
    ``load_latest`` raise it on every rank alike, with rank 0's cause in the message, so a
    script that catches it keeps its ranks in step."""


# What a state holds that torch.load(weights_only=True) takes: the fix save and load name.
_WEIGHTS_ONLY_FIX = (
    "save only tensors, numbers, strings and dicts or lists of them (vars(args) for an "
    "argparse.Namespace)"
)


class WeightsOnlyRefusal(Exception):
    """torch.load(weights_only=True) refused a payload whose sha256 is right: it holds an
    object (an argparse.Namespace, a dataclass) that save took and a weights-only load
    never will. No older checkpoint of the same script loads either, so ``load_latest``
    raises instead of skipping them all into a fresh start."""

    GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")

    def __init__(self, cause: Exception) -> None:
        found = self.GLOBAL.search(str(cause))
        self.what = f"it holds {found[1]}" if found else _one_line(cause)
        super().__init__(self.what)


def save(
    state: Any,
    step: int,
    *,
    keep: int = DEFAULT_KEEP,
    directory: str | None = None,
    weights_only: bool = True,
) -> str:
    """Checkpoint ``state`` (anything torch.save takes but None, which ``load_latest``
    returns for "no checkpoint") as step ``step``; call on every rank (only rank 0's
    ``state`` is written).

    Global rank 0 writes it atomically with its sidecar and keeps this run's ``keep``
    newest; then one broadcast tells every rank how that went, so on return the checkpoint
    is durable and the call is a step boundary. When rank 0's write fails (a state
    torch.save cannot pickle, a full disk, a None state) every rank raises the same
    ``CheckpointError``.
    ``step``: an integer from 0 to 10**18 - 1 (else ValueError, on every rank).
    ``weights_only``: the payload must load with torch.load(weights_only=True), as
    ``load_latest`` loads by default; a state holding what that refuses (an
    argparse.Namespace) fails now, not at the restart. False for a state only
    ``load_latest(weights_only=False)`` will read. Returns the payload's path.
    """
    n = checked_step(step)
    store = CheckpointStore(checkpoint_dir(directory), keep, weights_only=weights_only)
    with _no_step_clock():  # a long write is no hang; a missing rank is named below
        return _save(state, n, store)


def _save(state: Any, n: int, store: CheckpointStore) -> str:
    path = store.payload_path(n)  # until rank 0 says which name it committed
    error: Exception | None = None
    # Every rank arrives before rank 0 writes: a long write (or a wait on the folder's
    # lock) made the others name rank 0 as "did not call save", with the wrong fix.
    arrival = _arrive_in_save() if _distributed() else None
    if rank() == 0:
        try:
            if state is None:  # it would load as None: a restart would start over, silently
                raise TypeError(
                    "ddpkit.save(None): load_latest() returns None for no checkpoint, so a "
                    "restart would start over; save what to resume from, e.g. "
                    "{'model': model.state_dict(), 'optimizer': opt.state_dict()}"
                )
            path = store.write(state, meta(n))
        except Exception as e:  # every rank learns of it below and raises alike
            error = e
    failure = "" if error is None else _one_line(error)
    if _distributed():
        _every_rank_in_save(arrival, n, path)
        failure = _broadcast_text(failure, _collective_device())
        if not failure:  # the name rank 0 committed: <16 hex> for a step again
            told = _broadcast_text(os.path.basename(path), _collective_device())
            path = os.path.join(store.dir, told)
    if failure:
        # The step, not a file: the payload of that name may be the old pair's, still whole.
        raise CheckpointError(
            f"checkpoint of step {n} in {store.dir} was not written: rank 0: {failure}"
        ) from error
    return path


SAVE_WARN_ENV = "DDPDEPLOY_SAVE_WARN_S"  # seconds before save names the ranks it waits for
_saves: list[int] = [0]  # this process's save() calls: the ranks' n-th calls pair up
_group_timeout: list[float] = [1800.0]  # the group's, as init_process_group set it


def _arrive_in_save() -> tuple[Any, int, int] | None:
    """This rank's arrival at its next save, in the store: (store, the save's number, how
    many have arrived), or None when the store fails (the broadcast then tells)."""
    _saves[0] += 1
    seq = _saves[0]
    try:
        st = _store()
        st.set(_diag_key(f"save-at/{rank()}"), str(seq))
        return st, seq, st.add(_diag_key(f"save/{seq}"), 1)
    except Exception:
        return None


def _every_rank_in_save(arrival: tuple[Any, int, int] | None, step: int, path: str) -> None:
    """Wait, through the store, until every rank has called this save: its broadcast would
    otherwise pair with another collective, and a save under ``if rank == 0`` (as the
    tutorials write it) hung with no line until the group's timeout. After
    DDPDEPLOY_SAVE_WARN_S (30) one warning names who is missing; at the group's timeout
    CheckpointError. A store that fails leaves the broadcast to tell."""
    if arrival is None:
        return
    st, seq, arrived = arrival
    me, n = rank(), world_size()
    try:
        start = time.monotonic()
        warn_after, pause, warned = _env_float(SAVE_WARN_ENV, 30.0), 0.002, False
        while arrived < n:
            waited = time.monotonic() - start
            if waited >= _group_timeout[0] or (not warned and waited >= warn_after):
                missing = [r for r in range(n) if _save_seq(st, r) < seq]
                named = _first_of([str(r) for r in missing])
                why = (
                    f"rank(s) {named} did not call save(step {step}) within {waited:.0f} s; "
                    "call ddpkit.save on every rank (only rank 0's state is written), not "
                    "under `if rank == 0`"
                )
                if waited >= _group_timeout[0]:
                    raise CheckpointError(f"checkpoint {path}: {why}")
                warn(why)
                warned = True
            time.sleep(pause)
            pause = min(2 * pause, 0.5)
            arrived = st.add(_diag_key(f"save/{seq}"), 0)
        if me == 0 and seq > 1:  # every rank is past the previous save's wait
            with contextlib.suppress(Exception):
                st.delete_key(_diag_key(f"save/{seq - 1}"))
    except CheckpointError:
        raise
    except Exception:  # the store is gone (a peer's agent ended): the broadcast says so
        return


def _save_seq(st: Any, r: int) -> int:
    key = _diag_key(f"save-at/{r}")
    return int(st.get(key)) if st.check([key]) else 0


def checked_step(step: object) -> int:
    """``step`` as an int; ValueError unless it is an integer from 0 to MAX_STEP (the
    range that the file name's 9 to 18 digits hold)."""
    if isinstance(step, SupportsIndex) and not isinstance(step, bool):
        try:
            n = operator.index(step)
        except TypeError:  # a float tensor has __index__, and it raises
            n = -1
        if 0 <= n <= MAX_STEP:
            return n
    raise ValueError(f"checkpoint step must be an integer from 0 to {MAX_STEP}, got {step!r}")


def load_latest(
    map_location: Any = None, *, directory: str | None = None, weights_only: bool = True
) -> Any | None:
    """The newest checkpoint that every rank can read, verify and load; None on a fresh
    start.

    Call on every rank (with a process group, all ranks agree on the step). A candidate
    that any rank cannot use (half-written, corrupt, not a regular file, not a torch file)
    is skipped with one line on stderr from rank 0, and the one before is tried.
    """
    store = CheckpointStore(checkpoint_dir(directory), DEFAULT_KEEP)

    def load(f: BinaryIO) -> Any:
        try:
            return torch.load(f, map_location=map_location, weights_only=weights_only)
        except pickle.UnpicklingError as e:
            if weights_only and WeightsOnlyRefusal.GLOBAL.search(str(e)):
                raise WeightsOnlyRefusal(e) from e
            raise

    found = latest_verified(store, load)
    return None if found is None else found[1]


def meta(step: int) -> dict[str, Any]:
    """The sidecar's fields besides run_id, sha256 and file name; ``run`` is
    ``run_record()``."""
    return {
        "step": int(step),
        "world_size": world_size(),
        "host": socket.gethostname(),
        "rank": rank(),
        "restart_count": _env_int("TORCHELASTIC_RESTART_COUNT", 0),
        "time": time.time(),
        "run": run_record(),
    }


def latest_verified(
    store: CheckpointStore, load: Callable[[BinaryIO], T], device: Any = None
) -> tuple[int, T] | None:
    """(step, ``load(payload)``) of the newest checkpoint every rank can use, or None.

    Rank 0 lists the committed steps (after removing a killed writer's stale temp files) and
    broadcasts them; each rank reads, checks the sha256 and loads the candidate itself,
    because the folder is shared but a rank may see it through another node's mount. The
    first that works on every rank wins; rank 0 says in one line why each newer one did
    not. The winner's run id becomes this process's, so retention carries on with the run
    it resumed. Collectives run on the default group, with tensors on ``device`` (default:
    the current GPU under nccl, else CPU).
    """
    is_main, many = rank() == 0, _distributed()
    device = device if device is not None else _collective_device()
    steps, unlisted = [], ""
    if is_main:
        try:
            store.remove_stale_temp_files()
            steps = store.list_steps()
        except OSError as e:  # a folder it may not read: every rank raises, none waits
            unlisted = f"cannot list {store.dir}: {e.strerror or e}"
    if many:
        unlisted = _broadcast_text(unlisted, device)
    if unlisted:
        raise CheckpointError(f"{unlisted}; give the run a folder it can read and write")
    if many:
        steps = _broadcast_ints(steps, device)
    unloadable: tuple[str, str] | None = None  # the newest that verifies but does not load
    tried: set[int] = set()
    relists = 0
    while steps:
        step = steps.pop(0)
        tried.add(step)
        path = store.committed_payload(step)
        try:
            got = store.read(step, load)  # (value, sidecar), or why not
        except WeightsOnlyRefusal as e:
            got = _Refused(
                f"checkpoint {path} verifies but torch.load(weights_only=True) refuses it: "
                f"{e.what}; {_WEIGHTS_ONLY_FIX}, or pass weights_only=False to load_latest "
                "if you trust the folder"
            )
        except (torch.OutOfMemoryError, MemoryError) as e:  # every rank learns of it below
            got = _Refused(
                f"checkpoint {path} verifies but loading it ran out of memory on rank "
                f"{rank()} ({_one_line(e)}); load it with map_location='cpu', or give the "
                "job more memory"
            )
        except _LoaderFault as e:
            got = _Refused(
                f"checkpoint {path} verifies but does not load here ({e}); fix what "
                "load_latest is given (map_location, weights_only) or what the state needs "
                "(its classes, its devices), or move it away to resume from the one before"
            )
        # 3: loaded, 2: it verifies but does not load, 1: skip it (unverifiable), 0: it
        # verifies and will never load (every rank raises)
        verdict = (
            0 if isinstance(got, _Refused) else 2 if isinstance(got, _Unloadable)
            else 1 if isinstance(got, str) else 3
        )  # fmt: skip
        # Its sidecar gone: a newer save's retention (a replaced pod's last save, keep=1)
        # deleted the step after the listing, which holds only older ones; 0 when gone.
        kept = int(verdict == 3 or os.path.lexists(store.sidecar_path(step)))
        if many:
            flag = torch.tensor([verdict, kept], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            verdict, kept = (int(x) for x in flag.tolist())
        if verdict == 0:
            why = got if isinstance(got, _Refused) else f"checkpoint {path}: refused on rank 0"
            if many:
                why = _broadcast_text(why, device)  # rank 0's, which may be the refusal
            raise CheckpointError(why)
        ok = verdict == 3
        if ok and many and not _same_save(got, device):
            # Each rank reads the pair itself: a re-save of the step (a replaced pod in its
            # grace) committed between two ranks' reads gave them different states.
            if relists < _RELISTS:
                relists += 1
                steps.insert(0, step)
                if is_main:
                    line = (
                        f"ddpkit: checkpoint of step {step} in {store.dir} was saved again "
                        "while the ranks read it; reading it again"
                    )
                    print(line, file=sys.stderr, flush=True)
                continue
            ok, got = False, "the ranks read different saves of it (it is being saved again)"
        if ok and not isinstance(got, str):
            value, sidecar = got
            _adopt_run_id(sidecar)
            path = store.payload_of(step, sidecar) or path  # read() followed it
            _resumed.update(resumed=True, resume_path=path, resume_step=step)
            return step, value
        why = got if isinstance(got, str) else "not loaded on every rank"
        if verdict == 2 and unloadable is None:
            unloadable = (path, why)
        if not kept and relists < _RELISTS:  # list again: the step that replaced it
            relists += 1
            steps = _relisted(store, tried, device)
            if is_main:
                line = f"ddpkit: checkpoint {path} vanished ({why}); listing {store.dir} again"
                print(line, file=sys.stderr, flush=True)
            continue
        if is_main:
            line = f"ddpkit: skipping checkpoint {path}: {why}; trying the one before"
            print(line, file=sys.stderr, flush=True)
    if unloadable is not None:
        # A verified checkpoint that no load took is most often the load's own fault (a
        # map_location this host has no device for), and every older one fails alike:
        # starting afresh would save over this run's steps.
        path, why = unloadable
        if many:
            why = _broadcast_text(why, device)
        raise CheckpointError(
            f"no checkpoint in {store.dir} loads: {path} verifies but "
            f"{why}; fix what load_latest is given (map_location, weights_only), or move "
            "the checkpoints away to start afresh"
        )
    _resumed.update(resumed=False, resume_path=None, resume_step=0)
    return None


# How often one load_latest lists the folder again after a listed step vanished: once per
# save that lands while it reads; a writer saving faster than that is not caught up with.
_RELISTS = 5


def _same_save(got: Any, device: Any) -> bool:
    """Whether every rank loaded the same save of the step (its sidecar's sha256), on every
    rank alike: one all_reduce of a part of the digest and its negation."""
    digest = str(got[1].get("sha256", "")) if isinstance(got, tuple) else ""
    part = int(digest[:15], 16) if len(digest) >= 15 else -1  # 60 bits: an int64
    both = torch.tensor([part, -part], dtype=torch.int64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return int(both[0]) == -int(both[1])


def _relisted(store: CheckpointStore, tried: set[int], device: Any) -> list[int]:
    """Rank 0's fresh listing of the committed steps not ``tried``, on every rank."""
    steps: list[int] = []
    if rank() == 0:
        with contextlib.suppress(OSError):  # it was listable a moment ago: then none
            steps = [s for s in store.list_steps() if s not in tried]
    return _broadcast_ints(steps, device) if _distributed() else steps


class _Refused(str):
    """Why a verified payload will never load (WeightsOnlyRefusal), as read() tells why not."""


class _Unloadable(str):
    """Why a verified payload did not load: it is no torch file (a planted one)."""


class _LoaderFault(Exception):
    """A verified torch file that this load cannot take: a map_location with no such
    device here, a class the state holds that this script does not define."""


def _file_side(e: Exception) -> bool:
    """Whether ``load``'s error says the file is no torch checkpoint (not a zip, not a
    pickle), rather than that this process cannot take one that is."""
    text = str(e)
    return isinstance(e, pickle.UnpicklingError | EOFError) or any(
        mark in text for mark in ("PytorchStreamReader", "invalid load key", "zip archive")
    )


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


def _broadcast_text(text: str, device: Any) -> str:
    """Rank 0's ``text`` on every rank: its length, then (if any) its UTF-8 bytes."""
    raw = text.encode()[:4096]
    n = _broadcast_ints([len(raw)], device)[0]
    if n == 0:
        return ""
    buf = torch.empty(n, dtype=torch.uint8, device=device)
    if rank() == 0:
        buf = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)
    dist.broadcast(buf, src=0)
    return bytes(buf.cpu().tolist()).decode(errors="replace")


def _one_line(e: BaseException) -> str:
    """An exception as one short line (weights_only's refusals run to many lines), without
    terminal escapes (they carry bold text)."""
    text = " ".join(_ESCAPES.sub("", str(e)).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|[\x00-\x1f\x7f-\x9f]")


# ---- the checkpoint folder ---------------------------------------------------------------
_run_id: list[str] = []  # this run's: drawn at its first write, or the resumed checkpoint's
_verified: dict[str, tuple[str, tuple[int, ...]]] = {}  # payload -> (sha256, identity)


def _own_run_id() -> str:
    if not _run_id:
        _run_id.append(os.urandom(8).hex())
    return _run_id[0]


def _adopt_run_id(sidecar: dict[str, Any]) -> None:
    found = sidecar.get("run_id")
    if isinstance(found, str) and found:
        _run_id[:] = [found]


class CheckpointStore:
    """One checkpoint folder: names, atomic writes with a sha256 sidecar, retention, reads.

    No collectives: ``save``/``load_latest`` above add the agreement between ranks.
    ``pause_mid_write`` is a test hook: the writer sleeps after its first write.

    Retention keeps the ``keep`` newest checkpoints of this run, and the one just written,
    and deletes only this run's older ones. A checkpoint is this run's own when its sidecar
    carries this process's ``run_id`` (drawn at its first write, or taken over from the
    checkpoint that ``load_latest`` resumed) and its payload matches the sidecar's sha256
    (hashed once per process and file). Anything else in the folder (another run's
    checkpoints, a corrupt or hand-made one) is neither counted nor deleted: a newer
    stranger never pushes this run's newest out. A script that saves without ever calling
    ``load_latest`` starts a new run in every process, so its checkpoints from before a
    restart are kept.
    """

    def __init__(
        self, directory: str, keep: int, pause_mid_write: float = 0.0, weights_only: bool = True
    ) -> None:
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
        self.dir, self.keep, self.pause_mid_write = directory, keep, pause_mid_write
        self.weights_only = weights_only

    @staticmethod
    def _name(step: int, ext: str) -> str:
        return f"ckpt-step-{step:09d}{ext}"

    def payload_path(self, step: int) -> str:
        """The payload's usual name, ckpt-step-{N:09d}.pt; the sidecar's ``file`` says which one
        is committed (``payload_of``)."""
        return os.path.join(self.dir, self._name(step, ".pt"))

    def payload_of(self, step: int, sidecar: dict[str, Any]) -> str | None:
        """The payload that ``sidecar`` (of ``step``) names, or None when its ``file`` is no
        payload name of that step: a name read from a file is never followed elsewhere.
        A sidecar without ``file`` names ckpt-step-{N:09d}.pt."""
        name = sidecar.get("file", self._name(step, ".pt"))
        if not isinstance(name, str) or not self._is_payload_of(name, step):
            return None
        return os.path.join(self.dir, name)

    def committed_payload(self, step: int) -> str:
        """The payload that the sidecar of ``step`` names now (ckpt-step-{N:09d}.pt when it
        names none), for messages."""
        return self._named_payload(step) or self.payload_path(step)

    def _named_payload(self, step: int) -> str | None:
        """The payload that the sidecar of ``step`` names now; None when it names none."""
        sidecar, _ = self._sidecar(step)
        return None if sidecar is None else self.payload_of(step, sidecar)

    def _is_payload_of(self, name: str, step: int) -> bool:
        m = _PAYLOAD.match(name)
        return m is not None and m.group(1) == f"{step:09d}"

    def _payload_files(self, step: int) -> list[str]:
        """Every payload name of ``step`` in the folder: the committed one, and one a killed
        or failed commit left behind."""
        return sorted(n for n in os.listdir(self.dir) if self._is_payload_of(n, step))

    def sidecar_path(self, step: int) -> str:
        return os.path.join(self.dir, self._name(step, ".json"))

    def list_steps(self) -> list[int]:
        """Committed checkpoints (a sidecar named as this store names it), newest first."""
        if not os.path.isdir(self.dir):
            return []
        names = set(os.listdir(self.dir))
        steps = {int(m.group(1)) for n in names if (m := _SIDECAR.match(n))}
        # One name per step: ckpt-step-0000000005.json is no name this store writes.
        return sorted((s for s in steps if self._name(s, ".json") in names), reverse=True)

    def remove_stale_temp_files(self) -> None:
        """Delete what a killed writer left half-written: its temp files, once not modified
        for STALE_TEMP_S. A younger one may be another process's write in progress (the
        pod this one replaces, still saving). A payload whose sidecar never came stays: it
        is never loaded, nothing tells whose it is, and the next save of that step replaces
        it. Rank 0, before the first save."""
        if not os.path.isdir(self.dir):
            return
        now = time.time()
        for n in os.listdir(self.dir):
            if _TEMP_NAME.match(n):
                path = os.path.join(self.dir, n)
                with contextlib.suppress(OSError):  # gone already, a folder, a read-only mount
                    if now - os.lstat(path).st_mtime >= STALE_TEMP_S:
                        os.unlink(path)

    def write(self, state: Any, meta: dict[str, Any]) -> str:
        """Write one checkpoint atomically and durably, apply retention, print the
        ``checkpoint`` line; the payload's path. ``meta`` needs ``step``; it becomes the
        sidecar, with this run's ``run_id``, the payload's ``sha256`` and its ``file`` name.

        One rename commits: the sidecar's, which names its payload. A step saved again
        while its ckpt-step-{N:09d}.pt is committed gets a payload of a new name beside it
        (ckpt-step-{N:09d}.<16 hex>.pt), and the old one is deleted once the new sidecar is in
        place. A kill or a failure at any point leaves the old pair or the new one whole
        (with two renames of the same names, a kill between them lost both)."""
        step = checked_step(meta["step"])
        until = _lock_deadline()
        os.makedirs(self.dir, exist_ok=True)
        with _without_zip_crc32():
            written, digest = _write_temp(
                self.payload_path(step), lambda f: torch.save(state, f), self.pause_mid_write
            )
        payload: str | None = written  # None once renamed
        side: str | None = None
        try:
            if self.weights_only:
                _check_weights_only(written)
            # Two writers of one step (a replaced pod still in its grace) are one at a time:
            # each picks its payload's name from what is committed when it commits.
            with _locked(self.dir, until):
                final = self._fresh_payload_path(step)
                sidecar = dict(
                    meta, run_id=_own_run_id(), sha256=digest, file=os.path.basename(final)
                )
                side, _ = _write_temp(
                    self.sidecar_path(step), lambda f: f.write(json.dumps(sidecar).encode())
                )
                try:
                    os.replace(written, final)
                except BaseException:
                    # A signal's exception raised as the rename returns: the payload is at
                    # `final`, a name picked under this lock, and no sidecar will name it.
                    if not os.path.lexists(written):
                        _unlink_quietly(final)
                    raise
                payload = None
                try:
                    os.replace(side, self.sidecar_path(step))
                except BaseException:
                    # No sidecar names it (nothing else would remove it), unless the rename
                    # was done: a signal's exception (Ctrl-C, a SIGTERM handler's exit) is
                    # raised as the call returns, after the commit.
                    if self._named_payload(step) != final:
                        _unlink_quietly(final)
                    raise
                side = None
                # Committed. The step's other payloads (the one replaced, one a killed
                # commit left) are named by no sidecar now; a leftover costs disk, not the
                # save (a folder of that name, an unlistable folder).
                with contextlib.suppress(OSError):
                    stuck = []
                    for n in self._payload_files(step):
                        if n != os.path.basename(final):
                            try:
                                _unlink_quietly(os.path.join(self.dir, n))
                            except OSError as e:
                                stuck.append(f"{n} ({e.strerror or e})")
                    if stuck:
                        warn(f"checkpoint {final} is written, but the step's older payload "
                             f"could not be deleted: {_first_of(stuck, 4)}")  # fmt: skip
        except BaseException:
            # Nothing else removes a fresh temp file (see remove_stale_temp_files); a renamed
            # one is gone, nothing to remove.
            for tmp in filter(None, (payload, side)):
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise
        # What follows cannot undo the commit, so a failure there is a warning and the save
        # stands (raising made every rank report a good checkpoint as "not written").
        try:
            _fsync_dir(self.dir)
        except OSError as e:
            warn(f"checkpoint {final} is written but its folder could not be synced: {e}")
        with contextlib.suppress(OSError):  # unknown: then retention hashes it again
            _verified[os.path.abspath(final)] = (digest, _identity(os.lstat(final)))
        try:
            self._apply_retention(step, until)
        except OSError as e:  # the folder could not be listed, or stayed locked
            warn(f"retention skipped after checkpoint {final}: {e}")
        fields = {"step": step, "path": final, "host": meta.get("host"), "rank": meta.get("rank")}
        emit({"event": "checkpoint", **fields})  # the writer is rank 0 by construction
        return final

    def _fresh_payload_path(self, step: int) -> str:
        """Where the next payload of ``step`` goes: ckpt-step-{N:09d}.pt unless a file holds that
        name (it may be the committed one), else a name no file has. Under the lock."""
        usual = self.payload_path(step)
        if not os.path.lexists(usual):
            return usual
        while True:
            path = os.path.join(self.dir, self._name(step, f".{os.urandom(8).hex()}.pt"))
            if not os.path.lexists(path):
                return path

    def _apply_retention(self, written: int, until: float | None = None) -> None:
        """Delete this run's checkpoints past its ``keep`` newest, never ``written``: a
        step below ones the run saved before (it resumed from an older checkpoint) must
        not be deleted as it is saved. That one stays beside the ``keep`` newest until the
        run's later saves push it out."""
        # Checked and deleted under the lock: a pair another run commits under the same
        # name between the check and the unlink would be deleted as this run's.
        with _locked(self.dir, until):
            self._delete_past_keep(written)

    def _delete_past_keep(self, written: int) -> None:
        self._finish_deletions()
        own = [step for step in self.list_steps() if self._own(step)]
        for step in own[self.keep :]:
            if step == written:
                continue
            # Sidecar first, renamed to the step's marker: once it is gone no payload of the
            # step is a candidate, and the marker tells a later retention what to finish.
            marker = os.path.join(self.dir, self._marker_name(step))
            try:
                os.replace(self.sidecar_path(step), marker)
            except FileNotFoundError:
                continue
            except OSError as e:  # immutable, another user's in a sticky folder
                # a payload whose sidecar stays is still a candidate: keep all
                warn(
                    f"retention could not delete {self.sidecar_path(step)} (keep={self.keep}): {e}"
                )
                continue
            for n in self._payload_files(step):
                p = os.path.join(self.dir, n)
                try:
                    _unlink_quietly(p)
                except OSError as e:
                    warn(f"retention could not delete {p} (keep={self.keep}): {e}")
                _verified.pop(os.path.abspath(p), None)
            _unlink_quietly(marker)

    @classmethod
    def _marker_name(cls, step: int) -> str:
        return f".ddpkit-deleting-{cls._name(step, '.json')}"

    def _finish_deletions(self) -> None:
        """Finish what an interrupted retention left (a Ctrl-C, a SIGTERM handler's exit, a
        kill between its deletes): each marker's payload, when it is still the one the
        marker names (its sha256) and no sidecar of the step names it now, then the marker.
        Under the lock."""
        for n in sorted(os.listdir(self.dir)):
            if not (m := _DELETING.match(n)) or n != self._marker_name(int(m.group(1))):
                continue
            step, marker = int(m.group(1)), os.path.join(self.dir, n)
            named, _ = self._sidecar_at(marker)
            path = None if named is None else self.payload_of(step, named)
            if path is not None and path != self._named_payload(step):
                try:
                    if _sha256_regular(path)[0] == named["sha256"]:  # type: ignore[index]
                        _unlink_quietly(path)
                        _verified.pop(os.path.abspath(path), None)
                    else:
                        warn(f"retention left {path}: it is not the payload {n} names")
                except FileNotFoundError:
                    pass
                except OSError as e:
                    warn(f"retention could not delete {path} (keep={self.keep}): {e}")
                    continue
            with contextlib.suppress(OSError):
                _unlink_quietly(marker)

    def _own(self, step: int) -> bool:
        """This run's checkpoint: its run_id in the sidecar, its payload's sha256 right."""
        sidecar, _ = self._sidecar(step)
        if sidecar is None or sidecar.get("run_id") != _own_run_id():
            return False
        named = self.payload_of(step, sidecar)
        if named is None:
            return False
        path = os.path.abspath(named)
        try:
            now = _identity(os.lstat(path))
        except OSError:
            return False
        if _verified.get(path) == (sidecar["sha256"], now):
            return True  # hashed before, unchanged since
        try:
            digest, now = _sha256_regular(path)
        except OSError:
            return False
        if digest != sidecar["sha256"]:
            return False
        _verified[path] = (digest, now)
        return True

    def _sidecar(self, step: int) -> tuple[dict[str, Any] | None, str | None]:
        """(the sidecar of ``step``, None), or (None, why it is none)."""
        return self._sidecar_at(self.sidecar_path(step))

    @staticmethod
    def _sidecar_at(path: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the sidecar at ``path``, None), or (None, why it is none)."""
        try:
            raw, _ = _read_regular(path, MAX_SIDECAR)
            # Strict UTF-8, a BOM refused, as collect's reader takes it: json.loads on bytes
            # also took a BOM and UTF-16, and the two readers then chose different steps.
            sidecar = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, RecursionError) as e:  # decode errors: ValueError
            return None, f"unreadable sidecar ({e})"
        if not isinstance(sidecar, dict) or not isinstance(sidecar.get("sha256"), str):
            return None, "its sidecar is not a JSON object with a sha256"
        return sidecar, None

    def read(self, step: int, load: Callable[[BinaryIO], T]) -> tuple[T, dict[str, Any]] | str:
        """(``load(payload)``, sidecar) for checkpoint ``step``, or why not: the sidecar is
        no JSON object with a sha256, a file is not a regular one, the payload's sha256
        differs, or ``load`` refuses the payload."""
        sidecar, why = self._sidecar(step)
        got = self._read_with(sidecar, why, step, load)
        if isinstance(got, str) and sidecar is not None and not isinstance(got, _Unloadable):
            again, why = self._sidecar(step)
            if again != sidecar:
                # The pair was replaced between the sidecar's read and the payload's (a
                # re-save of this step deletes the payload it replaces): the new pair is
                # whole, read it.
                got = self._read_with(again, why, step, load)
        return got

    def _read_with(
        self,
        sidecar: dict[str, Any] | None,
        why: str | None,
        step: int,
        load: Callable[[BinaryIO], T],
    ) -> tuple[T, dict[str, Any]] | str:
        """``read`` of ``step`` with its sidecar already read (``why``: why there is none)."""
        if sidecar is None:
            return why or "no sidecar"
        # An int equal to the name's step (5.0 and true compared equal to 5 and 1): a copy
        # under another name, or a hand-made sidecar, is refused as collect refuses it.
        found = sidecar.get("step")
        if type(found) is not int or found != step:
            return f"its sidecar says step {str(sidecar.get('step'))[:20]!r}, its name {step}"
        path = self.payload_of(step, sidecar)
        if path is None:
            file = sidecar.get("file")
            named = "null" if file is None else repr(str(file)[:80])
            return f"its sidecar names payload {named}, which is no payload name of step {step}"
        try:
            with _open_regular(path) as (f, st):
                # Hashed in chunks, then loaded from the same open file: one bytes copy of
                # the payload held a planted 8 GiB file in memory before its hash was known
                # (MemoryError), and a real one twice per rank.
                digest = _sha256_file(f)
                if digest != sidecar["sha256"]:
                    return _MISMATCH
                _verified[os.path.abspath(path)] = (digest, _identity(st))
                f.seek(0)
                try:
                    return load(f), sidecar
                except (torch.OutOfMemoryError, MemoryError, WeightsOnlyRefusal):
                    raise  # the payload is fine: an older one would not load either
                except Exception as e:
                    if _file_side(e):  # whole but no torch file: it cannot be resumed from
                        return _Unloadable(f"does not load ({_one_line(e)})")
                    # It loads elsewhere (save wrote it whole): this load's own fault, and
                    # resuming an older one would then save over it.
                    raise _LoaderFault(_one_line(e)) from e
        except OSError as e:
            return f"unreadable ({e})"


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MISMATCH = "fails its sha256 check"


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells that a file is the one hashed before: a regular file's device, inode,
    size and modification time (a link or anything else: never equal to a hashed one)."""
    if not stat.S_ISREG(st.st_mode):
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@contextlib.contextmanager
def _open_regular(path: str, limit: int | None = None) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """``path`` opened for reading if it is a regular file (OSError otherwise), and its
    stat. No link is followed (O_NOFOLLOW) and the open never blocks (O_NONBLOCK: a FIFO
    would wait for a writer forever); fstat decides before anything is read. Errors name
    ``path`` and what it is instead: os.open's ELOOP ("Too many levels of symbolic links")
    and open()'s EISDIR on the descriptor ("Is a directory: 3") say neither."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise OSError(f"{path}: a symlink, not a regular file") from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a directory, not a regular file" if stat.S_ISDIR(st.st_mode) else None
            raise OSError(f"{path}: {what or 'not a regular file'}")
        if limit is not None and st.st_size > limit:
            raise OSError(f"{path}: larger than {limit} bytes")
    except BaseException:
        os.close(fd)
        raise
    with open(fd, "rb") as f:  # a regular file: fstat said so
        yield f, st


def _read_regular(path: str, limit: int | None = None) -> tuple[bytes, tuple[int, ...]]:
    with _open_regular(path, limit) as (f, st):
        return f.read(), _identity(st)


def _sha256_regular(path: str) -> tuple[str, tuple[int, ...]]:
    with _open_regular(path) as (f, st):
        return _sha256_file(f), _identity(st)


def _sha256_file(f: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := f.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _no_step_clock() -> Iterator[None]:
    """The hang watchdog does not count the time inside (a chaos hold, a save), nor does the
    step's wall time."""
    t = _timing
    last_t = t.last_t
    t.last_t = None
    try:
        yield
    finally:
        t.last_t = time.perf_counter() if last_t is not None else None  # no step time


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

    def __init__(self, f: BinaryIO, pause_after_first_write: float = 0.0) -> None:
        self.f, self.sha256, self.pause = f, hashlib.sha256(), pause_after_first_write
        self.error: OSError | None = None  # torch.save reports it as a position mismatch

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.sha256.update(data)
        try:
            n = self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise
        if self.pause:  # test hook: widen the window in which a kill lands mid-write
            self.f.flush()
            time.sleep(self.pause)
            self.pause = 0.0
        return n

    def flush(self) -> None:
        self.f.flush()


def _write_temp(
    path: str, fill: Callable[[BinaryIO], object], pause_mid_write: float = 0.0
) -> tuple[str, str]:
    """A synced temp file beside ``path`` that ``fill`` wrote: (its name, its sha256). The
    caller renames it into place (whole or absent); on failure nothing is left."""
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    out: _HashingFile | None = None
    try:
        with os.fdopen(fd, "wb") as f:
            out = _HashingFile(f, pause_mid_write)
            fill(cast(BinaryIO, out))  # its write() is all torch.save and the sidecar use
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        _unlink_quietly(tmp)
        if out is not None and out.error is not None and not isinstance(e, OSError):
            raise out.error from e  # the disk's error (no space), not torch's wording of it
        raise
    return tmp, out.sha256.hexdigest()


def _check_weights_only(path: str) -> None:
    """Raise unless torch.load(weights_only=True) takes the payload at ``path``: its pickle
    is read, its tensors only mapped (mmap), so the check costs little at any size."""
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:  # what load_latest's unpickler refuses, as it would
        raise TypeError(
            f"torch.load(weights_only=True) would refuse it on resume: {WeightsOnlyRefusal(e)}; "
            f"{_WEIGHTS_ONLY_FIX}, or pass weights_only=False to save and to load_latest if "
            "you trust the folder"
        ) from None
    except Exception:  # the check's own limits (a storage mmap cannot map): the save stands
        return


_unlocked_warned: list[str] = []  # folders whose file system takes no locks, warned once


def _lock_deadline() -> float | None:
    """With a process group: half its timeout from now, the latest that rank 0's save waits
    for the folder's lock. The other ranks wait for rank 0 in a broadcast under that
    timeout; a longer wait had them die there in gloo's raw "Timed out waiting … for recv"
    naming neither the lock nor the fix, instead of all raising rank 0's CheckpointError
    (ddpkit5 K2). The other half is left for the payload's write and the commit."""
    return time.monotonic() + _group_timeout[0] / 2 if _distributed() else None


@contextlib.contextmanager
def _locked(directory: str, until: float | None = None) -> Iterator[None]:
    """Hold ``directory``'s checkpoint lock. OSError when the lock file cannot be opened
    or the lock stays taken past DDPDEPLOY_CHECKPOINT_LOCK_S, or past ``until`` (a
    time.monotonic(), see _lock_deadline) when that comes first; a file system without
    locks goes without, with one warning."""
    path = os.path.join(directory, LOCK_NAME)
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with contextlib.suppress(FileNotFoundError):  # a socket or device: never opened
        mode = os.lstat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            raise OSError(errno.EINVAL, f"{path} is not a regular file; remove it")
    try:
        try:
            fd = os.open(path, os.O_RDWR | flags, 0o644)
        except PermissionError:  # another user's lock file in a shared folder: it locks too
            fd = os.open(path, os.O_RDONLY | flags)
    except PermissionError as e:
        raise OSError(
            e.errno, f"{path} is another user's and not readable by this one; make it "
            "readable by all (chmod a+r) or remove it"
        ) from None  # fmt: skip
    except (IsADirectoryError, OSError) as e:
        if not isinstance(e, IsADirectoryError) and e.errno != errno.ELOOP:
            raise
        what = "a folder" if isinstance(e, IsADirectoryError) else "a symlink"
        raise OSError(e.errno, f"{path} is {what}, not a regular file; remove it") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file; remove it")
        if st.st_uid == os.geteuid() and st.st_mode & 0o444 != 0o444:
            # Readable by all whatever the umask (077): another user's run locks it too.
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o644)
        wait = _env_float(LOCK_WAIT_ENV, 300.0)
        start = time.monotonic()
        deadline, capped = start + wait, False
        if until is not None and until < deadline:
            deadline, capped = until, True
        pause = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    waited = (
                        f"{time.monotonic() - start:.0f} s, and rank 0 waits at most half "
                        f"the process group's timeout ({_group_timeout[0]:g} s) lest the "
                        "other ranks, waiting for it, time out first"
                        if capped
                        else f"{wait:g} s"
                    )
                    raise OSError(
                        errno.ETIMEDOUT,
                        f"{path} stayed locked by another process for {waited} "
                        "(another save into this folder, or a stuck mount)",
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.1)
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                if directory not in _unlocked_warned:
                    _unlocked_warned.append(directory)
                    warn(f"{directory} takes no file locks ({e.strerror}); two runs saving "
                         "into it at once may replace each other's checkpoints")  # fmt: skip
                break
        yield
    finally:
        os.close(fd)  # drops the lock


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fsync_dir(path: str) -> None:
    # The rename is durable only once the directory entry itself is synced.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- a record of what ran ----------------------------------------------------------------
_run_seed: list[int] = []  # set_seed's value, when a script gives one


def set_seed(seed: int) -> None:
    """Record the run's seed in ``run_record()`` (sidecars, ``done``)."""
    _run_seed[:] = [int(seed)]


def run_record() -> dict[str, Any]:
    """What ran: the spec's sha256, the image and its digest, the git commit and dirty flag
    (env the renderer gives the pod: DDPDEPLOY_SPEC_SHA256, DDPDEPLOY_IMAGE,
    DDPDEPLOY_IMAGE_DIGEST, DDPDEPLOY_GIT_COMMIT, DDPDEPLOY_GIT_DIRTY; None when unset),
    torch / CUDA / NCCL versions, world size, seed and the command line."""
    e = os.environ
    dirty = e.get("DDPDEPLOY_GIT_DIRTY")
    nccl = None
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):  # a CPU build has no NCCL to ask
            v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # unannotated
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return {
        "spec_sha256": e.get("DDPDEPLOY_SPEC_SHA256"),
        "image": e.get("DDPDEPLOY_IMAGE"),
        "image_digest": e.get("DDPDEPLOY_IMAGE_DIGEST"),
        "git_commit": e.get("DDPDEPLOY_GIT_COMMIT"),
        "git_dirty": None if dirty is None else dirty.lower() in ("1", "true", "yes"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "python": platform.python_version(),
        "world_size": world_size(),
        "seed": _run_seed[0] if _run_seed else None,
        "argv": list(sys.argv),
    }


# ---- diagnostics: shared parts -----------------------------------------------------------
EXIT_PROBE_FAILED = 3  # the probe's floor was not met; nothing trained
EXIT_HANG = 124  # the hang watchdog ended the run (as timeout(1) does)


_round_id: list[int] = []


def _join_round() -> None:
    """Agree on this group's diagnostics namespace in the store: rank 0 draws it, one
    broadcast gives it to all. Every rank calls this at the same point (the probe, or the
    first step_done). Not the restart count: under c10d it differs between nodes, and a
    store that outlives a restart must not show a new round the old round's keys."""
    if _round_id or not _distributed():
        return
    token = torch.tensor([int.from_bytes(os.urandom(7), "big")], dtype=torch.int64)
    token = token.to(_collective_device())
    dist.broadcast(token, src=0)
    _round_id.append(int(token.item()))


def _diag_key(name: str) -> str:
    return f"ddpkit/diag/{_round_id[0] if _round_id else 0:x}/{name}"


def _store() -> Any:
    """The default group's c10d store: the watchdog talks through it, not a collective,
    because a collective is what hangs."""
    return dist.distributed_c10d._get_default_store()


_published: list[bool] = []


def _publish_host() -> None:
    """Every rank puts its host in the store once, so rank 0 can name hosts."""
    if not _published and _distributed():
        _store().set(_diag_key(f"host/{rank()}"), socket.gethostname())
        _published.append(True)


_hosts_read: dict[tuple[str, int], list[str]] = {}


def _hosts() -> list[str]:
    """Every rank's host, read by rank 0 (each rank publishes before any collective that
    precedes a read, so the gets do not wait). Read once per round and world size: a
    store get is a round trip (~0.7 ms on a loaded VM), one per rank, and rank 0 paid them
    at every ranks event while the others waited for it in the next all-reduce."""
    if not _distributed():
        return [socket.gethostname()]
    key = (_diag_key("host"), world_size())
    if key not in _hosts_read:
        st = _store()
        _hosts_read[key] = [st.get(_diag_key(f"host/{r}")).decode() for r in range(key[1])]
    return list(_hosts_read[key])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _exit(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown with a live group (see ddptrain_dist.exit_now)


def finish(code: int = 0) -> NoReturn:
    """End the script, on every rank, in place of ``destroy_process_group()`` and a normal
    exit: the watchdog stands down, the group is destroyed, atexit handlers run (a logger's
    last flush, DataLoader workers' shutdown), and the process exits with ``code`` without
    the interpreter's teardown. In that teardown torch 2.13 with gloo frees DDP's reducer
    and its group and now and then aborts the process after the last step ("terminate
    called without an active exception", SIGABRT): a run that trained to the end, failed."""
    _Watchdog.disarm()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    atexit._run_exitfuncs()  # what the skipped teardown would have run first
    _exit(code)


# ---- the collective probe ----------------------------------------------------------------
PROBE_SIZES_MB = (1, 4, 16, 64)
PROBE_BUDGET_S = 1.0  # seconds for the sweep: 3 s made a 20-step smoke run 40 % longer
MIN_BUSBW_ENV = "DDPDEPLOY_PROBE_MIN_BUSBW"
_NCCL_DEBUG_NAME = "ddpkit-nccl.%h.%p.log"


def _route_nccl_debug() -> None:
    """NCCL's INIT/NET lines to a per-rank file, not the user's stderr; only when the user
    set no NCCL_DEBUG of their own. Before the group: NCCL reads these at its init."""
    e = os.environ
    if "NCCL_DEBUG" in e or "NCCL_DEBUG_FILE" in e:
        return
    folder = e.get(CHECKPOINT_DIR_ENV) or tempfile.gettempdir()
    e["NCCL_DEBUG"], e["NCCL_DEBUG_SUBSYS"] = "INFO", "INIT,NET"
    e["NCCL_DEBUG_FILE"] = os.path.join(folder, _NCCL_DEBUG_NAME)


def flight_recorder_env(env: Any, folder: str | None = None) -> None:
    """PyTorch's NCCL flight recorder on, dumped on a collective timeout into ``folder``
    (default: the checkpoint folder, else the temp folder) beside the hang stacks; both
    spellings (torch >= 2.6 TORCH_FR_*, older TORCH_NCCL_*). Only names not set already:
    a user's own values win. Before the group: torch reads them when it builds it."""
    folder = folder or env.get(CHECKPOINT_DIR_ENV) or tempfile.gettempdir()
    prefix = os.path.join(folder, "nccl_trace_rank_")  # torch appends the rank
    for name, value in (
        ("TORCH_FR_BUFFER_SIZE", "2000"),
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"),
        ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
        ("TORCH_FR_DUMP_TEMP_FILE", prefix),
        ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix),
    ):
        env.setdefault(name, value)


def _own_nccl_debug_text() -> str | None:
    pattern = os.environ.get("NCCL_DEBUG_FILE", "")
    if not pattern.endswith(_NCCL_DEBUG_NAME):
        return None  # not ours: NCCL_DEBUG is the user's
    # %h is NCCL's host name cut at the first dot; match by pid alone.
    found = glob.glob(pattern.replace("%h", "*").replace("%p", str(os.getpid())))
    if not found:
        return None
    with open(found[0], errors="replace") as f:
        return f.read()


def _transport() -> dict[str, Any]:
    if dist.get_backend() != "nccl":
        return {"transport": "tcp"}
    text = _own_nccl_debug_text()
    if text is None:
        return {"transport": "unknown", "why": "NCCL_DEBUG set by the user"}
    return nccl_transports(text)


def _timed_all_reduce(buf: torch.Tensor, iters: int) -> float:
    _sync(buf.device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _sync(buf.device)
    return time.perf_counter() - t0


def _probe(
    min_busbw: float | None = None,
    *,
    sizes_mb: tuple[int, ...] = PROBE_SIZES_MB,
    budget_s: float = PROBE_BUDGET_S,
) -> dict[str, Any] | None:
    """A short all-reduce sweep on every rank (call it on every rank, right after the
    group is up); rank 0 prints one ``probe`` event and returns it (others: None).

    Sizes from 1 MB up, each timed over as many iterations as fit the budget (the slowest
    rank decides, so every rank runs the same loop). Bus bandwidth is algbw x 2(n-1)/n,
    as nccl-tests reports it. ``min_busbw`` (GB/s; default $DDPDEPLOY_PROBE_MIN_BUSBW):
    when the best size stays below it, rank 0 says so in one line and every rank exits 3.
    """
    if not _distributed():
        return None
    if min_busbw is None and os.environ.get(MIN_BUSBW_ENV):
        min_busbw = _env_float(MIN_BUSBW_ENV, 0)
    _join_round()
    _publish_host()
    device, n, t_start = _collective_device(), world_size(), time.perf_counter()
    sizes: list[dict[str, Any]] = []
    per_rank = torch.zeros(n, dtype=torch.float64)
    for i, mb in enumerate(sizes_mb):
        buf = torch.zeros(mb * 2**20 // 4, dtype=torch.float32, device=device)
        first = _timed_all_reduce(buf, 1)  # warm-up: connects, allocates
        agreed = torch.tensor([first, time.perf_counter() - t_start], dtype=torch.float64)
        agreed = agreed.to(device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        first, elapsed = agreed.tolist()
        left = (budget_s - elapsed) / (len(sizes_mb) - i)
        if left <= first and sizes:
            break  # the budget is spent: the same decision on every rank
        iters = max(1, min(20, int(left / max(first, 1e-6))))
        mine = torch.tensor([_timed_all_reduce(buf, iters) / iters], dtype=torch.float64)
        everyone = [torch.zeros_like(mine).to(device) for _ in range(n)]
        dist.all_gather(everyone, mine.to(device))
        times = torch.cat([t.cpu() for t in everyone])
        per_rank += times
        algbw = buf.nelement() * 4 / float(times.max()) / 1e9
        sizes.append({
            "mb": mb, "iters": iters, "ms": round(float(times.max()) * 1e3, 3),
            "algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * 2 * (n - 1) / n, 3),
        })  # fmt: skip
        del buf
    transport = _transport()
    _store().set(_diag_key(f"transport/{rank()}"), json.dumps(transport))
    best = max(s["busbw_gbps"] for s in sizes)
    failed = min_busbw is not None and best < min_busbw
    event = None
    if rank() == 0:
        event = _probe_event(sizes, per_rank, best, min_busbw, time.perf_counter() - t_start)
        emit(event)
        if failed:
            print(
                f"ddpkit: error: probe: bus bandwidth {best} GB/s is below the floor "
                f"{min_busbw} GB/s (--probe-min-busbw / {MIN_BUSBW_ENV}); slowest rank "
                f"{event['slowest']['rank']} on {event['slowest']['host']}, transport "
                f"{event['transport']}",
                file=sys.stderr,
                flush=True,
            )
    if failed:
        dist.barrier()  # rank 0's line is out before any rank leaves
        _exit(EXIT_PROBE_FAILED)
    return event


probe = _probe  # the public name; init_process_group's ``probe=`` flag shadows it there


def _probe_event(
    sizes: list[dict[str, Any]],
    per_rank: torch.Tensor,
    best: float,
    floor: float | None,
    seconds: float,
) -> dict[str, Any]:
    n, hosts = world_size(), _hosts()
    st = _store()
    transports = [json.loads(st.get(_diag_key(f"transport/{r}"))) for r in range(n)]
    by_kind: dict[str, list[int]] = {}
    for r, t in enumerate(transports):
        by_kind.setdefault(t.get("transport", "unknown"), []).append(r)
    slowest = int(per_rank.argmax())
    warnings = []
    if os.environ.get("DDPDEPLOY_RDMA", "").lower() in ("1", "true", "yes"):
        for r, t in enumerate(transports):  # one warning per host is enough
            w = rdma_fallback_warning(hosts[r], t)
            if w and w not in warnings:
                warnings.append(w)
    kinds = sorted(by_kind, key=lambda k: -len(by_kind[k]))
    return {
        "event": "probe", "world_size": n, "backend": dist.get_backend(),
        "transport": kinds[0] if len(kinds) == 1 else "mixed",
        "transports": {k: by_kind[k] for k in kinds}, "busbw_gbps": best,
        "min_busbw_gbps": floor, "ok": floor is None or best >= floor, "sizes": sizes,
        "slowest": {"rank": slowest, "host": hosts[slowest]},
        "seconds": round(seconds, 3), "warnings": warnings,
    }  # fmt: skip


# ---- which transport NCCL chose, from its own debug text (NCCL_DEBUG=INFO, INIT,NET) -------
# ``nccl_transports(text)`` takes what one rank's NCCL wrote to its NCCL_DEBUG_FILE and says
# which network it picked between nodes (``IB``, ``RoCE``, ``Socket``) and which paths its
# channels use within and between nodes (``P2P/IPC``, ``SHM``, ``NET/IB``, ...). Pure: the
# lines it reads, as NCCL 2.4 to 2.28 print them:
#
#   NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>  devices, link layer
#   NET/IB : No device found.                                             no RDMA device
#   NET/Socket : Using [0]eth0:10.0.0.1<0>                                socket interfaces
#   Using network IB | Using network Socket                               the network chosen
#   Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA                one channel's path
_NCCL_USING_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
_NCCL_IB_USING = re.compile(r"NCCL INFO NET/IB : Using (.*?)(?:;|$)")
_NCCL_IB_DEVICE = re.compile(r"\[\d+\]([\w.-]+):\d+/(IB|RoCE)", re.ASCII)
_NCCL_IB_NONE = re.compile(r"NCCL INFO NET/IB : No device found")
_NCCL_SOCKET_USING = re.compile(r"NCCL INFO NET/Socket : Using (.*)$")
_NCCL_VIA = re.compile(r"NCCL INFO (?:Channel|Ring) .* via (\S+(?: pointer| memory)?)")
_NCCL_VERSION = re.compile(r"NCCL version (\S+)")


def _nccl_path_kind(via: str) -> str:
    """'NET/IB/0/GDRDMA' -> 'NET/IB'; 'P2P/IPC/read' -> 'P2P/IPC'; old 'direct shared
    memory' -> 'SHM'; 'P2P/direct pointer' -> 'P2P/direct'."""
    if via.startswith("direct shared"):
        return "SHM"
    parts = via.split(" ")[0].split("/")
    return "/".join(parts[:2]) if parts[0] in ("NET", "P2P") else parts[0]


def nccl_transports(text: str) -> dict[str, Any]:
    """What NCCL's debug text says about its transports.

    Returns ``net`` (the network between nodes: IB, RoCE, Socket or None when the text
    does not say), ``paths`` (the channel paths seen, sorted), ``devices`` (RDMA devices
    with their link layer), ``no_rdma_device`` (NCCL looked and found none), ``version``
    and ``transport``: the one word a report shows, the network when a channel crosses
    nodes (or NCCL named it), else the fastest path within the node.
    """
    net: str | None = None
    devices: list[str] = []
    layers: set[str] = set()
    paths: set[str] = set()
    no_rdma = socket_seen = False
    version = None
    for line in text.splitlines():
        if m := _NCCL_USING_NETWORK.search(line):
            net = m.group(1)
        elif m := _NCCL_IB_USING.search(line):
            for dev, layer in _NCCL_IB_DEVICE.findall(m.group(1)):
                devices.append(f"{dev}/{layer}")
                layers.add(layer)
        elif _NCCL_IB_NONE.search(line):
            no_rdma = True
        elif _NCCL_SOCKET_USING.search(line):
            socket_seen = True
        elif m := _NCCL_VIA.search(line):
            paths.add(_nccl_path_kind(m.group(1)))
        elif (m := _NCCL_VERSION.search(line)) and version is None:
            version = m.group(1)
    if "NET/IB" in paths:
        net = "IB"
    elif "NET/Socket" in paths:
        net = "Socket"
    elif net is None and layers:
        net = "IB"
    elif net is None and (no_rdma or socket_seen):
        net = "Socket"
    if net == "IB" and layers == {"RoCE"}:
        net = "RoCE"  # NCCL's IB transport over Ethernet ports
    return {
        "net": net,
        "transport": _nccl_summary(net, paths),
        "paths": sorted(paths),
        "devices": devices,
        "no_rdma_device": no_rdma,
        "version": version,
    }


def _nccl_summary(net: str | None, paths: set[str]) -> str:
    crosses_nodes = any(p.startswith("NET/") for p in paths)
    if crosses_nodes or (net is not None and not paths):
        return net or "unknown"
    for fast in ("NVLS", "P2P/IPC", "P2P/CUMEM", "P2P/direct", "P2P", "SHM"):
        if any(p == fast or p.startswith(fast + "/") for p in paths):
            return fast.split("/")[0]
    return next(iter(sorted(paths)), "unknown")


def rdma_fallback_warning(host: str, result: dict[str, Any]) -> str | None:
    """The warning for a job that asked for RDMA whose NCCL chose sockets, or None."""
    if result.get("net") != "Socket":
        return None
    why = (
        "NCCL found no RDMA device (no RDMA resource in the pod, or the device plugin "
        "did not mount it)"
        if result.get("no_rdma_device")
        else "no usable RDMA device: no IPC_LOCK capability (memory cannot be pinned), "
        "NCCL_IB_HCA not matching the devices, or NCCL_IB_DISABLE/NCCL_NET set"
    )
    return f"RDMA was asked for but NCCL on {host} chose TCP sockets (4-5x slower): {why}"


# ---- stragglers: per-rank work time ------------------------------------------------------
RANKS_EVERY_ENV = "DDPDEPLOY_RANKS_EVERY"
STRAGGLER_FACTOR_ENV = "DDPDEPLOY_STRAGGLER_FACTOR"
HANG_TIMEOUT_ENV = "DDPDEPLOY_HANG_TIMEOUT_S"
STRAGGLER_MIN_GAP_S = 0.005  # below 5 ms a step the gap is scheduler noise, not a straggler
# Unset --ranks-every: the first window is RANKS_FIRST steps, then about RANKS_AUTO_S of
# wall time (never fewer than RANKS_FIRST steps). A gather costs about a millisecond, which
# was 0.7 % of a 2 ms step every 50 steps; at one per ~10 s it is lost in the noise.
RANKS_FIRST, RANKS_AUTO_S, RANKS_MAX = 50, 10.0, 100_000


class _Timing:
    """This rank's clock: seconds per phase in the current step and summed over the
    window; the last completed step, and the phase running now (for the watchdog)."""

    def __init__(self) -> None:
        self.step_phase: dict[str, float] = {}
        self.window: dict[str, float] = {}
        self.window_steps, self.window_wall, self.window_walls = 0, 0.0, 0
        self.last_t: float | None = None
        self.step: int | None = None
        self.slowest_step = 0.0
        self.phase: str | None = None
        self.phase_step: int | None = None
        self.by_step_done = False
        every = _env_int(RANKS_EVERY_ENV, -1)  # unset: -1, automatic; 0: no ranks events
        self.every = RANKS_FIRST if every < 0 else every
        self.auto_every = every < 0  # the window follows the step time, see next_every()
        self.factor = _env_float(STRAGGLER_FACTOR_ENV, 1.2)
        self.hang_timeout_s = _env_float(HANG_TIMEOUT_ENV, 0, low=-math.inf)  # 0: auto
        self.hang_dir: str | None = None


_timing = _Timing()


def diagnostics(
    *,
    ranks_every: int | None = None,
    straggler_factor: float | None = None,
    hang_timeout_s: float | None = None,
    hang_dir: str | None = None,
) -> None:
    """Settings of ``step_done``'s ``ranks`` event (every N steps; straggler factor) and
    of the hang watchdog (seconds without a step: 0 auto, max(60, 5x the slowest step),
    at most 30 min; negative: off; stacks to ``hang_dir``, default the checkpoint folder
    or the temp folder). Env defaults: DDPDEPLOY_RANKS_EVERY (unset: 50 steps, then about
    every 10 s),
    DDPDEPLOY_STRAGGLER_FACTOR (1.2), DDPDEPLOY_HANG_TIMEOUT_S (0)."""
    t = _timing
    if ranks_every is not None:
        t.every, t.auto_every = ranks_every, False
    t.factor = straggler_factor if straggler_factor is not None else t.factor
    t.hang_timeout_s = hang_timeout_s if hang_timeout_s is not None else t.hang_timeout_s
    t.hang_dir = hang_dir or t.hang_dir


@contextlib.contextmanager
def timed(phase: str) -> Iterator[None]:
    """Time a part of the step that is this rank's own work (``"data"``, ``"forward"``),
    not waiting on peers: the ``ranks`` event compares ranks by the sum of these. Under
    nccl the time is the host's (kernels run async); time what the host waits for."""
    t = _timing
    t.phase, t.phase_step = phase, (t.step or 0) + 1
    t0 = time.perf_counter()
    try:
        yield
    finally:
        t.step_phase[phase] = t.step_phase.get(phase, 0.0) + time.perf_counter() - t0
        t.phase = None


def timed_iter(iterable: Any, phase: str = "data") -> Iterator[Any]:
    """``iterable``'s items, each ``next()`` timed as ``phase`` (a DataLoader: loading)."""
    it = iter(iterable)
    while True:
        with timed(phase):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item


def step_done(step: int) -> None:
    """Call on every rank after each optimizer step: closes the step's timing, arms the
    hang watchdog, and every N steps gathers the ranks' means (one small all_gather) for
    rank 0's ``ranks`` event."""
    t, now = _timing, time.perf_counter()
    t.by_step_done = True  # log("step") leaves the timing to this from now on
    if t.last_t is not None:
        wall = now - t.last_t
        t.slowest_step, t.window_wall = max(t.slowest_step, wall), t.window_wall + wall
        t.window_walls += 1
    t.last_t, t.step = now, int(step)
    for k, v in t.step_phase.items():
        t.window[k] = t.window.get(k, 0.0) + v
    t.step_phase.clear()
    t.window_steps += 1
    _on_step(step, True)  # smoke --kill-at STEP's hold, installed only when asked
    _join_round()  # once, on every rank at its first step (a no-op after the probe)
    _Watchdog.arm()
    if t.every > 0 and t.window_steps >= t.every:
        report_ranks()


def end_steps() -> dict[str, Any] | None:
    """After the last step, on every rank: the last window's ``ranks`` event, and the
    watchdog stands down (what follows, a final save, is no step)."""
    _Watchdog.disarm()
    return report_ranks()


def report_ranks() -> dict[str, Any] | None:
    """Gather every rank's window means now (every rank calls it at the same step) and
    print rank 0's ``ranks`` event; returns it on rank 0. No-op on an empty window."""
    t = _timing
    k = t.window_steps
    if k == 0 or not _distributed():
        return None
    _publish_host()
    work = sum(t.window.values()) / k
    mine = [t.window.get("data", 0.0) / k, t.window.get("forward", 0.0) / k, work,
            t.window_wall / max(t.window_walls, 1)]  # fmt: skip
    device, n = _collective_device(), world_size()
    t0 = time.perf_counter()
    local = torch.tensor(mine, dtype=torch.float64, device=device)
    everyone = [torch.empty_like(local) for _ in range(n)]
    dist.all_gather(everyone, local)
    rows = [e.tolist() for e in everyone]
    cost = time.perf_counter() - t0
    if t.auto_every:  # the same rows on every rank, so the same next window everywhere
        t.every = next_every(max(r[3] for r in rows))
    t.window.clear()
    t.window_steps, t.window_wall, t.window_walls = 0, 0.0, 0
    if rank() != 0:
        return None
    event = _ranks_event(rows, t.step, k, t.factor, cost)
    emit(event)
    return event


def next_every(step_s: float) -> int:
    """The auto window after a gather: about RANKS_AUTO_S of steps of ``step_s`` seconds."""
    if step_s <= 0:
        return RANKS_FIRST
    return max(RANKS_FIRST, min(RANKS_MAX, round(RANKS_AUTO_S / step_s)))


def _ranks_event(
    rows: list[list[float]], step: int | None, k: int, factor: float, cost: float
) -> dict[str, Any]:
    hosts = _hosts()
    work = [r[2] for r in rows]
    median = statistics.median(work)
    order = sorted(range(len(rows)), key=work.__getitem__)

    def who(r: int) -> dict[str, Any]:
        data, forward, w, _ = rows[r]
        return {"rank": r, "host": hosts[r], "work_s": round(w, 6),
                "data_s": round(data, 6), "forward_s": round(forward, 6)}  # fmt: skip

    stragglers = [
        dict(who(r), x_median=round(work[r] / median, 2) if median else None)
        for r in order[::-1]
        if work[r] > median * factor and work[r] - median > STRAGGLER_MIN_GAP_S
    ]
    step_s = max(r[3] for r in rows)
    return {
        "event": "ranks", "step": step, "steps": k, "median_work_s": round(median, 6),
        "step_s": round(step_s, 6), "slowest": who(order[-1]), "fastest": who(order[0]),
        "factor": factor, "stragglers": stragglers, "gather_ms": round(cost * 1e3, 3),
        "cost_pct": round(100 * cost / (k * step_s), 3) if step_s else None,
    }  # fmt: skip


def _first_of(names: list[str], most: int = 16) -> str:
    """``names`` for one line: the first ``most``, then how many more (a job of thousands
    of ranks names them all in its event, not on the console)."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


# ---- the hang watchdog -------------------------------------------------------------------
class _Watchdog(threading.Thread):
    """One daemon thread per rank, started by the first ``step_done``.

    Every second it publishes this rank's progress (last step, phase now) in the store and
    looks for another rank's hang flag. When no step completed for the timeout, or another
    rank flagged a hang, it writes this rank's Python stacks (all threads) to
    ``hang-rank<R>.txt`` and flags the hang; rank 0 waits (bounded) for every rank's
    stacks, prints the ``hang`` event naming the ranks that did not reach the next step,
    and every rank exits 124.
    """

    _running: _Watchdog | None = None
    POLL_S = 1.0
    AUTO_MIN_S, AUTO_MAX_S, AUTO_FACTOR = 60.0, 1800.0, 5.0
    LOGGED_MIN_S = 300.0  # the floor when only log("step") arms it

    @classmethod
    def arm(cls) -> None:
        if cls._running is None and _distributed() and _timing.hang_timeout_s >= 0:
            cls._running = cls()
            cls._running.start()

    @classmethod
    def disarm(cls) -> None:
        """Stop and join the thread: a store call of its own still running when the script
        destroys the process group (and with it the store) aborts the process."""
        running = cls._running  # kept: a stopped watchdog is not armed again
        if running is not None:
            running.stopped.set()
            if running is not threading.current_thread():
                running.join(timeout=cls.POLL_S + 30.0)

    def __init__(self) -> None:
        super().__init__(name="ddpkit-watchdog", daemon=True)
        self.stopped = threading.Event()
        self.rank, self.n, self.store = rank(), world_size(), _store()
        folder = _timing.hang_dir or os.environ.get(CHECKPOINT_DIR_ENV)
        self.folder = folder or tempfile.gettempdir()
        self._published: tuple[Any, ...] = ()

    def timeout(self) -> float:
        t = _timing
        if t.hang_timeout_s > 0:
            return t.hang_timeout_s
        # Armed by log("step") alone, the clock also runs through what a script does
        # between its step lines and times nothing of (an evaluation, a slow first batch):
        # a later floor, so that is not called a hang.
        floor = self.AUTO_MIN_S if t.by_step_done else self.LOGGED_MIN_S
        return min(self.AUTO_MAX_S, max(floor, self.AUTO_FACTOR * t.slowest_step))

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.POLL_S):
                self._publish()
                idle = time.perf_counter() - (_timing.last_t or time.perf_counter())
                flagged = self.store.check([_diag_key("hang")])
                if flagged or idle > self.timeout():
                    self._on_hang(idle, flagged)
        except Exception as e:  # the store went away: the run is ending anyway
            if not self.stopped.is_set():
                warn(f"hang watchdog stopped: {type(e).__name__}: {e}")

    def _progress(self) -> dict[str, Any]:
        t = _timing
        return {"step": t.step, "phase": t.phase, "host": socket.gethostname()}

    def _publish(self) -> None:
        now = tuple(self._progress().values())
        if now != self._published:
            self.store.set(_diag_key(f"progress/{self.rank}"), json.dumps(self._progress()))
            self._published = now

    def _on_hang(self, idle: float, flagged: bool) -> None:
        st, me = self.store, self.rank
        _hold_errors_while_exiting()
        if not flagged:
            st.set(_diag_key("hang"), json.dumps({"by": me, "idle_s": round(idle, 1)}))
        self._publish()
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"hang-rank{me}.txt")
        with open(path, "w") as f:
            f.write(f"# ddpkit hang watchdog: rank {me} on {socket.gethostname()}, pid "
                    f"{os.getpid()}, last step {_timing.step}, idle {idle:.1f} s\n")  # fmt: skip
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        st.set(_diag_key(f"stacks/{me}"), path)
        if me == 0:
            self._report(idle)
        else:
            self._wait_for(["reported"], 30.0)
            st.set(_diag_key(f"leaving/{me}"), "1")
        _exit(EXIT_HANG)

    def _wait_for(self, names: list[str], timeout: float) -> list[str]:
        """The names whose keys appeared within ``timeout``."""
        deadline = time.monotonic() + timeout
        keys = [_diag_key(x) for x in names]
        while not self.store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.02)  # short: the exits of all ranks should land close together
        return [x for x, k in zip(names, keys, strict=True) if self.store.check([k])]

    def _report(self, idle: float) -> None:
        st, n = self.store, self.n
        dumped = self._wait_for([f"stacks/{r}" for r in range(n)], 20.0)
        stacks = [st.get(_diag_key(x)).decode() for x in dumped]
        progress = {}
        for r in range(n):
            if st.check([_diag_key(f"progress/{r}")]):
                progress[r] = json.loads(st.get(_diag_key(f"progress/{r}")))
        steps = [p["step"] or 0 for p in progress.values()]
        top = max(steps, default=0)
        behind = sorted(
            r for r in range(n)
            if r not in progress or (progress[r]["step"] or 0) < top
            or progress[r]["phase"] is not None
        )  # fmt: skip
        hosts = {r: progress[r]["host"] for r in behind if r in progress}
        phases = {r: progress[r]["phase"] for r in behind if r in progress}
        event = {
            "event": "hang", "step": top + 1, "idle_s": round(idle, 1),
            "timeout_s": round(self.timeout(), 1), "ranks": behind,
            "hosts": {str(r): h for r, h in hosts.items()},
            "phases": {str(r): p for r, p in phases.items()}, "stacks": stacks,
            "missing_stacks": [r for r in range(n) if f"stacks/{r}" not in dumped],
            "dir": self.folder,
        }  # fmt: skip
        emit(event)
        # No rank behind: each finished step top and is outside a timed phase, which says
        # nothing of where it waits (a collective, or its own code): the stacks say.
        named = _first_of([f"{r} ({hosts.get(r, '?')})" for r in behind]) or (
            f"none named (every rank finished step {top}; where each waits is in its stacks)"
        )
        print(
            f"ddpkit: error: hang: no step completed for {idle:.0f} s; ranks that did not "
            f"reach step {top + 1}: {named}; stacks in {self.folder}",
            file=sys.stderr,
            flush=True,
        )
        st.set(_diag_key("reported"), "1")
        self._wait_for([f"leaving/{r}" for r in range(1, n)], 5.0)


def _hold_errors_while_exiting() -> None:
    """Once the watchdog handles a hang, peers leave and this rank's main thread gets
    "connection closed" from its collective: hold that error (the hook waits) so the run
    ends with the watchdog's exit 124 and its line, not a traceback and exit 1."""
    before = sys.excepthook

    def hold(*exc: Any) -> None:
        time.sleep(60)  # the watchdog's os._exit comes first; then it was no hang exit
        before(*exc)

    sys.excepthook = hold
