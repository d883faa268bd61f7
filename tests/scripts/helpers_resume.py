"""Uses the ddpkit helpers: restart-safe init, load_latest on start, save every 2 steps, and
the event lines (start, step, done with weights_sha256), so `smoke --kill-at` can show that
a killed run resumes to the weights of an uninterrupted one."""

import time

import ddpkit
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 16
ddpkit.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
state = ddpkit.load_latest(map_location="cpu")
start = 0
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
ddpkit.log("start", total_steps=STEPS, resumed=state is not None, step=start)
ddp = DDP(model)
for step in range(start + 1, STEPS + 1):
    # Each step's data depends on (step, rank) only, so a resumed run sees what a clean one did.
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 4, generator=gen)
    loss = (ddp(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    ddpkit.log("step", step=step, loss=float(loss))
    if step % 2 == 0:
        ddpkit.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, step)
    time.sleep(0.3)
ddpkit.log("done", step=STEPS, weights_sha256=ddpkit.weights_sha256(model))
dist.destroy_process_group()
