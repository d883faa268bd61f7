"""A user's own torchrun script on the ddpkit helpers (train/ddpkit.py): its restart-safe
init_process_group, load_latest on start, save every few steps, log("start"/"step"/"done")
and step_done for the ranks and hang events. Deterministic: each step's data depends on the
step and the rank only, so a resumed run ends with the weights of one that never stopped."""

import argparse
import time

import ddpkit
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()

    ddpkit.init_process_group("gloo")
    rank = ddpkit.rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = ddpkit.load_latest(map_location="cpu")
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    ddpkit.log(
        "start",
        total_steps=args.steps,
        resumed=state is not None,
        resume_step=start,
        world_size=ddpkit.world_size(),
    )
    ddp = DDP(model)
    for step in range(start + 1, args.steps + 1):
        with ddpkit.timed("data"):
            gen = torch.Generator().manual_seed(1000 * step + rank)
            x = torch.randn(16, 8, generator=gen)
            y = x.sum(1, keepdim=True).sin()
        with ddpkit.timed("forward"):
            loss = nn.functional.mse_loss(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        ddpkit.step_done(step)
        ddpkit.log("step", step=step, loss=float(loss))
        if step % args.save_every == 0 or step == args.steps:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            ddpkit.save(state, step)
        time.sleep(args.step_delay)
    ddpkit.end_steps()
    ddpkit.log("done", step=args.steps, weights_sha256=ddpkit.weights_sha256(model))
    ddpkit.finish()  # destroys the group and exits without torch's teardown


if __name__ == "__main__":
    main()
