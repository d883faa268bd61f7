"""A script that prints only to stderr (no stdout at all)."""

import sys

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print(f"stderr line from rank {dist.get_rank()}", file=sys.stderr, flush=True)
dist.destroy_process_group()
