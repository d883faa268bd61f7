"""A ddpkit script that never loads what it saved (with `save`: torch.save of a snapshot
under $DDPDEPLOY_CHECKPOINT_DIR every 4 steps on rank 0): after a kill its restarted
workers start over, losing that progress. Without `save` it checkpoints nothing at all.
Its model starts from seeded weights; with `unseeded` from the process's random ones, so
two clean runs end with different weights."""

import os
import sys

import ddpkit
import torch
import torch.distributed as dist

STEPS = 24
ddpkit.init_process_group("gloo")
if "unseeded" not in sys.argv[1:]:
    torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ddpkit.log("start", total_steps=STEPS)
for step in range(1, STEPS + 1):
    opt.zero_grad()
    model(torch.ones(8, 4)).pow(2).mean().backward()
    opt.step()
    if "save" in sys.argv[1:] and step % 4 == 0 and dist.get_rank() == 0:
        torch.save(model.module.state_dict(), os.path.join(ddpkit.checkpoint_dir(), "snap.pt"))
    ddpkit.step_done(step)
ddpkit.log("done", step=STEPS, weights_sha256=ddpkit.weights_sha256(model.module))
dist.destroy_process_group()
