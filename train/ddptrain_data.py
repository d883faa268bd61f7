"""Data for ddptrain.py: this rank's share of the dataset, one optimizer step at a time."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from ddptrain_args import bad_args
from torch.utils.data import DataLoader, Dataset, DistributedSampler

Batch = tuple[torch.Tensor, torch.Tensor]


class ShardedData:
    """The DistributedSampler's order for this rank, cut into per-step micro-batches."""

    def __init__(
        self,
        dataset: Dataset,
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
        self.sampler = DistributedSampler(
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
