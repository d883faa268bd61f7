"""The --debug-* test and teaching hooks of ddptrain.py, each a one-line call in main().

Harmless in production: without the flags every hook returns at once.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from ddptrain_state import state_sha256
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class DebugHooks:
    """--debug-dump DIR: every rank writes rank<R>.pt (weights hash before/after the DDP
    wrap, its local and averaged first-step gradients, final state, optimizer state, an RNG
    sample). --debug-desync-opt: ranks != 0 use 2x lr. --debug-step-delay S: sleep per step.
    --debug-slow-save S: the checkpoint writer pauses mid-write (see ddptrain_ckpt.py)."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.dump_dir: str | None = args.debug_dump
        self.rank = rank
        self.lr_scale = 2.0 if args.debug_desync_opt and rank != 0 else 1.0
        self.step_delay: float = args.debug_step_delay
        self.slow_save: float = args.debug_slow_save
        self.dump: dict[str, Any] = {}

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
