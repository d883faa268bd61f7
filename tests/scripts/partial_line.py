"""Rank 1 writes a last line without its newline (with argument `escape`: one that ends in
half an escape sequence) and exits 7; rank 0 prints its lines after that write, before the
exit, so torchrun's console runs them on from rank 1's."""

import os
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    tail = "rank one partial \x1b[31" if sys.argv[1:] == ["escape"] else "rank one partial"
    sys.stdout.write(tail)
    sys.stdout.flush()
dist.barrier()  # written: torchrun's tee reads it within its 0.1 s poll
if rank == 1:
    time.sleep(3)
    os._exit(7)
time.sleep(1)
for i in range(3):
    print(f"rank zero line {i}", flush=True)
time.sleep(30)  # ended by the agent after rank 1's exit
