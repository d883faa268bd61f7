#!/usr/bin/env python3
"""The cost of ddpkit's diagnostics in train/ddptrain.py (run by hand).

  python benchmarks/bench_diagnostics.py [--trials 5] [--steps 400] [--nproc 2]
                                         [--backend gloo|nccl]

Reports, every trial and the median:
  * the probe's start-up cost: the `probe` event's own `seconds` (sweep, transport, hosts)
    and the wall time to rank 0's `start` line with the probe on minus with --no-probe;
  * the `ranks` event's per-step cost: its all_gather (`gather_ms`) spread over the
    --ranks-every window, as a share of the step (`cost_pct`, the event's own field), and
    the steps/s ratio of --ranks-every 10 (five times the default's gathers) over
    --ranks-every 0 (one gather at the end), interleaved per trial.
Throughput is timed between rank 0's step lines, as in bench_trainer.py.

  python benchmarks/bench_diagnostics.py --bookkeeping

times ddpkit's own per-step Python alone (two ``timed`` phases and ``step_done``, its
``ranks`` gather every 50 steps included) in a one-rank gloo group, against the same loop
without ddpkit: CPU work that a loaded VM's throughput ratios cannot resolve.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "train" / "ddptrain.py"


def run(args: list[str], nproc: int, backend: str) -> tuple[list[dict[str, Any]], float, float]:
    """(events, seconds to the start line, steps/s between the 2nd and last step line)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("DDPDEPLOY_PROBE", None)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(TRAINER), "--backend", backend, *args]  # fmt: skip
    t0 = time.perf_counter()
    events, stamps, t_start = [], [], 0.0
    with tempfile.TemporaryDirectory() as cwd:
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        assert p.stdout is not None
        for line in p.stdout:
            if not line.startswith("{"):
                continue
            e = json.loads(line)
            events.append(e)
            if e["event"] == "start":
                t_start = time.perf_counter() - t0
            if e["event"] == "step":
                stamps.append((e["step"], time.perf_counter()))
        assert p.wait() == 0, f"{argv} failed"
    (s1, t1), (s2, t2) = stamps[1], stamps[-1]
    return events, t_start, (s2 - s1) / (t2 - t1)


def bookkeeping(trials: int) -> None:
    """ddpkit's per-step CPU time on 2 gloo ranks (torchrun runs this file's worker)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DDPDEPLOY_PROBE="0")
    worker = [__file__, "--bookkeeping-worker", "--trials", str(trials)]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    argv += worker
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout, end="")


def bookkeeping_worker(trials: int, steps: int = 20000) -> None:
    """Microseconds of CPU per step (process time: a loaded VM's waits are not counted) of
    two ``timed`` phases and ``step_done`` (watchdog armed, the ranks gather every 50
    steps), minus the same loop without ddpkit."""
    import contextlib
    import io

    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "train"))
    import ddpkit

    ddpkit.init_process_group("gloo")
    nothing, clock = contextlib.nullcontext, time.process_time
    try:
        for trial in range(trials):
            dist.barrier()
            t0 = clock()
            for _ in range(steps):  # the same loop, without ddpkit
                with nothing():
                    pass
                with nothing():
                    pass
            base = clock() - t0
            with contextlib.redirect_stdout(io.StringIO()):  # rank 0's ranks events
                t0 = clock()
                for step in range(trial * steps + 1, (trial + 1) * steps + 1):
                    with ddpkit.timed("data"):
                        pass
                    with ddpkit.timed("forward"):
                        pass
                    ddpkit.step_done(step)
                took = clock() - t0
            if ddpkit.rank() == 0:
                us = (took - base) / steps * 1e6
                print(f"trial {trial + 1}: ddpkit bookkeeping {us:.1f} us CPU per step "
                      f"(rank 0), load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            ddpkit.end_steps()
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bookkeeping", action="store_true", help="ddpkit's per-step Python only")
    ap.add_argument("--bookkeeping-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    a = ap.parse_args()
    if a.bookkeeping or a.bookkeeping_worker:
        (bookkeeping_worker if a.bookkeeping_worker else bookkeeping)(a.trials)
        return
    common = ["--steps", str(a.steps), "--log-every", "10"]
    probe_s, startup, cost_pct, ratio = [], [], [], []
    for trial in range(a.trials):
        order = [True, False] if trial % 2 == 0 else [False, True]
        starts, rates = {}, {}
        for with_diag in order:
            extra = ["--ranks-every", "10"] if with_diag else ["--no-probe", "--ranks-every", "0"]
            events, t_start, rate = run(common + extra, a.nproc, a.backend)
            starts[with_diag], rates[with_diag] = t_start, rate
            if with_diag:
                probe_s.append(next(e for e in events if e["event"] == "probe")["seconds"])
                ranks = [e for e in events if e["event"] == "ranks"][1:]  # after warm-up
                cost_pct.append(statistics.median(e["cost_pct"] for e in ranks) / 5)
        startup.append(starts[True] - starts[False])
        ratio.append(rates[True] / rates[False])
        print(f"trial {trial + 1}: probe {probe_s[-1]:.2f} s, start-up +{startup[-1]:.2f} s, "
              f"ranks cost at the default every 50: {cost_pct[-1]:.3f} % of a step, steps/s "
              f"ratio (ranks every 10 / off) {ratio[-1]:.3f}, load "
              f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    med = statistics.median
    print(
        f"median: probe {med(probe_s):.2f} s, start-up +{med(startup):.2f} s, ranks cost "
        f"{med(cost_pct):.3f} % of a step (every 50), steps/s ratio {med(ratio):.3f}"
    )


if __name__ == "__main__":
    main()
