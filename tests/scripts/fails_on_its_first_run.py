"""A few all-reduces on every rank; rank 1 exits 1 after the second, but only the first time
it runs (the file $FLAKY_MARK remembers). Under torchrun's restarts
the second attempt trains to the end: one flaky failure a restart hides."""

import os
import sys
import time

import torch
import torch.distributed as dist

MARK = os.environ["FLAKY_MARK"]
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
for step in range(1, 7):
    dist.all_reduce(t)
    time.sleep(0.3)
    if rank == 0:
        print(f"step {step}", flush=True)
    if step == 2 and rank == 1 and not os.path.exists(MARK):
        open(MARK, "w").close()
        print("rank 1 fails on its first run", flush=True)
        sys.exit(1)
dist.destroy_process_group()
