"""The --debug-* test and teaching hooks of ddptrain.py, each a one-line call in main().

Harmless in production: without the flags every hook returns at once.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from ddptrain_state import state_sha256
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class DebugHooks:
    """--debug-dump DIR: every rank writes rank<R>.pt (weights hash before/after the DDP
    wrap, its local and averaged first-step gradients, final state, optimizer state, an RNG
    sample). --debug-desync-opt: ranks != 0 use 2x lr. --debug-step-delay S: sleep per step.
    --debug-slow-save S: the checkpoint writer pauses mid-write (see ddptrain_ckpt.py).
    --debug-slow-rank R:S: rank R sleeps S in each step's data loading (a straggler).
    --debug-hang-rank R:STEP: rank R blocks forever loading step STEP's data (a hang)."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.dump_dir: str | None = args.debug_dump
        self.rank = rank
        self.lr_scale = 2.0 if args.debug_desync_opt and rank != 0 else 1.0
        self.step_delay: float = args.debug_step_delay
        self.slow_save: float = args.debug_slow_save
        self.dump: dict[str, Any] = {}
        slow, hang = args.debug_slow_rank, args.debug_hang_rank
        self.data_delay = slow[1] if slow and slow[0] == rank else 0.0
        self.hang_step = int(hang[1]) if hang and hang[0] == rank else None

    def data(self, batches: Iterator[Any], step: int) -> Iterator[Any]:
        """``batches`` with this rank's --debug-slow-rank / --debug-hang-rank applied inside
        each fetch (the caller times the fetch as data loading); ``step``: the last done."""
        if not self.data_delay and self.hang_step is None:
            yield from batches
            return
        for item in batches:
            step += 1
            if step == self.hang_step:
                threading.Event().wait()  # forever: what the hang watchdog is for
            time.sleep(self.data_delay)
            yield item

    def before_wrap(self, model: nn.Module) -> None:
        if self.dump_dir:
            self.dump["pre_wrap_sha"] = state_sha256(model)

    def after_wrap(self, ddp: DDP) -> None:
        if self.dump_dir:
            self.dump["post_wrap_sha"] = state_sha256(ddp.module)

    def local_grads(
        self,
        ddp: DDP,
        batch: tuple[torch.Tensor, torch.Tensor],
        loss_fn: Callable[..., Any],
        step: int,
    ) -> None:
        """Before step 0: the local (un-averaged) gradients of its first micro-batch.

        A no_sync forward/backward; buffers (BN stats) are restored and gradients dropped,
        so it leaves no trace in training."""
        if not self.dump_dir or step != 0 or "grads_local" in self.dump:
            return
        x, y = batch
        saved = [b.detach().clone() for b in ddp.module.buffers()]
        with ddp.no_sync():
            loss_fn(ddp(x), y).backward()
        with torch.no_grad():
            for b, v in zip(ddp.module.buffers(), saved, strict=True):
                b.copy_(v)
        self.dump["grads_local"] = _grads(ddp)
        for p in ddp.parameters():
            p.grad = None

    def averaged_grads(self, ddp: DDP) -> None:
        if self.dump_dir and "grads_avg" not in self.dump:
            self.dump["grads_avg"] = _grads(ddp)

    def after_step(self) -> None:
        if self.step_delay:
            time.sleep(self.step_delay)

    def finish(self, ddp: DDP, optimizer: torch.optim.Optimizer, world_size: int) -> None:
        if not self.dump_dir:
            return
        os.makedirs(self.dump_dir, exist_ok=True)
        self.dump.update(
            final_sha=state_sha256(ddp.module),
            state={k: v.detach().cpu().clone() for k, v in ddp.module.state_dict().items()},
            optimizer=optimizer.state_dict(),
            rng_sample=torch.rand(4),
            world_size=world_size,
            rank=self.rank,
        )
        torch.save(self.dump, os.path.join(self.dump_dir, f"rank{self.rank}.pt"))


def _grads(ddp: DDP) -> dict[str, torch.Tensor]:
    named = ddp.module.named_parameters()
    return {n: p.grad.detach().cpu().clone() for n, p in named if p.grad is not None}
