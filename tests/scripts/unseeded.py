"""A ddpkit script whose data is unseeded torch.rand, as the DDP tutorial's dataset is: it
resumes correctly after a kill, yet two clean runs end with different weights."""

import ddpkit
import torch
import torch.distributed as dist

STEPS = 24
ddpkit.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
state = ddpkit.load_latest()
start = 0
if state is not None:
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
ddpkit.log("start", total_steps=STEPS, resumed=state is not None, resume_step=start)
for step in range(start + 1, STEPS + 1):
    opt.zero_grad()
    loss = model(torch.rand(8, 4)).pow(2).mean()  # unseeded: differs run to run
    loss.backward()
    opt.step()
    if step % 4 == 0:
        ddpkit.save(
            {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, step
        )
    ddpkit.step_done(step)
ddpkit.log("done", step=STEPS, weights_sha256=ddpkit.weights_sha256(model.module))
dist.destroy_process_group()
