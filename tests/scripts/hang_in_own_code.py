"""Every rank steps with ddpkit.step_done (which arms the hang watchdog); at step 3 rank 1
sleeps in its own code instead of joining the all-reduce, having printed nothing."""

import time

import ddpkit
import torch
import torch.distributed as dist

ddpkit.init_process_group()
rank = dist.get_rank()
for step in range(1, 6):
    if rank == 1 and step == 3:
        time.sleep(1000)
    dist.all_reduce(torch.ones(1))
    ddpkit.step_done(step)
ddpkit.finish()
