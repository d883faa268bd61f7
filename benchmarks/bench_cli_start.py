"""How fast the CLI answers what is typed most: `ddpdeploy --help`, a command's `--help`,
shell completion on Tab, and `python -c pass` beside them as the floor.

    python benchmarks/bench_cli_start.py [--trials 15]

Each trial is a fresh process of the installed console script (`ddpdeploy` beside this
Python), wall time; the figure is the median, every trial kept. Completion is what bash
runs on Tab after `ddpdeploy re` (typer's `_DDPDEPLOY_COMPLETE=complete_bash`). The load
is the 1-minute load average before and after the run (issue 25 §6's goal: ≤ 0.2 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = str(Path(sys.executable).with_name("ddpdeploy"))
CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "python -c pass": ([sys.executable, "-c", "pass"], {}),
    "ddpdeploy --help": ([SCRIPT, "--help"], {}),
    "ddpdeploy up --help": ([SCRIPT, "up", "--help"], {}),
    "ddpdeploy render --help": ([SCRIPT, "render", "--help"], {}),
    "completion (Tab after `ddpdeploy re`)": (
        [SCRIPT],
        {"_DDPDEPLOY_COMPLETE": "complete_bash", "COMP_WORDS": "ddpdeploy re", "COMP_CWORD": "1"},
    ),
}


def once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_cli_start: {' '.join(argv)} failed: {done.stderr[-500:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=15)
    args = parser.parse_args()
    if not Path(SCRIPT).exists():
        sys.exit(f"bench_cli_start: no console script at {SCRIPT} (pip install -e .)")
    load = os.getloadavg()[0]
    for argv, env in CASES.values():
        once(argv, env)  # warm the page cache and the .pyc files
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.trials):  # interleaved: a load spike hits every case alike
        for name, (argv, env) in CASES.items():
            times[name].append(once(argv, env))
    print(f"load {load:.1f} -> {os.getloadavg()[0]:.1f}, {args.trials} trials\n")
    print("| command | median | min | max |")
    print("| --- | --- | --- | --- |")
    for name, got in times.items():
        print(f"| {name} | {statistics.median(got):.3f} s | {min(got):.3f} s | {max(got):.3f} s |")


if __name__ == "__main__":
    main()
