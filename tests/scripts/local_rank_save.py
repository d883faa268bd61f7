"""Saves a snapshot on LOCAL_RANK == 0 (a common tutorial slip) instead of global rank 0:
on two nodes, two processes write the same checkpoint file. First every rank writes a
probe file into the checkpoint folder the launch contract named and says which it is."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
folder = os.environ.get("DDPDEPLOY_CHECKPOINT_DIR") or "."
with open(os.path.join(folder, f"probe-{rank}"), "w") as f:
    f.write("ok")
print(f"rank {rank} checkpoint dir {folder} writable True", flush=True)
total = torch.ones(1)
dist.all_reduce(total)
if int(os.environ["LOCAL_RANK"]) == 0:
    torch.save({"total": total}, os.path.join(folder, "snapshot.pt"))
dist.destroy_process_group()
