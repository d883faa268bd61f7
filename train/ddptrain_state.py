"""The training state of ddptrain.py: what a checkpoint holds, saved and restored here only.

A checkpoint payload (torch.save, loaded with weights_only=True) is a dict:
  model        ddp.module.state_dict()
  optimizer    optimizer.state_dict()
  scheduler    the LR scheduler's state_dict()
  step         optimizer steps done
  epoch, pos   where the next step starts: the epoch, and optimizer steps already done in it
  world_size, batch_size, grad_accum   the layout that `pos` counts in
  rng          one entry per rank: that rank's RNG states (python, torch, numpy if present,
               cuda if present), gathered to rank 0 by the checkpoint manager
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import ddpkit
import torch
from ddptrain_args import bad_args
from torch import nn

try:  # numpy is optional: seeded and checkpointed only when present
    import numpy as np
except ImportError:  # pragma: no cover - depends on the image
    np = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Layout:
    """What one epoch's steps depend on; a mid-epoch checkpoint resumes only in the same."""

    world_size: int
    batch_size: int
    grad_accum: int


class TrainState:
    """Step, epoch and position in it, RNG, and the model/optimizer/scheduler they go with."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        layout: Layout,
        steps_per_epoch: int,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.layout = layout
        self.steps_per_epoch = steps_per_epoch
        self.step, self.epoch, self.pos = 0, 0, 0
        self._buffer_names = {n for n, _ in model.named_buffers()}

    def advance(self) -> None:
        """One optimizer step done; roll over to the next epoch at its end."""
        self.step += 1
        self.pos += 1
        if self.pos == self.steps_per_epoch:
            self.epoch, self.pos = self.epoch + 1, 0

    def save_parts(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The payload minus "rng", split by when each part changes next.

        ``now``: what the next forward changes in place (BatchNorm buffers) and small
        values; the caller copies it at once. ``deferred``: parameters and optimizer state,
        which change only in the next optimizer.step(), so they can be copied while the
        next forward/backward runs. ``now["model"]`` lists every key (None where the value
        is deferred) to keep the state_dict's key order.
        """
        model_sd = self.model.state_dict()
        buffers = self._buffer_names
        now = {
            "model": {k: (v if k in buffers else None) for k, v in model_sd.items()},
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "pos": self.pos,
            "world_size": self.layout.world_size,
            "batch_size": self.layout.batch_size,
            "grad_accum": self.layout.grad_accum,
        }
        deferred = {
            "model": {k: v for k, v in model_sd.items() if k not in buffers},
            "optimizer": self.optimizer.state_dict(),
        }
        return now, deferred

    def load(self, payload: dict[str, Any], where: str, rank: int, seed: int) -> None:
        """Restore from a payload; exits 2 if it was written mid-epoch in another layout."""
        saved = Layout(payload["world_size"], payload["batch_size"], payload["grad_accum"])
        if saved != self.layout and payload["pos"] != 0:
            now = self.layout
            bad_args(
                f"checkpoint {where} was written mid-epoch with world size {saved.world_size}, "
                f"batch size {saved.batch_size}, grad accum {saved.grad_accum}; resume it with "
                f"the same values (now {now.world_size}, {now.batch_size}, {now.grad_accum})"
            )
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        self.step, self.epoch, self.pos = payload["step"], payload["epoch"], payload["pos"]
        if saved.world_size == self.layout.world_size:
            set_rng_state(payload["rng"][rank])
        else:  # new layout at an epoch boundary: fresh, still per-rank, RNG streams
            seed_everything(seed + rank + 1_000_003 * self.step)


def seed_everything(seed: int) -> None:
    """Seed python, numpy (if present) and torch. The trainer seeds rank r with seed + r:
    per-rank randomness (dropout, augmentation) should differ, and the model still starts
    identical everywhere because DDP broadcasts rank 0's weights when it wraps the model."""
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
    """sha256 over key names and raw bytes of every state_dict tensor, in key order
    (ddpkit's, so a script using ddpkit reports the same hash for the same weights)."""
    return ddpkit.weights_sha256(module)
