"""Every rank saves step 1 twice and prints what save returned: the second payload has a
name of its own (the first still held ckpt-step-000000001.pt), and every rank must be told
rank 0's name, not guess the usual one.

    torchrun --nproc-per-node 2 save_twice.py
"""

from __future__ import annotations

import sys

import ddpkit


def main() -> None:
    ddpkit.init_process_group("gloo", probe=False)
    for v in (1, 2):
        path = ddpkit.save({"step": 1, "v": v}, 1)
        # One write: print's text and newline may go separately and interleave the ranks.
        sys.stdout.write(f"rank {ddpkit.rank()} saved {path}\n")
        sys.stdout.flush()
    ddpkit.finish()  # torch 2.13's gloo may abort in the interpreter's teardown


if __name__ == "__main__":
    main()
