"""Cold-start wall time of `ddpdeploy render` for a 2x8 job, against TorchX's dry run.

Run by hand:  python benchmarks/bench_render.py [--runs 9] [--torchx PATH/TO/torchx]

Each run is a fresh process (cold start, as a user or a CI step runs it); the figure is the
median. TorchX runs `torchx run --workspace "" --dryrun -s kubernetes -cfg queue=default
dist.ddp -j 2x8 --script train.py` from an empty folder holding train.py (no workspace
image build, which needs a registry), when a torchx executable is found.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def median_wall(cmd: list[str], cwd: Path, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if res.returncode != 0:
            sys.exit(f"{cmd[0]} failed: {res.stderr.strip().splitlines()[-1:]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--torchx", default=shutil.which("torchx"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    (work / "train.py").write_text("print('hello')\n")
    ddpdeploy = shutil.which("ddpdeploy") or sys.exit("ddpdeploy is not installed")
    ours = median_wall(
        [
            ddpdeploy,
            "render",
            "--image",
            "ghcr.io/t/train:v1",
            "--nodes",
            "2",
            "--gpus",
            "8",
            "--",
            "--steps",
            "100",
        ],
        work,
        args.runs,
    )
    print(f"ddpdeploy render 2x8      median {ours * 1000:7.1f} ms over {args.runs} runs")
    if not args.torchx:
        print("torchx not found: pass --torchx PATH to compare")
        return
    theirs = median_wall(
        [
            args.torchx,
            "run",
            "--workspace",
            "",
            "--dryrun",
            "-s",
            "kubernetes",
            "-cfg",
            "queue=default",
            "dist.ddp",
            "-j",
            "2x8",
            "--script",
            "train.py",
        ],
        work,
        args.runs,
    )
    print(f"torchx --dryrun 2x8       median {theirs * 1000:7.1f} ms over {args.runs} runs")
    print(f"ratio (torchx / ddpdeploy) {theirs / ours:.2f}x  (target >= 5x)")


if __name__ == "__main__":
    main()
