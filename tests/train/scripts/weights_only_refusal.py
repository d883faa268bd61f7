"""A script that saves an argparse.Namespace in its state (refused by save, then written
with weights_only=False), then resumes: torch.load(weights_only=True) refuses it on every
rank, which must raise alike, not skip every checkpoint into a fresh start or hang in
mismatched collectives.

    torchrun --nproc-per-node 2 weights_only_refusal.py
"""

from __future__ import annotations

import argparse
import sys

import ddpkit
import torch


def say(line: str) -> None:
    sys.stderr.write(line + "\n")  # one write: both ranks share the file, lines stay whole
    sys.stderr.flush()


def main() -> None:
    ddpkit.init_process_group("gloo", probe=False)
    rank = ddpkit.rank()
    state = {"args": argparse.Namespace(lr=0.1), "w": torch.ones(2)}
    try:
        ddpkit.save(state, 1)  # refused when written, on every rank
    except ddpkit.CheckpointError as e:
        say(f"rank {rank} save: {e}")
    ddpkit.save(state, 1, weights_only=False)  # as trusted: then load_latest refuses it
    try:
        ddpkit.load_latest()
    except ddpkit.CheckpointError as e:
        say(f"rank {rank} load: {e}")
    total = torch.tensor([rank + 1.0])
    torch.distributed.all_reduce(total)  # the ranks' collectives are still in step
    say(f"rank {rank} finished, sum {total.item():g}")
    ddpkit.finish()  # torch 2.13's gloo may abort in the interpreter's teardown


if __name__ == "__main__":
    main()
