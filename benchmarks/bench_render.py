"""Cold-start wall time of `ddpdeploy render` for a 2x8 job, against TorchX's dry run.

Run by hand:  python benchmarks/bench_render.py [--runs 9] [--torchx PATH/TO/torchx]

Each run is a fresh process (cold start, as a user or a CI step runs it); the figure is the
median. TorchX runs `torchx run --workspace "" --dryrun -s kubernetes -cfg queue=default
dist.ddp -j 2x8 --script train.py` from an empty folder holding train.py (no workspace
image build, which needs a registry), when a torchx executable is found.

Beside them runs the floor: a Typer app with one int option that validates it through a
one-field pydantic model, on the same interpreter as ddpdeploy. No CLI on that stack starts
faster, so torchx / floor is the most any ratio can reach here. The three are interleaved
run by run, so a noisy machine slows each of them alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = """\
import typer
from pydantic import BaseModel


class Spec(BaseModel):
    nodes: int = 1


def main(nodes: int = 1) -> None:
    print(Spec(nodes=nodes).model_dump_json())


typer.run(main)
"""


def wall(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if res.returncode != 0:
        sys.exit(f"{cmd[0]} failed: {res.stderr.strip().splitlines()[-1:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--torchx", default=shutil.which("torchx"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    (work / "train.py").write_text("print('hello')\n")
    (work / "floor.py").write_text(FLOOR)
    ddpdeploy = shutil.which("ddpdeploy") or sys.exit("ddpdeploy is not installed")
    python = str(Path(ddpdeploy).with_name("python"))
    cmds = {
        "ddpdeploy render 2x8": [
            ddpdeploy,
            *("render", "--image", "ghcr.io/t/train:v1", "--nodes", "2", "--gpus", "8"),
            *("--", "--steps", "100"),
        ],
        "floor (Typer + pydantic)": [python, "floor.py", "--nodes", "2"],
    }
    if args.torchx:
        cmds["torchx --dryrun 2x8"] = [
            args.torchx,
            *("run", "--workspace", "", "--dryrun", "-s", "kubernetes"),
            *("-cfg", "queue=default", "dist.ddp", "-j", "2x8", "--script", "train.py"),
        ]
    # A user's install has its bytecode cached: never measure compiling from source.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for cmd in cmds.values():  # warm-up: writes the bytecode caches
        wall(cmd, work, env)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(args.runs):
        for name, cmd in cmds.items():
            times[name].append(wall(cmd, work, env))
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, m in median.items():
        print(f"{name:26} median {m * 1000:7.1f} ms over {args.runs} runs")
    if not args.torchx:
        print("torchx not found: pass --torchx PATH to compare")
        return
    theirs = median["torchx --dryrun 2x8"]
    ours, floor = median["ddpdeploy render 2x8"], median["floor (Typer + pydantic)"]
    print(f"ratio torchx / ddpdeploy   {theirs / ours:.2f}x  (target >= 5x)")
    print(f"ratio torchx / floor       {theirs / floor:.2f}x  (the most reachable)")


if __name__ == "__main__":
    main()
