"""Prints, from every rank, the CPU threads torch runs with and OMP_NUM_THREADS."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
omp = os.environ.get("OMP_NUM_THREADS", "<unset>")
print(f"rank {rank} threads {torch.get_num_threads()} OMP_NUM_THREADS {omp}", flush=True)
dist.barrier()
dist.destroy_process_group()
