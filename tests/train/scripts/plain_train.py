"""A tutorial-style script: plain init_process_group("gloo") over env://, rank 0 saves a
snapshot every epoch and every rank loads it on start. No ddpkit.

    torchrun --nproc-per-node 2 plain_train.py SNAPSHOT EPOCHS [EPOCH_DELAY_S]

Prints `resumed at epoch E` (stderr) and, from rank 0, `weights <sha256>` at the end.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    snapshot, epochs = sys.argv[1], int(sys.argv[2])
    delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    first = 0
    if os.path.exists(snapshot):
        snap = torch.load(snapshot, weights_only=True)
        model.load_state_dict(snap["model"])
        first = snap["epoch"] + 1
        print(f"rank {rank} resumed at epoch {first}", file=sys.stderr, flush=True)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for epoch in range(first, epochs):
        g = torch.Generator().manual_seed(100 * epoch + rank)
        x, y = torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            torch.save({"model": model.state_dict(), "epoch": epoch}, snapshot + ".tmp")
            os.replace(snapshot + ".tmp", snapshot)
            print(f"epoch {epoch} saved", flush=True)
        dist.barrier()
        time.sleep(delay)
    if rank == 0:
        raw = b"".join(bytes(v.contiguous().view(torch.uint8).flatten().tolist())
                       for v in model.state_dict().values())  # fmt: skip
        print(f"weights {hashlib.sha256(raw).hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
