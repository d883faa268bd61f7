"""Command line of ddptrain.py: the flags as a typed ``Args``, one-line errors (exit 2),
warnings, the user's --model/--dataset factories."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, NoReturn, TypeVar

import torch

EXIT_BAD_ARGS = 2
T = TypeVar("T")


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


# Far above any useful value and far below where torch's float32 arithmetic overflows
# (--lr 1e308 raised "value cannot be converted to type float without overflow"); for
# --bucket-cap-mb, a terabyte (DDP holds the size in bytes as an int64).
FLOAT_CAP, FLOAT_CAP_TEXT = 1e6, "1e6"


def _number(ok: Callable[[float], bool], what: str) -> Callable[[str], float]:
    """A float flag's type: a finite number for which ``ok`` holds, else argparse's error
    ("argument --lr: must be a finite number > 0 (got nan)"). float() alone takes nan and
    inf, with which the run trained to NaN weights and reported done."""

    def parse(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            x = math.nan
        if math.isfinite(x) and ok(x):
            return x
        raise argparse.ArgumentTypeError(f"must be {what} (got {v})")

    return parse


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


def flag(default: T, help: str | None = None, **argparse_kw: Any) -> T:
    """A field of ``Args`` that is a flag too: its default, help text and what else
    ``add_argument`` takes (type, choices, action, metavar)."""
    return field(default=default, metadata={"help": help, **argparse_kw})


def env_flag(default: Callable[[], T], help: str, **argparse_kw: Any) -> T:
    """A flag whose default is read from the env when the flags are parsed: the variables
    ddpdeploy sets (the checkpoint volume, the spec's diagnostics section)."""
    return field(default_factory=default, metadata={"help": help, **argparse_kw})


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


@dataclass(frozen=True)
class Args:
    """Every flag, once: its type, default and help. The parser is made from these fields
    (``--batch-size`` is ``batch_size``), in this order."""

    # fmt: off
    # ---- training
    steps: int | None = flag(None, "total optimizer steps (default: --epochs worth)",
                             type=_positive)
    epochs: int | None = flag(None, "epochs (default 1 when --steps is not given)",
                              type=_positive)
    batch_size: int = flag(32, "per-rank micro-batch size", type=_positive)
    lr: float = flag(0.05, type=_number(lambda x: 0 < x <= FLOAT_CAP,
                                        f"a finite number > 0 and <= {FLOAT_CAP_TEXT}"))
    optimizer: str = flag("sgd", choices=["sgd", "adamw"])
    momentum: float = flag(0.9, "SGD momentum", type=_number(lambda x: 0 <= x < 1,
                                                             "a number >= 0 and < 1"))
    weight_decay: float = flag(0.0, type=_number(lambda x: 0 <= x <= FLOAT_CAP,
                                                 f"a finite number >= 0 and <= {FLOAT_CAP_TEXT}"))
    warmup_steps: int = flag(0, "linear LR warmup steps", type=_non_negative)
    seed: int = flag(0, "rank r is seeded with seed + r", type=int)
    grad_accum: int = flag(1, "micro-steps per optimizer step", type=_positive)
    bn: bool = flag(False, "built-in MLP: add a BatchNorm1d layer", action="store_true")
    amp: bool = flag(False, "bf16 autocast (GPU only; ignored with a warning)",
                     action="store_true")
    clip_grad: float = flag(0.0, "max grad norm (0: off)",
                            type=_number(lambda x: x >= 0, "a finite number >= 0"))
    model: str | None = flag(None, "pkg.mod:factory returning an nn.Module (default: "
                             "built-in MLP)")
    dataset: str | None = flag(None, "pkg.mod:factory returning a map-style Dataset of "
                               "(input, target)")
    loss: str = flag("cross_entropy", choices=["cross_entropy", "mse"])
    num_workers: int = flag(0, "DataLoader workers per rank", type=_non_negative)
    no_drop_last: bool = flag(False, "DistributedSampler pads instead of drops",
                              action="store_true")
    log_every: int = flag(1, type=_positive)
    # ---- distributed
    backend: str = flag("auto", choices=["auto", "nccl", "gloo"])
    bucket_cap_mb: float = flag(25.0, type=_number(lambda x: 0 < x <= FLOAT_CAP,
                                                   f"a finite number > 0 and <= {FLOAT_CAP_TEXT}"))
    static_graph: bool = flag(False, action="store_true")
    find_unused_parameters: bool = flag(False, action="store_true")
    sync_bn: bool = flag(False, "synchronise BatchNorm statistics across ranks",
                         action="store_true")
    timeout_s: int = flag(300, "collective / store timeout", type=_positive)
    stop_check_every: int = flag(0, "steps between the all-reduces that agree on a SIGTERM "
                                 "stop (0: auto, about every 0.25 s)", type=_non_negative)
    # ---- ddpkit's diagnostics (ddpkit.py): the probe, the ranks event, the hang watchdog
    no_probe: bool = env_flag(lambda: _env("DDPDEPLOY_PROBE") == "0",
                              "skip the all-reduce probe at start", action="store_true")
    probe_min_busbw: float | None = env_flag(
        lambda: float(_env("DDPDEPLOY_PROBE_MIN_BUSBW") or 0) or None,
        "fail at start (exit 3) when the probe's bus bandwidth is below this",
        type=_number(lambda x: x >= 0, "a finite number >= 0"), metavar="GBPS")
    ranks_every: int | None = flag(None, "steps between `ranks` events (per-rank work times; "
                                   "0: only at the end; default: DDPDEPLOY_RANKS_EVERY, else "
                                   "50 steps, then about every 10 s)", type=_non_negative)
    straggler_factor: float = env_flag(
        lambda: float(_env("DDPDEPLOY_STRAGGLER_FACTOR") or 1.2),
        "a rank whose work time exceeds the median by this factor is a straggler",
        type=_number(lambda x: x > 0, "a finite number > 0"))
    hang_timeout_s: float = env_flag(
        lambda: float(_env("DDPDEPLOY_HANG_TIMEOUT_S") or 0),
        "seconds without a step before the hang watchdog dumps stacks and ends the run "
        "(0: max(60, 5x the slowest step); negative: off)",
        type=_number(lambda x: True, "a finite number of seconds"))
    # ---- checkpoints (ddpdeploy sets the variable wherever the job has a checkpoint volume)
    checkpoint_dir: str | None = env_flag(
        lambda: _env("DDPDEPLOY_CHECKPOINT_DIR"),
        "directory shared by all nodes; resume from it on start "
        "(default: $DDPDEPLOY_CHECKPOINT_DIR)")
    checkpoint_every: int = flag(0, "steps between checkpoints", type=_non_negative)
    keep: int = flag(3, "checkpoints to keep", type=_positive)
    save_final: str | None = flag(None, "rank 0 writes ddp.module.state_dict() here at the end")
    # ---- test and teaching hooks (ddptrain_debug.py, train/README.md)
    debug_dump: str | None = flag(None, "every rank writes rank<R>.pt with per-rank state here")
    debug_desync_opt: bool = flag(False, "ranks != 0 use 2x lr: shows DDP does not sync "
                                  "optimizer state/hyperparameters", action="store_true")
    debug_step_delay: float = flag(0.0, "sleep seconds per step",
                                   type=_number(lambda x: x >= 0, "a finite number >= 0"))
    debug_slow_save: float = flag(0.0, "writer sleeps mid-write",
                                  type=_number(lambda x: x >= 0, "a finite number >= 0"))
    debug_slow_rank: tuple[int, float] | None = flag(
        None, "rank R sleeps SECONDS in each step's data loading",
        type=_rank_spec("SECONDS"), metavar="R:SECONDS")
    debug_hang_rank: tuple[int, float] | None = flag(
        None, "rank R blocks forever loading the data of step STEP",
        type=_rank_spec("STEP"), metavar="R:STEP")
    # fmt: on

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


def parse_args(argv: list[str] | None, description: str) -> Args:
    p = _OneLineParser(prog="ddptrain.py", description=description)
    for f in fields(Args):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        p.add_argument("--" + f.name.replace("_", "-"), default=default, **f.metadata)
    args = Args(**vars(p.parse_args(argv)))
    if args.checkpoint_every and not args.checkpoint_dir:
        bad_args("--checkpoint-every needs --checkpoint-dir")
    for flag_name, spec in (("model", args.model), ("dataset", args.dataset)):
        if spec is not None and (spec.count(":") != 1 or not all(spec.split(":"))):
            bad_args(f"--{flag_name} must look like pkg.mod:factory, got {spec!r}")
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
