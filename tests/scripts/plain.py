"""A tutorial-style script: plain init_process_group("gloo"), plain text only, no events."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
for epoch in range(3):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    if rank == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    time.sleep(0.2)
if rank == 0:
    print("snapshot saved", flush=True)
dist.destroy_process_group()
