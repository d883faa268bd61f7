#!/usr/bin/env python3
"""ddptrain: the in-container PyTorch DDP trainer of ddpdeploy.

Run it by path under torchrun, one process per GPU (or per CPU slot with gloo):

    torchrun --nproc-per-node 2 train/ddptrain.py --steps 20 --checkpoint-dir /ckpt

Running by path puts this directory first on sys.path, so a user's own ``train.py`` in the
working directory cannot shadow it; the working directory is appended last so that
``--model pkg.mod:factory`` and ``--dataset pkg.mod:factory`` resolve from it.

It reads torchrun's environment only (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*). Global rank 0 prints JSON lines on stdout; see
train/README.md for the schema and the exit codes. Its parts, one module each:
ddptrain_args (flags), ddptrain_dist (process group), ddptrain_data (sharded batches),
ddptrain_state (what a checkpoint holds), ddptrain_ckpt (checkpoints), ddptrain_stop
(SIGTERM), ddptrain_debug (test hooks), ddptrain_model (built-in model and data); and
ddpkit, the helpers a user's own script imports, whose checkpoint store, restart-safe
process group and JSON lines the trainer uses too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from typing import Any, NoReturn

# Working directory last: user factories resolve from it, but never shadow our modules.
if os.getcwd() not in sys.path:
    sys.path.append(os.getcwd())
# torch warns at import when numpy is missing; the trainer does not need numpy, and the
# warning would break the one-line stderr contract of bad arguments.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

import ddpkit  # noqa: E402
import ddptrain_ckpt  # noqa: E402
import ddptrain_dist  # noqa: E402
import ddptrain_model  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ddptrain_args import load_factory, parse_args, warn  # noqa: E402
from ddptrain_data import Batch, ShardedData  # noqa: E402
from ddptrain_debug import DebugHooks  # noqa: E402
from ddptrain_dist import DistEnv  # noqa: E402
from ddptrain_state import (  # noqa: E402
    Layout,
    TrainState,
    get_rng_state,
    seed_everything,
    set_rng_state,
    state_sha256,
)
from ddptrain_stop import StopAgreement  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

EXIT_OK = 0
EXIT_PREEMPTED = 143  # 128 + SIGTERM, returned only after the SIGTERM checkpoint is durable


def main(argv: list[str] | None = None) -> NoReturn:
    # ---- set up: flags, process group, model, data, optimizer
    args = parse_args(argv, __doc__.splitlines()[0])
    model_fn, data_fn = load_factory("model", args.model), load_factory("dataset", args.dataset)
    stop = StopAgreement(args.stop_check_every)  # SIGTERM is handled from here on
    diagnostics(args)
    env = ddptrain_dist.setup(args.backend, args.timeout_s, not args.no_probe,
                              args.probe_min_busbw)  # fmt: skip
    log = Logger(env.rank)
    seed_everything(args.seed + env.rank)  # per-rank streams; DDP's wrap syncs the weights
    debug = DebugHooks(args, env.rank)
    ddp = build_ddp(args, env, model_fn, debug)
    data = build_data(args, env, data_fn)
    optimizer, scheduler = build_optimizer(args, ddp, lr=args.lr * debug.lr_scale)
    layout = Layout(env.world_size, args.batch_size, args.grad_accum)
    state = TrainState(ddp.module, optimizer, scheduler, layout, data.steps_per_epoch)

    # ---- resume from the newest checkpoint every rank can verify
    ckpt = ddptrain_ckpt.make_checkpointer(args, env, debug.slow_save)
    resumed_from = ckpt.resume(state, args.seed)
    total_steps = plan_total_steps(args.steps, args.epochs, state)
    log_start(log, env, total_steps, resumed_from, state.step)

    # ---- the step loop
    amp, loss_fn = autocast(args.amp, env.device), make_loss(args.loss)
    meter = StepMeter(log, args.log_every, total_steps, layout)
    first_step, stopped = state.step, False
    stop.start(state.step, env.device)
    batches = debug.data(data.batches(state.epoch, state.pos, total_steps - state.step),
                         state.step)  # fmt: skip
    for micro_batches in ddpkit.timed_iter(batches, "data"):  # timed: ranks event
        if state.step == first_step:
            warm_up_buckets(ddp, micro_batches[0], loss_fn, amp)
            debug.local_grads(ddp, micro_batches[0], loss_fn, state.step)
        loss = forward_backward(ddp, micro_batches, loss_fn, amp)  # no_sync accumulation
        debug.averaged_grads(ddp)
        ckpt.wait_snapshot()  # the checkpoint writer copies the parameters first
        if args.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.clip_grad)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.advance()
        debug.after_step()
        meter.step(state.step, loss)
        ddpkit.step_done(state.step)  # per-rank times, hang watchdog
        stopped = stop.should_stop(state.step)  # the same answer on every rank
        if stopped or ckpt.due(state.step):
            ckpt.save(state)
        if stopped:
            break

    # ---- finish: durable checkpoint, final weights, then everyone leaves together
    ddpkit.end_steps()  # the last window's ranks event
    stop.finish()
    ckpt.finish(state, stopped)
    if args.save_final and env.is_main and not stopped:
        save_weights(ddp.module, args.save_final)
    debug.finish(ddp, optimizer, env.world_size)
    torch.distributed.barrier()
    if stopped:
        log({"event": "stopped", "step": state.step, "reason": "SIGTERM",
             "checkpoint": ckpt.path(state.step)})  # fmt: skip
        ddptrain_dist.exit_now(EXIT_PREEMPTED)
    log({"event": "done", "step": state.step, "weights_sha256": state_sha256(ddp.module),
         "run": ddpkit.run_record()})  # fmt: skip
    ddptrain_dist.exit_now(EXIT_OK)


# ---- set-up helpers ----------------------------------------------------------------------
def diagnostics(args: Any) -> None:
    """ddpkit's run record and diagnostics settings (the probe runs in setup)."""
    ddpkit.set_seed(args.seed)
    ddpkit.diagnostics(
        ranks_every=args.ranks_every, straggler_factor=args.straggler_factor,
        hang_timeout_s=args.hang_timeout_s, hang_dir=args.checkpoint_dir,
    )  # fmt: skip


def build_ddp(args: Any, env: DistEnv, model_fn: Any, debug: DebugHooks) -> DDP:
    """Model built -> (--sync-bn: converted) -> moved to the device -> wrapped in DDP."""
    model: nn.Module = model_fn() if model_fn else ddptrain_model.build_mlp(batch_norm=args.bn)
    if args.sync_bn and env.device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # before DDP wraps it
    elif args.sync_bn:
        # torch's SyncBatchNorm refuses CPU modules; use our gloo path on its own group
        # so its collectives never interleave with DDP's gradient buckets.
        bn_group = torch.distributed.new_group(backend="gloo")
        model = ddptrain_model.convert_cpu_sync_bn(model, bn_group)
    model.to(env.device)
    debug.before_wrap(model)
    ddp = DDP(
        model,
        device_ids=[env.local_rank] if env.device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_cap_mb,
        static_graph=args.static_graph,
        find_unused_parameters=args.find_unused_parameters,
    )
    debug.after_wrap(ddp)
    return ddp


def build_data(args: Any, env: DistEnv, data_fn: Any) -> ShardedData:
    dataset = data_fn() if data_fn else ddptrain_model.SyntheticClassification()
    return ShardedData(
        dataset, rank=env.rank, world_size=env.world_size, seed=args.seed,
        batch_size=args.batch_size, grad_accum=args.grad_accum,
        drop_last=not args.no_drop_last, num_workers=args.num_workers, device=env.device,
    )  # fmt: skip


def build_optimizer(
    args: Any, ddp: DDP, lr: float
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    params = [p for p in ddp.parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer
    if args.optimizer == "sgd":
        wd = args.weight_decay
        optimizer = torch.optim.SGD(params, lr=lr, momentum=args.momentum, weight_decay=wd)
    else:
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=args.weight_decay)
    warmup = args.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
    )
    return optimizer, scheduler


def plan_total_steps(steps: int | None, epochs: int | None, state: TrainState) -> int:
    """--steps, --epochs, or whichever ends first, counted from where ``state`` stands.

    Epoch-based ends count the remaining epochs in the current layout, which after a
    world-size change at an epoch boundary has a different number of steps per epoch.
    """
    epochs_end = state.step + ((epochs or 1) - state.epoch) * state.steps_per_epoch - state.pos
    if steps:
        return min(steps, epochs_end) if epochs else steps
    return epochs_end


def autocast(amp: bool, device: torch.device) -> Any:
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if amp:
        warn("--amp is GPU-only (bf16 autocast); ignored on CPU")
    return contextlib.nullcontext()


def make_loss(kind: str) -> Any:
    if kind == "cross_entropy":
        return F.cross_entropy

    def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not target.is_floating_point() and out.dim() == 2:
            # Class labels with mse: regress the one-hot encoding.
            target = F.one_hot(target, out.shape[1]).to(out.dtype)
        return F.mse_loss(out, target.to(out.dtype))

    return mse


# ---- the step's parts --------------------------------------------------------------------
def forward_backward(ddp: DDP, micro_batches: list[Batch], loss_fn: Any, amp: Any) -> Any:
    """Accumulate the gradients of the micro-batches; DDP all-reduces on the last only.

    Returns the step's loss (a tensor, so logging decides when to sync on it)."""
    n = len(micro_batches)
    if n == 1:  # the common case, without the accumulation's extra tensor ops
        x, y = micro_batches[0]
        with ddpkit.timed("forward"), amp:
            loss = loss_fn(ddp(x), y)
        loss.backward()
        return loss.detach()
    total: Any = 0.0
    for i, (x, y) in enumerate(micro_batches):
        # ddp.no_sync(): skip the gradient all-reduce on all but the last micro-step.
        sync = ddp.no_sync() if i < n - 1 else contextlib.nullcontext()
        with sync, ddpkit.timed("forward"), amp:
            loss = loss_fn(ddp(x), y) / n
        loss.backward()
        total += loss.detach()
    return total


def warm_up_buckets(ddp: DDP, batch: Batch, loss_fn: Any, amp: Any) -> None:
    """One synced forward/backward that changes no state, run before the first real step.

    DDP all-reduces the first iteration with one bucket in parameter order and then rebuilds
    the buckets in gradient-ready order. With 3+ ranks the summation order of an element
    depends on its offset in the bucket, so a run resumed mid-way (whose first step uses the
    initial layout) would drift by rounding from an uninterrupted one (which used the rebuilt
    layout there). Rebuilding before any real step, in every run, makes resume bit-exact.
    """
    rng = get_rng_state()
    buffers = [b.detach().clone() for b in ddp.module.buffers()]
    x, y = batch
    with amp:
        loss = loss_fn(ddp(x), y)
    loss.backward()
    with torch.no_grad():
        for b, v in zip(ddp.module.buffers(), buffers, strict=True):
            b.copy_(v)
        for p in ddp.parameters():
            p.grad = None
    set_rng_state(rng)


# ---- output ------------------------------------------------------------------------------


class Logger:
    """JSON lines on stdout from global rank 0 only; everything else goes to stderr."""

    def __init__(self, rank: int) -> None:
        self.enabled = rank == 0

    def __call__(self, event: dict[str, Any]) -> None:
        if self.enabled:
            ddpkit.emit(event)  # whole lines: the checkpoint writer thread logs too


class StepMeter:
    """The `step` lines: every --log-every steps and at the last one, with global samples/s."""

    def __init__(self, log: Logger, every: int, total_steps: int, layout: Layout) -> None:
        self.log, self.every, self.total = log, every, total_steps
        self.global_batch = layout.batch_size * layout.grad_accum * layout.world_size
        self._t, self._steps = time.perf_counter(), 0

    def step(self, step: int, loss: Any) -> None:
        self._steps += 1
        if step % self.every and step != self.total:
            return
        now = time.perf_counter()
        if self.log.enabled:  # float() waits for the device: on the logging rank only
            rate = round(self.global_batch * self._steps / (now - self._t), 1)
            self.log({"event": "step", "step": step, "loss": float(loss), "samples_per_s": rate})
        self._t, self._steps = now, 0


def log_start(log: Logger, env: DistEnv, total: int, resumed: str | None, step: int) -> None:
    log({
        "event": "start", "world_size": env.world_size, "backend": env.backend,
        "device": env.device.type, "host": env.host, "restart_count": env.restart_count,
        "total_steps": total, "resumed": resumed is not None, "resume_path": resumed,
        "resume_step": step,
    })  # fmt: skip


def save_weights(module: nn.Module, path: str) -> None:
    """--save-final: the weights alone, atomically (temp file, rename)."""
    tmp = path + ".tmp"
    torch.save(module.state_dict(), tmp)
    os.replace(tmp, path)


def exit_on_error() -> NoReturn:
    """An uncaught error ends the worker at once, printed as Python would print it.

    Most such errors are a peer's death (gloo: "Connection closed by peer"). torchrun
    restarts the worker group only once every worker of the node has ended, and the
    interpreter's own teardown with a broken process group took ~3 s on a loaded host (and
    may deadlock, see ddptrain_dist.exit_now). Checkpoints are atomic (temp file, rename),
    so an unfinished one is never taken for a finished one."""
    sys.excepthook(*sys.exc_info())  # torch's hook, if set, prefixes the rank as before
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # Python's own exit code for an uncaught exception


if __name__ == "__main__":
    try:
        main()
    except Exception:  # not SystemExit: bad arguments keep their exit code 2
        exit_on_error()
