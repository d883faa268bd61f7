"""The --debug-* test and teaching hooks of ddptrain.py, installed only when a flag asks.

Each goes around a part of the trainer, none into the step loop:

  --debug-dump DIR       every rank writes DIR/rank<R>.pt after the last step: the weights
                         hash before and after the DDP wrap, its local and averaged
                         gradients of the first step (a DDP comm hook: it sees the bucket
                         before and after the all-reduce), final state, optimizer state, an
                         RNG sample
  --debug-step-delay S   sleep S seconds after each step (a post-step callback)
  --debug-slow-rank R:S  rank R sleeps S in each step's data loading: a straggler (a wrapped
                         iterator, inside what ddpkit times as data loading)
  --debug-hang-rank R:N  rank R blocks forever loading step N's data: a hang

The two others are settings, not hooks: --debug-desync-opt (``Args.lr_of``) and
--debug-slow-save (the checkpoint store's pause mid-write).
"""

# No `from __future__ import annotations` here: DDP compares a comm hook's annotations
# with its own types (dist.GradBucket, Future[Tensor]), which postponed ones, strings, fail.
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import ddpkit
import torch
import torch.distributed as dist
from ddptrain_args import Args
from ddptrain_model import Batch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

if TYPE_CHECKING:  # where torch's stubs declare it; torch.distributed does not re-export it
    from torch._C._distributed_c10d import GradBucket
else:
    GradBucket = dist.GradBucket

CommHook = Callable[[None, GradBucket], torch.futures.Future[torch.Tensor]]

AfterStep = Callable[[int, torch.Tensor], None]  # (optimizer steps done, the step's loss)


class Debug:
    """Made before the DDP wrap (``model`` still holds this rank's own initial weights),
    installed once the rest is built."""

    def __init__(self, args: Args, rank: int, model: nn.Module) -> None:
        self.args, self.rank = args, rank
        self.dump: dict[str, Any] = {}
        if args.debug_dump:
            self.dump["pre_wrap_sha"] = ddpkit.weights_sha256(model)

    def install(
        self,
        ddp: DDP,
        optimizer: torch.optim.Optimizer,
        batches: Iterator[list[Batch]],
        after_step: AfterStep,
        done_steps: int,
        total_steps: int,
    ) -> tuple[Iterator[list[Batch]], AfterStep]:
        """The hooks the flags ask for, on the built parts: the data iterator and the
        post-step callback come back wrapped, the comm hook goes into ``ddp``.
        ``done_steps``: the steps done before the first of this run."""
        a = self.args
        if a.debug_dump:
            self.dump["post_wrap_sha"] = ddpkit.weights_sha256(ddp.module)
            ddp.register_comm_hook(None, self._recording_all_reduce(ddp))
        if a.debug_slow_rank or a.debug_hang_rank:
            batches = self._slowed(batches, done_steps)
        if a.debug_step_delay or a.debug_dump:
            after_step = self._after(after_step, ddp, optimizer, total_steps)
        return batches, after_step

    def _recording_all_reduce(self, ddp: DDP) -> CommHook:
        """DDP's own averaging (each grad times 1 / world size, then summed), which records
        each parameter's local gradient before the all-reduce and the average after, in the
        first step's buckets. The warm-up before the first step (ddptrain.warm_up_buckets)
        is the first synced backward, so recording starts with the second."""
        names = {id(p): n for n, p in ddp.module.named_parameters()}
        world, finished = dist.get_world_size(), [0]  # backwards whose last bucket was seen
        local: dict[str, torch.Tensor] = {}
        self.dump["grads_local"], self.dump["grads_avg"] = local, {}

        def hook(_: None, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
            params, buf, first_step = bucket.parameters(), bucket.buffer(), finished[0] == 1
            finished[0] += bucket.is_last()
            if first_step:
                for p, g in zip(params, bucket.gradients(), strict=True):
                    local[names[id(p)]] = g.detach().cpu().clone()
            buf.mul_(1.0 / world)  # as DDP's reducer does: bit-identical averages
            work = dist.all_reduce(buf, async_op=True)
            assert work is not None  # async_op=True always returns its Work
            fut: torch.futures.Future[list[torch.Tensor]] = work.get_future()

            def averaged(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
                out = f.value()[0]
                if first_step:
                    for p, g in zip(params, _split(out, params), strict=True):
                        self.dump["grads_avg"][names[id(p)]] = g.detach().cpu().clone()
                return out

            return fut.then(averaged)

        return hook

    def _slowed(self, batches: Iterator[list[Batch]], done: int) -> Iterator[list[Batch]]:
        slow, hang = self.args.debug_slow_rank, self.args.debug_hang_rank
        delay = slow[1] if slow and slow[0] == self.rank else 0.0
        hang_step = int(hang[1]) if hang and hang[0] == self.rank else None
        if not delay and hang_step is None:
            return batches  # another rank's straggler or hang

        def slowed() -> Iterator[list[Batch]]:
            step = done
            for item in batches:
                step += 1
                if step == hang_step:
                    threading.Event().wait()  # forever: what the hang watchdog is for
                time.sleep(delay)
                yield item

        return slowed()

    def _after(
        self, inner: AfterStep, ddp: DDP, optimizer: torch.optim.Optimizer, total: int
    ) -> AfterStep:
        delay, folder = self.args.debug_step_delay, self.args.debug_dump

        def after(step: int, loss: torch.Tensor) -> None:
            inner(step, loss)
            if delay:
                time.sleep(delay)
            if folder and step == total:
                self._write(folder, ddp, optimizer)

        return after

    def _write(self, folder: str, ddp: DDP, optimizer: torch.optim.Optimizer) -> None:
        # The sample comes from a copy of the global generator: the run draws nothing.
        rng = torch.Generator().set_state(torch.get_rng_state())
        self.dump.update(
            final_sha=ddpkit.weights_sha256(ddp.module),
            state={k: v.detach().cpu().clone() for k, v in ddp.module.state_dict().items()},
            optimizer=optimizer.state_dict(),
            rng_sample=torch.rand(4, generator=rng),
            world_size=dist.get_world_size(),
            rank=self.rank,
        )
        os.makedirs(folder, exist_ok=True)
        torch.save(self.dump, os.path.join(folder, f"rank{self.rank}.pt"))


def _split(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """A bucket's flat buffer as one tensor per parameter (in the bucket's order)."""
    sizes = [p.numel() for p in params]
    return [g.view_as(p) for g, p in zip(torch.split(flat, sizes), params, strict=True)]
