"""Built-in model, synthetic data and a CPU SyncBatchNorm for ddptrain.py.

Imports torch and the standard library only. Module name is distinctive on purpose: the
trainer directory is sys.path[0], so a generic name could shadow a user's module.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import Dataset

IN_FEATURES = 32
NUM_CLASSES = 10


class SyntheticClassification(Dataset):
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

    def __init__(self, *args, group: dist.ProcessGroup | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
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
        total = dist_fn.all_reduce(local, group=group)
        c = input.shape[1]
        n = total[2 * c]
        mean = total[:c] / n
        var = total[c : 2 * c] / n - mean * mean  # biased, used to normalise
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)  # type: ignore[union-attr]
                momentum = (
                    1.0 / float(self.num_batches_tracked)  # type: ignore[arg-type]
                    if self.momentum is None
                    else self.momentum
                )
                unbiased = var * n / (n - 1).clamp(min=1)
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(  # type: ignore[union-attr]
                    unbiased.detach(), alpha=momentum
                )
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
            module.momentum,  # type: ignore[arg-type]
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
