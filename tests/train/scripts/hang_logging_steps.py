"""docs/own-script.md's port, ddpkit.log("step") on every rank and no step_done: rank 1
sleeps in its own code at step 3 while rank 0 waits in the all-reduce. The hang watchdog
must still end the run (exit 124) with its line.

    torchrun --nproc-per-node 2 hang_logging_steps.py
"""

from __future__ import annotations

import time

import ddpkit
import torch
import torch.distributed as dist


def main() -> None:
    ddpkit.init_process_group("gloo", probe=False)
    ddpkit.log("start", total_steps=5)
    for step in range(1, 6):
        if ddpkit.rank() == 1 and step == 3:
            time.sleep(600)
        t = torch.ones(1)
        dist.all_reduce(t)
        ddpkit.log("step", step=step)
    ddpkit.finish()


if __name__ == "__main__":
    main()
