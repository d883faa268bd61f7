"""Saves a snapshot on LOCAL_RANK == 0 (a common tutorial slip) instead of global rank 0:
on two nodes, two processes write the same checkpoint file."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
folder = os.environ.get("DDPDEPLOY_CHECKPOINT_DIR") or "."
if int(os.environ["LOCAL_RANK"]) == 0:
    torch.save({"total": total}, os.path.join(folder, "snapshot.pt"))
dist.destroy_process_group()
