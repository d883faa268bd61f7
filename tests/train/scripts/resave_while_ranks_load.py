"""Two ranks resume from step 5 while another process saves step 5 again: on rank 1 only,
just before it opens the payload, a plain process (no RANK: it writes as a lone rank 0)
re-saves the step with another state. Every rank must resume the same state.

    torchrun --nproc-per-node 2 resave_while_ranks_load.py
"""

from __future__ import annotations

import os
import subprocess
import sys

import ddpkit

RESAVE = "import ddpkit, torch; ddpkit.save({'step': 5, 'w': torch.full((500,), 5.0)}, 5)"
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")  # fmt: skip


def main() -> None:
    ddpkit.init_process_group("gloo", probe=False)
    if ddpkit.rank() == 1:
        opened = ddpkit._open_regular
        resaved: list[bool] = []

        def racing(path: str, *args: object, **kwargs: object) -> object:
            if path.endswith(".pt") and not resaved:
                resaved.append(True)
                env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
                subprocess.run([sys.executable, "-c", RESAVE], env=env, check=True)
            return opened(path, *args, **kwargs)  # type: ignore[arg-type]

        ddpkit._open_regular = racing  # type: ignore[assignment]
    state = ddpkit.load_latest()
    sys.stderr.write(f"rank {ddpkit.rank()} resumed step {state['step']} of {state['w'].numel()}\n")
    sys.stderr.flush()
    ddpkit.finish()


if __name__ == "__main__":
    main()
