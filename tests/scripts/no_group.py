"""A script that finds no GPU and returns, as pytorch/examples' ddp/example.py does on a
CPU machine: it prints, exits 0 on every rank, and never joins a process group."""

import torch

if not torch.cuda.is_available():
    print("Unable to locate sufficient GPUs to run this example. Exiting.", flush=True)
