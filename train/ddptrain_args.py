"""Command line of ddptrain.py: the flags as a typed ``Args``, one-line errors (exit 2),
warnings, the user's --model/--dataset factories."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NoReturn

import torch

EXIT_BAD_ARGS = 2


@dataclass(frozen=True)
class Args:
    """Every flag, typed; the help texts are in the parser below."""

    # training
    steps: int | None
    epochs: int | None
    batch_size: int
    lr: float
    optimizer: str
    momentum: float
    weight_decay: float
    warmup_steps: int
    seed: int
    grad_accum: int
    bn: bool
    amp: bool
    clip_grad: float
    model: str | None
    dataset: str | None
    loss: str
    num_workers: int
    no_drop_last: bool
    log_every: int
    # distributed
    backend: str
    bucket_cap_mb: float
    static_graph: bool
    find_unused_parameters: bool
    sync_bn: bool
    timeout_s: int
    stop_check_every: int
    # ddpkit's diagnostics
    no_probe: bool
    probe_min_busbw: float | None
    ranks_every: int | None
    straggler_factor: float
    hang_timeout_s: float
    # checkpoints
    checkpoint_dir: str | None
    checkpoint_every: int
    keep: int
    save_final: str | None
    # test and teaching hooks (ddptrain_debug.py)
    debug_dump: str | None
    debug_desync_opt: bool
    debug_step_delay: float
    debug_slow_save: float
    debug_slow_rank: tuple[int, float] | None
    debug_hang_rank: tuple[int, float] | None

    @property
    def debugging(self) -> bool:
        """A --debug-* flag that installs hooks into the step (not --debug-slow-save, which
        is the checkpoint writer's own pause, nor --debug-desync-opt: see ``lr_of``)."""
        return bool(
            self.debug_dump or self.debug_step_delay or self.debug_slow_rank
            or self.debug_hang_rank
        )  # fmt: skip

    def lr_of(self, rank: int) -> float:
        """This rank's learning rate: --lr, doubled on ranks != 0 by --debug-desync-opt (to
        show that DDP does not sync optimizer hyperparameters)."""
        return self.lr * 2.0 if self.debug_desync_opt and rank != 0 else self.lr


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; the CLI wants exactly one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        bad_args(message)


def bad_args(message: str) -> NoReturn:
    print(f"ddptrain: error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_ARGS)


def warn(msg: str) -> None:
    print(f"ddptrain: warning: {msg}", file=sys.stderr, flush=True)


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


def _rank_spec(kind: str) -> Callable[[str], tuple[int, float]]:
    def parse(v: str) -> tuple[int, float]:
        r, sep, x = v.partition(":")
        try:
            if sep and int(r) >= 0 and float(x) >= 0:
                return int(r), float(x)
        except ValueError:
            pass
        raise argparse.ArgumentTypeError(f"must look like RANK:{kind}, got {v!r}")

    return parse


def _training_flags(a: Callable[..., Any]) -> None:
    a("--steps", type=_positive, help="total optimizer steps (default: --epochs worth)")
    a("--epochs", type=_positive, help="epochs (default 1 when --steps is not given)")
    a("--batch-size", type=_positive, default=32, help="per-rank micro-batch size")
    a("--lr", type=float, default=0.05)
    a("--optimizer", choices=["sgd", "adamw"], default="sgd")
    a("--momentum", type=float, default=0.9, help="SGD momentum")
    a("--weight-decay", type=float, default=0.0)
    a("--warmup-steps", type=_non_negative, default=0, help="linear LR warmup steps")
    a("--seed", type=int, default=0, help="rank r is seeded with seed + r")
    a("--grad-accum", type=_positive, default=1, help="micro-steps per optimizer step")
    a("--bn", action="store_true", help="built-in MLP: add a BatchNorm1d layer")
    a("--amp", action="store_true", help="bf16 autocast (GPU only; ignored with a warning)")
    a("--clip-grad", type=float, default=0.0, help="max grad norm (0: off)")
    a("--model", help="pkg.mod:factory returning an nn.Module (default: built-in MLP)")
    a("--dataset", help="pkg.mod:factory returning a map-style Dataset of (input, target)")
    a("--loss", choices=["cross_entropy", "mse"], default="cross_entropy")
    a("--num-workers", type=_non_negative, default=0, help="DataLoader workers per rank")
    a("--no-drop-last", action="store_true", help="DistributedSampler pads instead of drops")
    a("--log-every", type=_positive, default=1)


def _distributed_flags(a: Callable[..., Any]) -> None:
    a("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    a("--bucket-cap-mb", type=float, default=25.0)
    a("--static-graph", action="store_true")
    a("--find-unused-parameters", action="store_true")
    a("--sync-bn", action="store_true", help="synchronise BatchNorm statistics across ranks")
    a("--timeout-s", type=_positive, default=300, help="collective / store timeout")
    a("--stop-check-every", type=_non_negative, default=0,
      help="steps between the all-reduces that agree on a SIGTERM stop (0: auto, about "
      "every 0.25 s)")  # fmt: skip


def _diagnostic_flags(a: Callable[..., Any]) -> None:
    # ddpkit's diagnostics (see ddpkit.py): the probe, the ranks event, the hang watchdog;
    # defaults from the env the spec's diagnostics section sets (ddpkit reads the same).
    e = os.environ
    a("--no-probe", action="store_true", default=e.get("DDPDEPLOY_PROBE") == "0",
      help="skip the all-reduce probe at start")  # fmt: skip
    a("--probe-min-busbw", type=float, metavar="GBPS",
      default=float(e.get("DDPDEPLOY_PROBE_MIN_BUSBW") or 0) or None,
      help="fail at start (exit 3) when the probe's bus bandwidth is below this")  # fmt: skip
    a("--ranks-every", type=_non_negative, default=None,
      help="steps between `ranks` events (per-rank work times; 0: only at the end; "
      "default: DDPDEPLOY_RANKS_EVERY, else 50 steps, then about every 10 s)")  # fmt: skip
    a("--straggler-factor", type=float,
      default=float(e.get("DDPDEPLOY_STRAGGLER_FACTOR") or 1.2),
      help="a rank whose work time exceeds the median by this factor is a straggler")  # fmt: skip
    a("--hang-timeout-s", type=float, default=float(e.get("DDPDEPLOY_HANG_TIMEOUT_S") or 0),
      help="seconds without a step before the hang watchdog dumps stacks and ends the run "
      "(0: max(60, 5x the slowest step); negative: off)")  # fmt: skip


def _checkpoint_flags(a: Callable[..., Any]) -> None:
    # ddpdeploy sets the variable in every process of a job with a checkpoint volume.
    a("--checkpoint-dir", default=os.environ.get("DDPDEPLOY_CHECKPOINT_DIR") or None,
      help="directory shared by all nodes; resume from it on start "
      "(default: $DDPDEPLOY_CHECKPOINT_DIR)")  # fmt: skip
    a("--checkpoint-every", type=_non_negative, default=0, help="steps between checkpoints")
    a("--keep", type=_positive, default=3, help="checkpoints to keep")
    a("--save-final", help="rank 0 writes ddp.module.state_dict() here at the end")


def _debug_flags(a: Callable[..., Any]) -> None:
    # Test and teaching hooks; documented in train/README.md.
    a("--debug-dump", help="every rank writes rank<R>.pt with per-rank state here")
    a("--debug-desync-opt", action="store_true",
      help="ranks != 0 use 2x lr: DDP does not sync optimizer state/hyperparameters")  # fmt: skip
    a("--debug-step-delay", type=float, default=0.0, help="sleep seconds per step")
    a("--debug-slow-save", type=float, default=0.0, help="writer sleeps mid-write")
    a("--debug-slow-rank", type=_rank_spec("SECONDS"), metavar="R:SECONDS",
      help="rank R sleeps SECONDS in each step's data loading")  # fmt: skip
    a("--debug-hang-rank", type=_rank_spec("STEP"), metavar="R:STEP",
      help="rank R blocks forever loading the data of step STEP")  # fmt: skip


def parse_args(argv: list[str] | None, description: str) -> Args:
    p = _OneLineParser(prog="ddptrain.py", description=description)
    for add_flags in (_training_flags, _distributed_flags, _diagnostic_flags,
                      _checkpoint_flags, _debug_flags):  # fmt: skip
        add_flags(p.add_argument)
    ns = vars(p.parse_args(argv))
    args = Args(**{f.name: ns[f.name] for f in fields(Args)})
    if args.checkpoint_every and not args.checkpoint_dir:
        bad_args("--checkpoint-every needs --checkpoint-dir")
    for flag, spec in (("model", args.model), ("dataset", args.dataset)):
        if spec is not None and (spec.count(":") != 1 or not all(spec.split(":"))):
            bad_args(f"--{flag} must look like pkg.mod:factory, got {spec!r}")
    if args.backend == "nccl" and not torch.cuda.is_available():
        bad_args("--backend nccl needs CUDA, which is not available here")
    return args


def load_factory(flag: str, spec: str) -> Callable[[], Any]:
    """The zero-argument callable that --model/--dataset names. What it returns is the
    user's (an nn.Module, a map-style Dataset): unknown until it is called."""
    mod_name, fn_name = spec.split(":")
    try:
        fn: object = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        bad_args(f"--{flag} {spec}: {type(e).__name__}: {e}")
    if not callable(fn):
        bad_args(f"--{flag} {spec}: not callable")
    return fn
