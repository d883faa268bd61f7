"""The group is up, then load_latest meets a bad checkpoint env (DDPDEPLOY_CHECKPOINT_LOCK_S
or DDPDEPLOY_CHECKPOINT_DIR): every rank must exit 2 with its one line, not abort in torch's
teardown of the live gloo group.

    torchrun --nproc-per-node 2 bad_env_after_init.py
"""

from __future__ import annotations

import ddpkit


def main() -> None:
    ddpkit.init_process_group("gloo", probe=False)
    ddpkit.load_latest()
    print("not reached", flush=True)
    ddpkit.finish()


if __name__ == "__main__":
    main()
