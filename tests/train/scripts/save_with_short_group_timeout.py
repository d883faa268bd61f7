"""Every rank saves under a process group timeout of DDPDEPLOY_TEST_GROUP_S seconds while
another process holds the folder's lock: every rank must raise the same CheckpointError
naming the lock, not die in gloo's recv timeout waiting for rank 0.

    torchrun --nproc-per-node 2 save_with_short_group_timeout.py
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import ddpkit


def main() -> None:
    seconds = int(os.environ["DDPDEPLOY_TEST_GROUP_S"])
    how = os.environ.get("DDPDEPLOY_TEST_INIT_METHOD")  # a script's own init_method=
    kwargs = {"init_method": how} if how else {}
    ddpkit.init_process_group("gloo", probe=False, timeout=timedelta(seconds=seconds), **kwargs)
    try:
        ddpkit.save({"step": 1}, 1)
        said = "saved"
    except ddpkit.CheckpointError as e:
        said = f"CheckpointError: {e}"
    sys.stderr.write(f"rank {ddpkit.rank()} {said}\n")  # one write: the lines stay whole
    sys.stderr.flush()
    ddpkit.finish()


if __name__ == "__main__":
    main()
