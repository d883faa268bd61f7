"""The tutorials' default: rank 0 saves to a relative path, i.e. into the workspace, which
is the image's read-only root in a pod (green locally with a warning; refused under
compose, which runs with the pod's settings, unless --writable-rootfs)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    torch.save({"w": torch.ones(2)}, "snapshot.pt")
    print("snapshot saved", flush=True)
dist.barrier()
dist.destroy_process_group()
