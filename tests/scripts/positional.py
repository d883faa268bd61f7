"""An argparse script with positional arguments, as `smoke -- 3 hello` passes them."""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("epochs", type=int)
parser.add_argument("tag")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
for epoch in range(args.epochs):
    total = torch.ones(1) * (rank + 1)
    dist.all_reduce(total)
    print(f"{args.tag} epoch {epoch} sum {int(total.item())} from rank {rank}", flush=True)
print(f"local rank {os.environ['LOCAL_RANK']} done", flush=True)
dist.destroy_process_group()
