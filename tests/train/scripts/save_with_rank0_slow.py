"""Every rank saves, and rank 0's write is slow (here: the folder's lock held by another
process for a few seconds). The other ranks must not name rank 0 as one that "did not
call save": it did, and is writing.

    torchrun --nproc-per-node 2 save_with_rank0_slow.py
"""

from __future__ import annotations

import ddpkit


def main() -> None:
    ddpkit.init_process_group("gloo", probe=False)
    ddpkit.save({"step": 1}, 1)
    if ddpkit.rank() == 0:
        print("saved", flush=True)
    ddpkit.finish()  # torch 2.13's gloo may abort in the interpreter's teardown


if __name__ == "__main__":
    main()
