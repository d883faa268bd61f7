"""A GPU tutorial's setup, unchanged: it pins LOCAL_RANK's GPU before the process group, and
fails on a host without CUDA (a smoke run is always on the CPU)."""

import os

import torch
import torch.distributed as dist


def setup() -> None:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")


setup()
print("never reached", flush=True)
