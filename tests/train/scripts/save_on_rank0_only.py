"""The tutorials' habit, `if rank == 0: save(...)`, with ddpkit.save: rank 1 goes on to the
next step's all-reduce while rank 0 waits in save. ddpkit must say so in one line, soon,
and end the wait at the group's timeout (10 s here) instead of hanging.

    torchrun --nproc-per-node 2 save_on_rank0_only.py
"""

from __future__ import annotations

from datetime import timedelta

import ddpkit
import torch
import torch.distributed as dist


def main() -> None:
    ddpkit.init_process_group("gloo", probe=False, timeout=timedelta(seconds=10))
    for step in (1, 2, 3):
        t = torch.ones(1)
        dist.all_reduce(t)
        if ddpkit.rank() == 0:
            ddpkit.save({"step": step}, step)


if __name__ == "__main__":
    main()
