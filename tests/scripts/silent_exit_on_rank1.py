"""Trains a few all-reduces on every rank; rank 1 then ends with exit 5 from an atexit hook
without printing a line of its own (rank 0 prints its steps)."""

import atexit
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    atexit.register(os._exit, 5)
for step in range(3):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        print(f"rank zero step {step}", flush=True)
dist.destroy_process_group()
