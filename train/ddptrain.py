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
ddptrain_args (flags), ddptrain_dist (process group, SIGTERM, exit), ddptrain_model
(built-in model, data, sharded batches), ddptrain_ckpt (what a checkpoint holds, and
writing it), ddptrain_debug (the --debug-* hooks); and ddpkit, the helpers a user's own
script imports, whose checkpoint store, restart-safe process group, JSON lines and
diagnostics the trainer uses too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

# Working directory last: user factories resolve from it, but never shadow our modules.
if os.getcwd() not in sys.path:
    sys.path.append(os.getcwd())
# torch warns at import when numpy is missing; the trainer does not need numpy, and the
# warning would break the one-line stderr contract of bad arguments.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

import ddpkit  # noqa: E402
import ddptrain_dist  # noqa: E402
import ddptrain_model  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ddptrain_args import Args, load_factory, parse_args, warn  # noqa: E402
from ddptrain_ckpt import (  # noqa: E402
    Layout,
    TrainState,
    get_rng_state,
    make_checkpointer,
    seed_everything,
    set_rng_state,
)
from ddptrain_debug import AfterStep, Debug  # noqa: E402
from ddptrain_dist import DistEnv, StopAgreement  # noqa: E402
from ddptrain_model import Batch, ShardedData  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

EXIT_OK = 0
EXIT_PREEMPTED = 143  # 128 + SIGTERM, returned only after the SIGTERM checkpoint is durable

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Amp = contextlib.AbstractContextManager[None]  # bf16 autocast, or a null context


def main(argv: list[str] | None = None) -> NoReturn:
    # ---- set up: flags, process group, model, data, optimizer
    args = parse_args(argv, __doc__.splitlines()[0])
    model_fn = load_factory("model", args.model) if args.model else None
    data_fn = load_factory("dataset", args.dataset) if args.dataset else None
    stop = StopAgreement(args.stop_check_every)  # SIGTERM is handled from here on
    env = ddptrain_dist.setup(args)  # ddpkit's restart-safe process group, and its probe
    seed_everything(args.seed + env.rank)  # per-rank streams; DDP's wrap syncs the weights
    model = build_model(args, env, model_fn)
    debug = Debug(args, env.rank, model) if args.debugging else None  # --debug-* hooks
    ddp = DDP(
        model,
        device_ids=[env.local_rank] if env.device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_cap_mb,
        static_graph=args.static_graph,
        find_unused_parameters=args.find_unused_parameters,
    )  # broadcasts rank 0's weights and buffers: every rank starts the same
    data = build_data(args, env, data_fn)
    optimizer, scheduler = build_optimizer(args, ddp, lr=args.lr_of(env.rank))
    layout = Layout(env.world_size, args.batch_size, args.grad_accum)
    state = TrainState(ddp.module, optimizer, scheduler, layout, data.steps_per_epoch)

    # ---- resume from the newest checkpoint every rank can verify
    ckpt = make_checkpointer(args, env)
    resumed_from = ckpt.resume(state, args.seed)
    total_steps = plan_total_steps(args.steps, args.epochs, state)
    log_start(env, total_steps, resumed_from, state.step)

    # ---- the step loop
    amp, loss_fn = autocast(args.amp, env.device), make_loss(args.loss)
    batches = data.batches(state.epoch, state.pos, total_steps - state.step)
    after_step: AfterStep = StepReport(env, args, total_steps)
    if debug is not None:
        batches, after_step = debug.install(
            ddp, optimizer, batches, after_step, state.step, total_steps
        )
    batches = ddpkit.timed_iter(batches, "data")  # this rank's own work: the ranks event
    batches = warm_up_buckets(ddp, batches, loss_fn, amp)
    stop.start(state.step, env.device)
    stopped = False
    for micro_batches in batches:
        loss = forward_backward(ddp, micro_batches, loss_fn, amp)  # no_sync accumulation
        ckpt.wait_snapshot()  # the checkpoint writer copies the parameters first
        if args.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.clip_grad)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.advance()
        after_step(state.step, loss)  # the step line, per-rank times, hang watchdog
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
    torch.distributed.barrier()
    if stopped:
        log(env, {"event": "stopped", "step": state.step, "reason": "SIGTERM",
                  "checkpoint": ckpt.path(state.step)})  # fmt: skip
        ddptrain_dist.exit_now(EXIT_PREEMPTED)
    log(env, {"event": "done", "step": state.step, "weights_sha256":
              ddpkit.weights_sha256(ddp.module), "run": ddpkit.run_record()})  # fmt: skip
    ddptrain_dist.exit_now(EXIT_OK)


# ---- set-up helpers ----------------------------------------------------------------------
def build_model(args: Args, env: DistEnv, model_fn: Callable[[], Any] | None) -> nn.Module:
    """Model built -> (--sync-bn: converted) -> moved to the device; DDP wraps it next."""
    model: nn.Module = model_fn() if model_fn else ddptrain_model.build_mlp(batch_norm=args.bn)
    if args.sync_bn and env.device.type == "cuda":
        # torch leaves convert_sync_batchnorm unannotated
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
    elif args.sync_bn:
        # torch's SyncBatchNorm refuses CPU modules; use our gloo path on its own group
        # so its collectives never interleave with DDP's gradient buckets.
        bn_group = torch.distributed.new_group(backend="gloo")
        model = ddptrain_model.convert_cpu_sync_bn(model, bn_group)
    return model.to(env.device)


def build_data(args: Args, env: DistEnv, data_fn: Callable[[], Any] | None) -> ShardedData:
    dataset = data_fn() if data_fn else ddptrain_model.SyntheticClassification()
    return ShardedData(
        dataset, rank=env.rank, world_size=env.world_size, seed=args.seed,
        batch_size=args.batch_size, grad_accum=args.grad_accum,
        drop_last=not args.no_drop_last, num_workers=args.num_workers, device=env.device,
    )  # fmt: skip


def build_optimizer(
    args: Args, ddp: DDP, lr: float
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


def autocast(amp: bool, device: torch.device) -> Amp:
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if amp:
        warn("--amp is GPU-only (bf16 autocast); ignored on CPU")
    return contextlib.nullcontext()


def make_loss(kind: str) -> LossFn:
    if kind == "cross_entropy":
        return F.cross_entropy

    def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not target.is_floating_point() and out.dim() == 2:
            # Class labels with mse: regress the one-hot encoding.
            target = F.one_hot(target, out.shape[1]).to(out.dtype)
        return F.mse_loss(out, target.to(out.dtype))

    return mse


# ---- the step's parts --------------------------------------------------------------------
def forward_backward(ddp: DDP, micro_batches: list[Batch], loss_fn: LossFn, amp: Amp) -> Tensor:
    """Accumulate the gradients of the micro-batches; DDP all-reduces on the last only.

    Returns the step's loss (a tensor, so logging decides when to sync on it)."""
    n = len(micro_batches)
    if n == 1:  # the common case, without the accumulation's extra tensor ops
        x, y = micro_batches[0]
        with ddpkit.timed("forward"), amp:
            loss = loss_fn(ddp(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return loss.detach()
    losses = []
    for i, (x, y) in enumerate(micro_batches):
        # ddp.no_sync(): skip the gradient all-reduce on all but the last micro-step.
        sync = ddp.no_sync() if i < n - 1 else contextlib.nullcontext()
        with sync, ddpkit.timed("forward"), amp:
            loss = loss_fn(ddp(x), y) / n
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        losses.append(loss.detach())
    return sum(losses[1:], losses[0])


def warm_up_buckets(
    ddp: DDP, batches: Iterator[list[Batch]], loss_fn: LossFn, amp: Amp
) -> Iterator[list[Batch]]:
    """``batches``, after one synced forward/backward on the first that changes no state.

    DDP all-reduces the first iteration with one bucket in parameter order and then rebuilds
    the buckets in gradient-ready order. With 3+ ranks the summation order of an element
    depends on its offset in the bucket, so a run resumed mid-way (whose first step uses the
    initial layout) would drift by rounding from an uninterrupted one (which used the rebuilt
    layout there). Rebuilding before any real step, in every run, makes resume bit-exact.
    """
    first = next(batches, None)
    if first is None:
        return
    rng = get_rng_state()
    buffers = [b.detach().clone() for b in ddp.module.buffers()]
    x, y = first[0]
    with amp:
        loss = loss_fn(ddp(x), y)
    loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    with torch.no_grad():
        for b, v in zip(ddp.module.buffers(), buffers, strict=True):
            b.copy_(v)
        for p in ddp.parameters():
            p.grad = None
    set_rng_state(rng)
    yield first
    yield from batches


# ---- output ------------------------------------------------------------------------------
def log(env: DistEnv, event: dict[str, Any]) -> None:
    """A JSON line on stdout from global rank 0 only; everything else goes to stderr."""
    if env.is_main:
        ddpkit.emit(event)  # whole lines: the checkpoint writer thread logs too


class StepReport:
    """After each optimizer step: the `step` line (every --log-every steps and at the last,
    with global samples/s), then ddpkit's per-rank times, hang watchdog and ranks event."""

    def __init__(self, env: DistEnv, args: Args, total_steps: int) -> None:
        self.main, self.every, self.total = env.is_main, args.log_every, total_steps
        self.global_batch = args.batch_size * args.grad_accum * env.world_size
        self._t, self._steps = time.perf_counter(), 0

    def __call__(self, step: int, loss: torch.Tensor) -> None:
        self._steps += 1
        if step % self.every == 0 or step == self.total:
            now = time.perf_counter()
            if self.main:  # float() waits for the device: on the logging rank only
                rate = round(self.global_batch * self._steps / (now - self._t), 1)
                ddpkit.emit({"event": "step", "step": step, "loss": float(loss),
                             "samples_per_s": rate})  # fmt: skip
            self._t, self._steps = now, 0
        ddpkit.step_done(step)


def log_start(env: DistEnv, total: int, resumed: str | None, step: int) -> None:
    log(env, {
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
