"""Keeps its snapshot in the working folder, as the pytorch/examples DDP tutorial does
(`snapshot.pt` beside the script): it resumes from any it finds there."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
start = torch.load("snapshot.pt")["next"] if os.path.exists("snapshot.pt") else 0
# Every rank has read it before rank 0 may write it anew (a resumed run trains no
# iteration here, so rank 0 would reach its save while rank 1 still reads).
dist.barrier()
if dist.get_rank() == 0:
    print(f"starting at iteration {start}", flush=True)
for _ in range(start, 3):
    total = torch.ones(1)
    dist.all_reduce(total)
if dist.get_rank() == 0:
    torch.save({"next": 3}, "snapshot.pt")
dist.destroy_process_group()
