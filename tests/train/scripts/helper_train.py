"""A user's script written with ddpkit: resumes from its newest checkpoint on start.

    torchrun --nproc-per-node 2 helper_train.py STEPS [STEP_DELAY_S]

Each step's batch is drawn from a generator seeded by (step, rank), so a resumed run sees
the data an uninterrupted one would; the model state is all there is to restore.
"""

from __future__ import annotations

import hashlib
import sys
import time

import ddpkit
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    steps = int(sys.argv[1])
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    ddpkit.init_process_group("gloo")
    rank = ddpkit.rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = ddpkit.load_latest(map_location="cpu")
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = DDP(model)
    ddpkit.log("start", world_size=ddpkit.world_size(), resumed=state is not None,
               resume_step=start)  # fmt: skip
    print(f"rank {rank} starting at step {start}", file=sys.stderr, flush=True)
    for step in range(start + 1, steps + 1):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ddpkit.log("step", step=step, loss=float(loss))
        if step % 3 == 0:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            ddpkit.save(state, step, keep=2)
        time.sleep(delay)
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(bytes(v.detach().contiguous().view(torch.uint8).flatten().tolist()))
    ddpkit.log("done", step=steps, weights_sha256=h.hexdigest())
    ddpkit.finish()  # torch 2.13's gloo may abort in the interpreter's teardown


if __name__ == "__main__":
    main()
