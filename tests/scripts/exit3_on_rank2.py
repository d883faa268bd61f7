"""Global rank 2 exits with code 3 while its peers wait for it in a collective."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
if rank == 2:
    print("rank two: giving up with code 3", flush=True)
    sys.exit(3)
dist.all_reduce(torch.ones(1))  # the others fail here once rank 2 is gone
print("never reached", flush=True)
