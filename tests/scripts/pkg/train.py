"""A module entry (`command.module: pkg.train`, run as `torchrun -m pkg.train`)."""

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    print(f"module entry on rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
