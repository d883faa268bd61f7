#!/usr/bin/env python3
"""ddptrain: the in-container PyTorch DDP trainer of ddpdeploy.

Run it by path under torchrun, one process per GPU (or per CPU slot with gloo):

    torchrun --nproc-per-node 2 train/ddptrain.py --steps 20 --checkpoint-dir /ckpt

Running by path puts this directory first on sys.path, so a user's own ``train.py`` in the
working directory cannot shadow it; the working directory is appended last so that
``--model pkg.mod:factory`` and ``--dataset pkg.mod:factory`` resolve from it.

It reads torchrun's environment only (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*). Global rank 0 prints JSON lines on stdout; see
train/README.md for the schema and the exit codes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import importlib
import json
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

# Working directory last: user factories resolve from it, but never shadow our modules.
if os.getcwd() not in sys.path:
    sys.path.append(os.getcwd())

import ddptrain_ckpt  # noqa: E402
import ddptrain_model  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

try:  # numpy is optional; seeded and checkpointed only when present
    import numpy as np
except ImportError:  # pragma: no cover - depends on the image
    np = None  # type: ignore[assignment]

EXIT_OK = 0
EXIT_BAD_ARGS = 2
EXIT_PREEMPTED = 143  # 128 + SIGTERM, returned only after the SIGTERM checkpoint is durable

STOP_CHECK_S = 0.25  # auto cadence of the SIGTERM agreement (--stop-check-every 0)

_print_lock = threading.Lock()


# ---- arguments ---------------------------------------------------------------------------
class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; the CLI wants exactly one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        bad_args(message)


def bad_args(message: str) -> NoReturn:
    print(f"ddptrain: error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_ARGS)


def _positive(v: str) -> int:
    n = int(v)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return n


def _non_negative(v: str) -> int:
    n = int(v)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return n


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _OneLineParser(prog="ddptrain.py", description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--steps", type=_positive, help="total optimizer steps (default: --epochs worth)")
    a("--epochs", type=_positive, help="epochs (default 1 when --steps is not given)")
    a("--batch-size", type=_positive, default=32, help="per-rank micro-batch size")
    a("--lr", type=float, default=0.05)
    a("--optimizer", choices=["sgd", "adamw"], default="sgd")
    a("--momentum", type=float, default=0.9, help="SGD momentum")
    a("--weight-decay", type=float, default=0.0)
    a("--warmup-steps", type=_non_negative, default=0, help="linear LR warmup steps")
    a("--seed", type=int, default=0, help="rank r is seeded with seed + r")
    a("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    a("--bucket-cap-mb", type=float, default=25.0)
    a("--static-graph", action="store_true")
    a("--find-unused-parameters", action="store_true")
    a("--grad-accum", type=_positive, default=1, help="micro-steps per optimizer step")
    a("--sync-bn", action="store_true", help="synchronise BatchNorm statistics across ranks")
    a("--bn", action="store_true", help="built-in MLP: add a BatchNorm1d layer")
    a("--amp", action="store_true", help="bf16 autocast (GPU only; ignored with a warning)")
    a("--clip-grad", type=float, default=0.0, help="max grad norm (0: off)")
    a("--model", help="pkg.mod:factory returning an nn.Module (default: built-in MLP)")
    a("--dataset", help="pkg.mod:factory returning a map-style Dataset of (input, target)")
    a("--loss", choices=["cross_entropy", "mse"], default="cross_entropy")
    a("--num-workers", type=_non_negative, default=0, help="DataLoader workers per rank")
    a("--no-drop-last", action="store_true", help="DistributedSampler pads instead of drops")
    a("--checkpoint-dir", help="directory shared by all nodes; resume from it on start")
    a("--checkpoint-every", type=_non_negative, default=0, help="steps between checkpoints")
    a("--keep", type=_positive, default=3, help="checkpoints to keep")
    a("--save-final", help="rank 0 writes ddp.module.state_dict() here at the end")
    a("--log-every", type=_positive, default=1)
    a("--stop-check-every", type=_non_negative, default=0,
      help="steps between the all-reduces that agree on a SIGTERM stop (0: auto, about "
           "every 0.25 s)")
    a("--timeout-s", type=_positive, default=300, help="collective / store timeout")
    # Test and teaching hooks; documented in train/README.md.
    a("--debug-dump", help="every rank writes rank<R>.pt with per-rank state here")
    a("--debug-desync-opt", action="store_true",
      help="ranks != 0 use 2x lr: shows DDP does not sync optimizer state/hyperparameters")
    a("--debug-step-delay", type=float, default=0.0, help="sleep seconds per step")
    a("--debug-slow-save", type=float, default=0.0, help="writer sleeps mid-write")
    args = p.parse_args(argv)
    if args.checkpoint_every and not args.checkpoint_dir:
        bad_args("--checkpoint-every needs --checkpoint-dir")
    for flag in ("model", "dataset"):
        spec = getattr(args, flag)
        if spec is not None and (spec.count(":") != 1 or not all(spec.split(":"))):
            bad_args(f"--{flag} must look like pkg.mod:factory, got {spec!r}")
    if args.backend == "nccl" and not torch.cuda.is_available():
        bad_args("--backend nccl needs CUDA, which is not available here")
    return args


def load_factory(flag: str, spec: str) -> Callable[[], Any]:
    mod_name, fn_name = spec.split(":")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        bad_args(f"--{flag} {spec}: {type(e).__name__}: {e}")
    if not callable(fn):
        bad_args(f"--{flag} {spec}: not callable")
    return fn


# ---- process group -----------------------------------------------------------------------
@dataclass
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    restart_count: int
    host: str


def read_env() -> DistEnv:
    e = os.environ
    return DistEnv(
        rank=int(e.get("RANK", 0)),
        local_rank=int(e.get("LOCAL_RANK", 0)),
        world_size=int(e.get("WORLD_SIZE", 1)),
        local_world_size=int(e.get("LOCAL_WORLD_SIZE", 1)),
        group_rank=int(e.get("GROUP_RANK", 0)),
        restart_count=int(e.get("TORCHELASTIC_RESTART_COUNT", 0)),
        host=socket.gethostname(),
    )


def init_distributed(backend: str, env: DistEnv, timeout: timedelta) -> None:
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
    if "MASTER_ADDR" not in e:  # plain `python ddptrain.py`: a world of one
        store: dist.Store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
        return
    if e.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        base = dist.TCPStore(
            e["MASTER_ADDR"], int(e["MASTER_PORT"]), env.world_size,
            is_master=False, timeout=timeout,
        )
        store = dist.PrefixStore(f"ddptrain/restart-{env.restart_count}/", base)
        dist.init_process_group(
            backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout
        )
        return
    dist.init_process_group(
        backend, init_method="env://", rank=env.rank, world_size=env.world_size,
        timeout=timeout,
    )


# ---- determinism -------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
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


def state_sha256(module: nn.Module) -> str:
    """sha256 over key names and raw bytes of every state_dict tensor, in key order."""
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        h.update(k.encode())
        t = v.detach().cpu().contiguous().clone()  # clone: storage is exactly the tensor
        # ctypes reads the raw bytes at C speed without needing numpy.
        if t.nbytes:
            h.update(ctypes.string_at(t.data_ptr(), t.nbytes))
    return h.hexdigest()


# ---- logging -----------------------------------------------------------------------------
class Logger:
    """JSON lines on stdout from global rank 0 only; everything else goes to stderr."""

    def __init__(self, rank: int) -> None:
        self.enabled = rank == 0

    def __call__(self, event: dict[str, Any]) -> None:
        if self.enabled:
            with _print_lock:  # the checkpoint writer thread logs too
                print(json.dumps(event), flush=True)


def warn(msg: str) -> None:
    print(f"ddptrain: warning: {msg}", file=sys.stderr, flush=True)


# ---- data --------------------------------------------------------------------------------
def batches(
    dataset: Dataset, indices: list[int], batch_size: int, num_workers: int
) -> Iterator[tuple[Any, Any]]:
    # A plain list of this rank's indices (the DistributedSampler's order, minus the part
    # already consumed before a resume) is a valid sampler and keeps resume exact.
    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=indices, drop_last=True,
        num_workers=num_workers,
    )
    return iter(loader)


def compute_loss(kind: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if kind == "cross_entropy":
        return F.cross_entropy(out, target)
    if not target.is_floating_point() and out.dim() == 2:
        # Class labels with mse: regress the one-hot encoding.
        target = F.one_hot(target, out.shape[1]).to(out.dtype)
    return F.mse_loss(out, target.to(out.dtype))


def warm_up_buckets(
    ddp: DDP, x: torch.Tensor, y: torch.Tensor, loss_kind: str, amp: Any
) -> None:
    """One synced forward/backward that changes no state, run before the first real step.

    DDP all-reduces the first iteration with one bucket in parameter order and then rebuilds
    the buckets in gradient-ready order. With 3+ ranks the summation order of an element
    depends on its offset in the bucket, so a run resumed mid-way (whose first step uses the
    initial layout) would drift by rounding from an uninterrupted one (which used the rebuilt
    layout there). Rebuilding before any real step, in every run, makes resume bit-exact.
    """
    rng = get_rng_state()
    buffers = [b.detach().clone() for b in ddp.module.buffers()]
    with amp:
        loss = compute_loss(loss_kind, ddp(x), y)
    loss.backward()
    with torch.no_grad():
        for b, v in zip(ddp.module.buffers(), buffers, strict=True):
            b.copy_(v)
        for p in ddp.parameters():
            p.grad = None
    set_rng_state(rng)


# ---- the trainer -------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    env = read_env()
    log = Logger(env.rank)
    model_fn = load_factory("model", args.model) if args.model else None
    data_fn = load_factory("dataset", args.dataset) if args.dataset else None

    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank)  # before the process group binds a device
        device = torch.device("cuda", env.local_rank)
    else:
        device = torch.device("cpu")
    init_distributed(backend, env, timedelta(seconds=args.timeout_s))
    if env.rank == 0 and int(os.environ.get("GROUP_WORLD_SIZE", 1)) > 1 and (
        os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0
    ):
        warn("several nodes share the agent store: worker restarts under c10d rendezvous "
             "need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every torchrun agent's env")

    # Different seed per rank: per-rank randomness (dropout, augmentation) should differ;
    # the model still starts identical everywhere because DDP broadcasts rank 0's weights.
    seed_everything(args.seed + env.rank)
    dump: dict[str, Any] = {}

    model: nn.Module = model_fn() if model_fn else ddptrain_model.build_mlp(batch_norm=args.bn)
    if args.sync_bn:
        if device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # before DDP wraps it
        else:
            # torch's SyncBatchNorm refuses CPU modules; use our gloo path on its own group
            # so its collectives never interleave with DDP's gradient buckets.
            bn_group = dist.new_group(backend="gloo")
            model = ddptrain_model.convert_cpu_sync_bn(model, bn_group)
    model.to(device)
    if args.debug_dump:
        dump["pre_wrap_sha"] = state_sha256(model)
    ddp = DDP(
        model,
        device_ids=[env.local_rank] if device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_cap_mb,
        static_graph=args.static_graph,
        find_unused_parameters=args.find_unused_parameters,
    )
    if args.debug_dump:
        dump["post_wrap_sha"] = state_sha256(ddp.module)

    dataset: Dataset = data_fn() if data_fn else ddptrain_model.SyntheticClassification()
    sampler = DistributedSampler(
        dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed,
        drop_last=not args.no_drop_last,
    )
    micro_per_epoch = len(sampler) // args.batch_size
    steps_per_epoch = micro_per_epoch // args.grad_accum
    if steps_per_epoch == 0:
        bad_args(f"--batch-size {args.batch_size} x --grad-accum {args.grad_accum} exceeds "
                 f"the {len(sampler)} samples each rank gets per epoch")
    lr = args.lr * (2.0 if args.debug_desync_opt and env.rank != 0 else 1.0)
    params = [p for p in ddp.parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(
            params, lr=lr, momentum=args.momentum, weight_decay=args.weight_decay
        )
    else:
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=args.weight_decay)
    warmup = args.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
    )

    # ---- resume --------------------------------------------------------------------------
    step, epoch, pos = 0, 0, 0  # pos: optimizer steps already done inside `epoch`
    ckpt: ddptrain_ckpt.CheckpointManager | None = None
    resumed_from: str | None = None
    if args.checkpoint_dir:
        ckpt = ddptrain_ckpt.CheckpointManager(
            args.checkpoint_dir, args.keep, log, debug_slow_save=args.debug_slow_save
        )
        if env.rank == 0:
            ckpt.remove_stale_temp_files()
        cands: list[Any] = [ckpt.list_steps() if env.rank == 0 else None]
        dist.broadcast_object_list(cands, src=0)
        for cand in cands[0]:
            data = ckpt.read_verified(cand)
            ok = torch.tensor([1 if data is not None else 0], device=device)  # nccl: on GPU
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # every rank must be able to read it
            if not ok.item():
                if env.rank == 0:
                    warn(f"skipping checkpoint step {cand}: not verified on every rank")
                continue
            assert data is not None
            state = ddptrain_ckpt.load_payload(data, device)
            same_layout = (
                state["world_size"] == env.world_size
                and state["batch_size"] == args.batch_size
                and state["grad_accum"] == args.grad_accum
            )
            if not same_layout and state["pos"] != 0:
                bad_args(
                    f"checkpoint {ckpt.payload_path(cand)} was written mid-epoch with world "
                    f"size {state['world_size']}, batch size {state['batch_size']}, grad "
                    f"accum {state['grad_accum']}; resume it with the same values (now "
                    f"{env.world_size}, {args.batch_size}, {args.grad_accum})"
                )
            ddp.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            step, epoch, pos = state["step"], state["epoch"], state["pos"]
            if state["world_size"] == env.world_size:
                set_rng_state(state["rng"][env.rank])
            else:  # new layout at an epoch boundary: fresh, still per-rank, RNG streams
                seed_everything(args.seed + env.rank + 1_000_003 * step)
            resumed_from = ckpt.payload_path(cand)
            break

    # Epoch-based ends count the remaining epochs in the current layout, which after a
    # world-size change at an epoch boundary has a different number of steps per epoch.
    epochs_end = step + ((args.epochs or 1) - epoch) * steps_per_epoch - pos
    if args.steps:
        total_steps = min(args.steps, epochs_end) if args.epochs else args.steps
    else:
        total_steps = epochs_end

    log({
        "event": "start", "world_size": env.world_size, "backend": backend,
        "device": device.type, "host": env.host, "restart_count": env.restart_count,
        "total_steps": total_steps, "resumed": resumed_from is not None,
        "resume_path": resumed_from, "resume_step": step,
    })

    buffer_names = {n for n, _ in ddp.module.named_buffers()}
    # Checkpoint RNG gathers run in background threads on their own (gloo, CPU) group.
    ckpt_group = dist.new_group(backend="gloo") if ckpt is not None else None

    def save(at_step: int, at_epoch: int, at_pos: int) -> float:
        """Collective (in the background): every rank's RNG state goes to rank 0, which
        snapshots the state and writes it asynchronously. Returns the seconds it blocked.
        """
        assert ckpt is not None
        t0 = time.perf_counter()
        rng = get_rng_state()  # this step boundary's state; shipped to rank 0 in background
        if env.rank != 0:
            ckpt.send_rng_async(rng, ckpt_group)
            return time.perf_counter() - t0
        model_sd = ddp.module.state_dict()
        # Buffers (BN stats) change in the next forward: copy now. Parameters and optimizer
        # state change only in the next optimizer.step(): the writer thread copies them
        # while the next forward/backward runs (None keeps each key's place in the order).
        now = {
            "model": {k: (v if k in buffer_names else None) for k, v in model_sd.items()},
            "scheduler": scheduler.state_dict(), "step": at_step, "epoch": at_epoch,
            "pos": at_pos, "world_size": env.world_size, "batch_size": args.batch_size,
            "grad_accum": args.grad_accum,
        }
        deferred = {
            "model": {k: v for k, v in model_sd.items() if k not in buffer_names},
            "optimizer": optimizer.state_dict(),
        }
        meta = {
            "step": at_step, "world_size": env.world_size, "host": env.host,
            "rank": env.rank, "restart_count": env.restart_count, "time": time.time(),
        }
        ckpt.save_async(now, deferred, meta, rng, ckpt_group, env.world_size)
        return time.perf_counter() - t0

    # ---- loop ----------------------------------------------------------------------------
    amp = contextlib.nullcontext()
    if args.amp:
        if device.type == "cuda":
            amp = torch.autocast("cuda", dtype=torch.bfloat16)  # type: ignore[assignment]
        else:
            warn("--amp is GPU-only (bf16 autocast); ignored on CPU")
    global_batch = args.batch_size * args.grad_accum * env.world_size
    stopped = False
    last_saved = step if resumed_from else -1
    t_log, steps_since_log = time.perf_counter(), 0
    stall_total, saves = 0.0, 0
    warmed_up = False
    pending_stop: tuple[Any, torch.Tensor] | None = None
    check_every = args.stop_check_every or 1
    since_check = 0
    first_step, t_first = step, time.perf_counter()
    calibrate_at = None if args.stop_check_every else step + 10
    while step < total_steps and not stopped:
        sampler.set_epoch(epoch)  # new shuffle each epoch, identical on every rank
        order = list(iter(sampler))
        usable = steps_per_epoch * args.grad_accum * args.batch_size
        it = batches(dataset, order[pos * args.grad_accum * args.batch_size : usable],
                     args.batch_size, args.num_workers)
        while pos < steps_per_epoch and step < total_steps:
            loss_sum = 0.0
            first = args.debug_dump and step == 0 and "grads_local" not in dump
            for micro in range(args.grad_accum):
                x, y = next(it)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                if not warmed_up:
                    warm_up_buckets(ddp, x, y, args.loss, amp)
                    warmed_up = True
                if first:
                    # Local (un-averaged) gradients of the same batch, for the semantics test;
                    # buffers restored so this extra forward leaves no trace in BN stats.
                    saved = [b.detach().clone() for b in ddp.module.buffers()]
                    with ddp.no_sync():
                        compute_loss(args.loss, ddp(x), y).backward()
                    with torch.no_grad():
                        for b, v in zip(ddp.module.buffers(), saved, strict=True):
                            b.copy_(v)
                    dump["grads_local"] = {
                        n: p.grad.detach().cpu().clone()
                        for n, p in ddp.module.named_parameters() if p.grad is not None
                    }
                    optimizer.zero_grad(set_to_none=True)
                    first = False
                # Skip the gradient all-reduce on all but the last micro-step.
                sync = micro == args.grad_accum - 1
                with ddp.no_sync() if not sync else contextlib.nullcontext(), amp:
                    loss = compute_loss(args.loss, ddp(x), y) / args.grad_accum
                loss.backward()
                loss_sum += loss.detach()
            if args.debug_dump and "grads_avg" not in dump:
                dump["grads_avg"] = {
                    n: p.grad.detach().cpu().clone()
                    for n, p in ddp.module.named_parameters() if p.grad is not None
                }
            if ckpt is not None:
                stall_total += ckpt.wait_snapshot()  # the writer copies params first
            if args.clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.clip_grad)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            pos += 1
            steps_since_log += 1
            if args.debug_step_delay:
                time.sleep(args.debug_step_delay)

            if step % args.log_every == 0 or step == total_steps:
                now = time.perf_counter()
                log({"event": "step", "step": step, "loss": float(loss_sum),
                     "samples_per_s": round(global_batch * steps_since_log / (now - t_log), 1)})
                t_log, steps_since_log = now, 0

            since_check += 1
            if since_check >= check_every:
                # All ranks agree on the stop step, whichever of them got the SIGTERM. The
                # all-reduce is asynchronous and read one check later, so it overlaps the
                # next step instead of adding a round trip to every step.
                since_check = 0
                if pending_stop is not None:
                    pending_stop[0].wait()
                    stopped = bool(pending_stop[1][0].item())
                    if pending_stop[1][1].item() > 0:  # the agreed cadence (auto mode)
                        check_every = int(pending_stop[1][1].item())
                proposal = 0
                if calibrate_at is not None and step >= calibrate_at:
                    # Auto cadence: about one check per STOP_CHECK_S of training; the MAX
                    # over ranks' proposals is what every rank adopts at the next check.
                    per_step = (time.perf_counter() - t_first) / max(1, step - first_step)
                    proposal = max(1, min(1000, round(STOP_CHECK_S / max(per_step, 1e-6))))
                    calibrate_at = None
                flag = torch.tensor([1 if stop_requested.is_set() else 0, proposal],
                                    device=device)
                pending_stop = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)

            # The checkpoint records where the *next* step starts.
            at_epoch, at_pos = (epoch + 1, 0) if pos == steps_per_epoch else (epoch, pos)
            if ckpt and (stopped or (args.checkpoint_every and step % args.checkpoint_every == 0)):
                stall_total += save(step, at_epoch, at_pos)
                saves += 1
                last_saved = step
            if stopped:
                break
        if pos == steps_per_epoch:
            epoch, pos = epoch + 1, 0

    if pending_stop is not None:
        pending_stop[0].wait()  # every rank completes the same collectives
    # ---- finish --------------------------------------------------------------------------
    if ckpt and not stopped and last_saved != step:
        save(step, epoch, pos)  # the final state is resumable too
    if ckpt:
        ckpt.wait()  # rank 0: durable; others: RNG handed over, before anyone exits
        if saves and env.rank == 0:
            print(f"ddptrain: {saves} checkpoint(s), mean training stall "
                  f"{1000 * stall_total / saves:.2f} ms", file=sys.stderr, flush=True)
    if args.save_final and env.rank == 0 and not stopped:
        tmp = args.save_final + ".tmp"
        torch.save(ddp.module.state_dict(), tmp)
        os.replace(tmp, args.save_final)
    if args.debug_dump:
        os.makedirs(args.debug_dump, exist_ok=True)
        dump.update(
            final_sha=state_sha256(ddp.module),
            state={k: v.detach().cpu().clone() for k, v in ddp.module.state_dict().items()},
            optimizer=optimizer.state_dict(),
            rng_sample=torch.rand(4),
            world_size=env.world_size,
            rank=env.rank,
        )
        torch.save(dump, os.path.join(args.debug_dump, f"rank{env.rank}.pt"))
    dist.barrier()
    if stopped:
        log({"event": "stopped", "step": step, "reason": "SIGTERM",
             "checkpoint": ckpt.payload_path(step) if ckpt else None})
        code = EXIT_PREEMPTED
    else:
        log({"event": "done", "step": step, "weights_sha256": state_sha256(ddp.module)})
        code = EXIT_OK
    dist.destroy_process_group()
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Exit without tearing down torch's objects: everything is durable and flushed here.

    torch 2.13 can deadlock at exit with gloo: when DDP's Reducer (which still holds the
    process group) is freed, the main thread joins the group's worker thread while holding
    the GIL, and that thread may be freeing the last work object, which needs the GIL.
    Seen as a rare hang after "done" with two agents (py-spy: ~ProcessGroupGloo in
    std::thread::join vs gil_scoped_acquire in ~AsyncBarrierWork).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
