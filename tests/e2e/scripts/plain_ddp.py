"""A user's own torchrun script, the way the PyTorch DDP tutorial teaches it, and nothing of
ddpdeploy's: a plain init_process_group("gloo"), a DistributedSampler with set_epoch, a
snapshot (model, optimizer, epoch) saved by global rank 0 under $DDPDEPLOY_CHECKPOINT_DIR
after every epoch and loaded by every rank on start.

What it prints on rank 0 is the event protocol written by hand (docs/events.md: any script
may print it): `start`, a `step` per optimizer step, and `done` with the weights' sha256
(the same bytes ddpkit.weights_sha256 hashes), so the e2e tests can compare a cluster run
with `smoke --local` and time a restart. Deterministic: a run resumed from a snapshot ends
with the weights of one that never stopped (see the throwaway backward below).
"""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def say(event, **fields):
    if dist.get_rank() == 0:
        print(json.dumps({"event": event, **fields}), flush=True)


def weights_sha256(model):
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        raw = tensor.detach().cpu().contiguous().flatten().view(torch.uint8)
        digest.update(bytes(raw.tolist()))
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds per step")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(512, 16, generator=data)
    targets = (inputs[:, :4].sum(1) > 0).long() + 2 * (inputs[:, 4:8].sum(1) > 0).long()
    dataset = TensorDataset(inputs, targets)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    folder = os.environ.get("DDPDEPLOY_CHECKPOINT_DIR", "/tmp")
    snapshot = os.path.join(folder, "snapshot.pt")
    first_epoch = 0
    if os.path.exists(snapshot):
        snap = torch.load(snapshot, map_location="cpu")
        model.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
        first_epoch = snap["epoch"] + 1
    ddp = DDP(model)
    # One throwaway backward before the first real step, in every run: DDP all-reduces its
    # first backward in parameter order, then regroups its buckets in the order gradients
    # became ready. With 3+ ranks that changes the order each gradient is summed in, so a
    # run resumed mid-way (whose first step would use the first grouping) would end a
    # rounding error away from one that never stopped. No step follows it.
    nn.functional.cross_entropy(ddp(inputs[:1]), targets[:1]).backward()
    optimizer.zero_grad()
    steps_per_epoch = len(loader)
    total = args.epochs * steps_per_epoch
    say(
        "start",
        world_size=dist.get_world_size(),
        total_steps=total,
        resumed=first_epoch > 0,
        resume_step=first_epoch * steps_per_epoch,
    )

    step = first_epoch * steps_per_epoch
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            say("step", step=step, loss=round(loss.item(), 6))
            time.sleep(args.step_delay)
        if rank == 0:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
            }
            torch.save(state, snapshot + ".tmp")
            os.replace(snapshot + ".tmp", snapshot)
        dist.barrier()
    say("done", step=step, weights_sha256=weights_sha256(model))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
