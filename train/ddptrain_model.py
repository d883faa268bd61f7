"""Model and data for ddptrain.py: the built-in MLP, synthetic data, a CPU SyncBatchNorm,
and this rank's DistributedSampler share of a dataset, one optimizer step at a time.

Imports torch and the standard library only. Module name is distinctive on purpose: the
trainer directory is sys.path[0], so a generic name could shadow a user's module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from ddptrain_args import bad_args
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, Dataset, DistributedSampler

Batch = tuple[torch.Tensor, torch.Tensor]  # (input, target) of one micro-batch

IN_FEATURES = 32
NUM_CLASSES = 10


class SyntheticClassification(Dataset[Batch]):
    """Deterministic data: the same tensors on every rank and host, no downloads.

    Generated from a fixed generator (independent of the training seed) so that a resumed run
    and every rank see identical samples; the DistributedSampler decides who gets what.
    """

    def __init__(self, size: int = 4096, data_seed: int = 1234) -> None:
        gen = torch.Generator().manual_seed(data_seed)
        self.x = torch.randn(size, IN_FEATURES, generator=gen)
        teacher = torch.randn(IN_FEATURES, NUM_CLASSES, generator=gen)
        self.y = (self.x @ teacher).argmax(dim=1)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


def build_mlp(batch_norm: bool = False, hidden: int = 64) -> nn.Module:
    """Small MLP: cheap enough for several CPU processes sharing two cores."""
    layers: list[nn.Module] = [nn.Linear(IN_FEATURES, hidden)]
    if batch_norm:
        layers.append(nn.BatchNorm1d(hidden))
    layers += [nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, NUM_CLASSES)]
    return nn.Sequential(*layers)


def build_dropout_mlp(p: float = 0.2, hidden: int = 64) -> nn.Module:
    """The MLP with dropout (``--model ddptrain_model:build_dropout_mlp``): training draws
    from torch's global RNG every step, which the resume tests need to be bit-exact too."""
    return nn.Sequential(
        nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Dropout(p),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(p),
        nn.Linear(hidden, NUM_CLASSES),
    )  # fmt: skip


class CpuSyncBatchNorm(_BatchNorm):
    """BatchNorm whose training-mode batch statistics are all-reduced across ranks.

    torch's SyncBatchNorm only runs on CUDA; this is the CPU (gloo) path. Sum, sum of squares
    and count are all-reduced with the autograd-aware all_reduce, so the backward pass
    all-reduces the gradients of those statistics too and the input gradient is exact for the
    global batch (as SyncBatchNorm's is).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or not dist.is_available() or not dist.is_initialized():
            return super().forward(input)
        self._check_input_dim(input)
        # Reduce over every dim except channels (dim 1), as BatchNorm does.
        dims = [0] + list(range(2, input.dim()))
        count = torch.tensor(
            [input.numel() / input.shape[1]], dtype=input.dtype, device=input.device
        )
        local = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        group = self.group if self.group is not None else dist.group.WORLD
        # torch leaves its autograd-aware all_reduce unannotated
        total: torch.Tensor = dist_fn.all_reduce(local, group=group)  # type: ignore[no-untyped-call]
        c = input.shape[1]
        n = total[2 * c]
        mean = total[:c] / n
        var = total[c : 2 * c] / n - mean * mean  # biased, used to normalise
        run_mean, run_var, tracked = self.running_mean, self.running_var, self.num_batches_tracked
        if self.track_running_stats and run_mean is not None:
            assert run_var is not None and tracked is not None  # tracked means all three
            with torch.no_grad():
                tracked.add_(1)
                momentum = 1.0 / float(tracked) if self.momentum is None else self.momentum
                unbiased = var * n / (n - 1).clamp(min=1)
                run_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                run_var.mul_(1 - momentum).add_(unbiased.detach(), alpha=momentum)
        shape = [1, c] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


def convert_cpu_sync_bn(module: nn.Module, group: dist.ProcessGroup | None) -> nn.Module:
    """Replace every BatchNorm*d in ``module`` with CpuSyncBatchNorm, keeping its state."""
    if isinstance(module, _BatchNorm) and not isinstance(module, CpuSyncBatchNorm):
        new = CpuSyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            group=group,
        )
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, convert_cpu_sync_bn(child, group))
    return module


# ---- this rank's share of the data -----------------------------------------------------
class ShardedData:
    """The DistributedSampler's order for this rank, cut into per-step micro-batches."""

    def __init__(
        self,
        dataset: Dataset[Any],  # the user's: (input, target) items of any kind
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        grad_accum: int,
        drop_last: bool,
        num_workers: int,
        device: torch.device,
    ) -> None:
        self.dataset, self.device, self.rank, self.seed = dataset, device, rank, seed
        self.batch_size, self.grad_accum, self.num_workers = batch_size, grad_accum, num_workers
        self.sampler: DistributedSampler[int] = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
            drop_last=drop_last,
        )  # fmt: skip
        self.steps_per_epoch = len(self.sampler) // batch_size // grad_accum
        if self.steps_per_epoch == 0:
            bad_args(
                f"--batch-size {batch_size} x --grad-accum {grad_accum} exceeds the "
                f"{len(self.sampler)} samples each rank gets per epoch"
            )

    def batches(self, epoch: int, pos: int, steps: int) -> Iterator[list[Batch]]:
        """The micro-batches of the next ``steps`` optimizer steps, starting at step ``pos``
        of ``epoch``: a list of --grad-accum (input, target) pairs on the device per step."""
        per_step = self.grad_accum * self.batch_size
        while steps > 0:
            self.sampler.set_epoch(epoch)  # new shuffle each epoch, identical on every rank
            # The rest of this epoch's order (minus what was consumed before a resume) is a
            # valid sampler for the DataLoader, and keeps resume exact.
            order = list(iter(self.sampler))[pos * per_step : self.steps_per_epoch * per_step]
            loader = DataLoader(
                self.dataset, batch_size=self.batch_size, sampler=order, drop_last=True,
                num_workers=self.num_workers, generator=self.loader_generator(epoch),
            )  # fmt: skip
            it = iter(loader)
            for _ in range(min(steps, self.steps_per_epoch - pos)):
                yield [self._to_device(next(it)) for _ in range(self.grad_accum)]
                steps -= 1
            epoch, pos = epoch + 1, 0

    def loader_generator(self, epoch: int) -> torch.Generator:
        """The DataLoader's own generator, seeded from (seed, rank, epoch).

        Starting an iterator draws the workers' base seed from the loader's generator, by
        default torch's global one: a run resumed mid-epoch starts one more iterator than
        an uninterrupted run, which would shift every later draw (dropout masks). Seeded
        per epoch, the draw is the same wherever in the epoch a run (re)starts, so the
        generator's state is fully given by the checkpointed epoch and needs no saving.
        """
        mixed = ((self.seed * 1_000_003 + self.rank) * 1_000_003 + epoch) % 2**63
        return torch.Generator().manual_seed(mixed)

    def _to_device(self, batch: Batch) -> Batch:
        x, y = batch
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
