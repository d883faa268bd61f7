"""A tutorial-style script that resumes: plain init_process_group("gloo"), rank 0 saves a
snapshot to $DDPDEPLOY_CHECKPOINT_DIR every iteration and every rank loads it on start.
Prints plain text only (no events)."""

import os
import time

import torch
import torch.distributed as dist

ITERATIONS = 12
folder = os.environ.get("DDPDEPLOY_CHECKPOINT_DIR")
path = os.path.join(folder, "snapshot.pt") if folder else None

dist.init_process_group("gloo")
rank = dist.get_rank()
start = 0
if path and os.path.exists(path):
    start = torch.load(path)["next"]
    print(f"resumed at iteration {start}", flush=True)
for i in range(start, ITERATIONS):
    total = torch.ones(1)
    dist.all_reduce(total)
    time.sleep(0.3)
    if rank == 0 and path:
        torch.save({"next": i + 1}, path + ".tmp")
        os.replace(path + ".tmp", path)  # whole or not at all
    if rank == 0:
        print(f"iteration {i}", flush=True)
dist.destroy_process_group()
