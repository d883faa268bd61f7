"""Prints, from every rank, the checkpoint folder the launch contract named and whether
this process can write there (as the pod's UID in compose)."""

import os

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
folder = os.environ.get("DDPDEPLOY_CHECKPOINT_DIR", "")
probe = os.path.join(folder, f"probe-{rank}") if folder else ""
if probe:
    with open(probe, "w") as f:
        f.write("ok")
print(f"rank {rank} checkpoint dir {folder or '<unset>'} writable {bool(probe)}", flush=True)
dist.barrier()
dist.destroy_process_group()
