"""A script whose first ddpkit.save fails on rank 0 (a lambda torch.save cannot pickle) and
which catches that and goes on: every rank must fail alike, then save and end together.

    torchrun --nproc-per-node 2 save_failure.py
"""

from __future__ import annotations

import sys

import ddpkit
import torch


def say(line: str) -> None:
    sys.stderr.write(line + "\n")  # one write: both ranks share the file, lines stay whole
    sys.stderr.flush()


def main() -> None:
    ddpkit.init_process_group("gloo")
    rank = ddpkit.rank()
    for step, state in ((1, {"fn": lambda: 0}), (2, {"w": torch.ones(2)})):
        try:
            ddpkit.save(state, step)
        except Exception as e:  # what a script that carries on does
            say(f"rank {rank} save {step}: {type(e).__name__}: {e}")
    # One more collective: the ranks' collectives are still in step.
    total = torch.tensor([rank + 1.0])
    torch.distributed.all_reduce(total)
    say(f"rank {rank} finished, sum {total.item():g}")
    ddpkit.finish()  # torch 2.13's gloo may abort in the interpreter's teardown


if __name__ == "__main__":
    main()
