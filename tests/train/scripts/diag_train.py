"""A user's script with ddpkit's diagnostics: the probe (ddpkit.init_process_group runs
it), the timing API and the hang watchdog.

    torchrun --nproc-per-node 4 diag_train.py STEPS [SLOW_RANK SLOW_S] [HANG_RANK HANG_STEP]
"""

from __future__ import annotations

import sys
import threading
import time

import ddpkit
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    steps = int(sys.argv[1])
    slow_rank, slow_s = (int(sys.argv[2]), float(sys.argv[3])) if len(sys.argv) > 3 else (-1, 0)
    hang_rank, hang_step = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (-1, 0)
    ddpkit.init_process_group("gloo")  # the probe runs here (DDPDEPLOY_PROBE=0 skips it)
    rank = ddpkit.rank()
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(1, steps + 1):
        with ddpkit.timed("data"):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
            if rank == slow_rank:
                time.sleep(slow_s)
            if rank == hang_rank and step == hang_step:
                threading.Event().wait()
        with ddpkit.timed("forward"):
            loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ddpkit.step_done(step)
    ddpkit.end_steps()
    ddpkit.log("done", step=steps, run=ddpkit.run_record())
    ddpkit.finish()  # torch 2.13's gloo may abort in the interpreter's teardown


if __name__ == "__main__":
    main()
