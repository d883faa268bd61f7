"""Benchmark (run by hand, not a test): `ddpdeploy smoke --local` and `--docker` wall time
for 2 nodes x 2 procs and 20 steps, and the `--kill-at` recovery time of both targets.

    python benchmarks/bench_smoke.py --trials 3            # both targets, interleaved
    python benchmarks/bench_smoke.py --targets local --trials 5
    python benchmarks/bench_smoke.py --trace /tmp/trace    # one kill run per target, with
                                                           # every console line time-stamped
    python benchmarks/bench_smoke.py --load 4              # under 4 busy processes (2 x cores)

Every trial runs the CLI as a user would (`python -m ddpdeploy smoke ...` in a scratch
workspace with the built-in trainer) and is printed as it ends, with the load average;
medians at the end. The docker image is built once first (`ddpdeploy build`) on the test
torch image of tests/docker/base_images.py, or taken from --image, so the figures are
"image present". `wall` is the whole command as the user waits for it (interpreter start,
compose up and down included); `runner` is the wall time the command itself reports.

Targets (issue 9): docker <= 30 s, local <= 15 s, recovery <= 10 s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOB = ["--nodes", "2", "--procs", "2", "--steps", "20"]
TARGETS = {"docker": 30.0, "local": 15.0, "recovery": 10.0}
_WALL = re.compile(r"^wall time\s+([\d.]+) s", re.M)
_RECOVERY = re.compile(r"^recovery\s+([\d.]+) s", re.M)
_HASH = re.compile(r"^weights_sha256\s+([0-9a-f]{64})", re.M)


def docker_image(name: str) -> str:
    """`ddpdeploy build` of a scratch workspace on the locally built test torch image."""
    sys.path.insert(0, str(ROOT / "tests" / "docker"))
    from base_images import ensure_images  # the CI's image cache; builds when missing

    base = ensure_images()["torch"]
    ws = Path(tempfile.mkdtemp(prefix="bench-smoke-ws-"))
    (ws / "README.md").write_text("built-in trainer\n")
    cmd = [sys.executable, "-m", "ddpdeploy", "build", "-w", str(ws)]
    cmd += ["--image", f"ddpdeploy-bench/{name}", "--base-image", base]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return done.stdout.strip()


def image_present(image: str) -> bool:
    """Other users of a shared engine may prune images between trials."""
    done = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
    return done.returncode == 0


def one_trial(target: str, kill_at: int | None, image: str, ws: Path) -> dict[str, object]:
    cmd = [sys.executable, "-m", "ddpdeploy", "smoke", f"--{target}", "--name", "benchsmoke"]
    cmd += JOB
    if target == "docker":
        cmd += ["--image", image]
    if kill_at is not None:
        cmd += ["--kill-at", str(kill_at)]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ws, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - start
    if done.returncode != 0:
        return {"ok": False, "wall": wall, "error": done.stderr.strip().splitlines()[-12:]}
    runner = _WALL.search(done.stdout)
    recovery = _RECOVERY.search(done.stdout)
    digest = _HASH.search(done.stdout)
    return {
        "ok": True,
        "wall": wall,
        "runner": float(runner[1]) if runner else None,
        "recovery": float(recovery[1]) if recovery else None,
        "sha": digest[1][:12] if digest else "?",
    }


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def trace(target: str, kill_at: int, image: str, ws: Path, out: Path) -> None:
    """One --kill-at run in this process, every console line of every node stamped with
    the time since the kill-at run started (the runner's own events included)."""
    from ddpdeploy.cli import app
    from ddpdeploy.smoke import runner as smoke_runner
    from ddpdeploy.smoke.backend import Line

    out.mkdir(parents=True, exist_ok=True)
    log = (out / f"{target}.log").open("w")
    t0 = time.monotonic()
    take, chaos = smoke_runner._Run.take, smoke_runner._Run.strike

    def stamped(self: smoke_runner._Run, line: Line) -> None:
        log.write(f"{time.monotonic() - t0:8.3f} {line.node} {line.stream}: {line.text}\n")
        take(self, line)

    def chaos_stamped(self: smoke_runner._Run, when: str) -> None:
        before = self.kill.at if self.kill else None
        chaos(self, when)
        if self.kill and self.kill.at and not before:
            log.write(f"{time.monotonic() - t0:8.3f} RUNNER kill sent: {self.kill.what}\n")

    if target == "docker":
        from ddpdeploy.smoke.composerun import ComposeRun

        compose = ComposeRun._compose

        def compose_stamped(self: ComposeRun, *args: str, timeout: float = 300) -> object:
            log.write(f"{time.monotonic() - t0:8.3f} RUNNER compose {args[0]} ...\n")
            try:
                return compose(self, *args, timeout=timeout)
            finally:
                log.write(f"{time.monotonic() - t0:8.3f} RUNNER compose {args[0]} done\n")

        ComposeRun._compose = compose_stamped  # type: ignore[method-assign]
    from ddpdeploy.smoke.composerun import ComposeRun
    from ddpdeploy.smoke.local import LocalRun

    for cls in (ComposeRun, LocalRun):  # when the runner saw every node end
        cls.drain = _stamped(cls.drain, "drain (all nodes ended)", log, t0)  # type: ignore[method-assign]
    smoke_runner._Run.take = stamped  # type: ignore[method-assign]
    smoke_runner._Run.strike = chaos_stamped  # type: ignore[method-assign]
    args = ["smoke", f"--{target}", "--name", "benchsmoke", *JOB, "--kill-at", str(kill_at)]
    if target == "docker":
        args += ["--image", image]
    cwd = Path.cwd()
    os.chdir(ws)
    try:
        app(args, standalone_mode=False)
    finally:
        os.chdir(cwd)
        smoke_runner._Run.take, smoke_runner._Run.strike = take, chaos  # type: ignore[method-assign]
        log.close()
    print(f"trace: {out / f'{target}.log'}")


def _stamped(fn: Any, what: str, log: Any, t0: float) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        log.write(f"{time.monotonic() - t0:8.3f} RUNNER {what} ...\n")
        try:
            return fn(*args, **kwargs)
        finally:
            log.write(f"{time.monotonic() - t0:8.3f} RUNNER {what} done\n")

    return wrapper


def summarize(results: dict[str, list[dict[str, object]]]) -> None:
    print("\nmedians (successful trials)")
    for key, rows in results.items():
        ok = [r for r in rows if r["ok"]]
        if not ok:
            print(f"  {key:16s} no successful trial")
            continue
        wall = statistics.median(float(r["wall"]) for r in ok)  # type: ignore[arg-type]
        line = f"  {key:16s} n={len(ok)}  wall {wall:5.1f} s"
        recs = [float(r["recovery"]) for r in ok if r["recovery"] is not None]  # type: ignore[arg-type]
        if recs:
            line += f"  recovery {statistics.median(recs):5.1f} s"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--targets", default="local,docker")
    parser.add_argument("--kill-at", type=int, default=10)
    parser.add_argument("--no-kill", action="store_true", help="wall time trials only")
    parser.add_argument("--image", help="a ready image for --docker (else one is built)")
    parser.add_argument("--trace", type=Path, help="write time-stamped kill runs here")
    parser.add_argument("--load", type=int, default=0,
                        help="busy processes while it runs (issue 18: 2 x cores)")  # fmt: skip
    opts = parser.parse_args()
    from bench_chaos import cpu_burner  # beside this script

    with cpu_burner(opts.load):
        run(opts)


def run(opts: argparse.Namespace) -> None:
    targets = opts.targets.split(",")
    image = opts.image or ("" if "docker" not in targets else docker_image("benchsmoke"))
    ws = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
    (ws / "README.md").write_text("built-in trainer\n")
    if opts.trace:
        for target in targets:
            trace(target, opts.kill_at, image, ws, opts.trace)
        return
    kinds = [(t, None) for t in targets]
    if not opts.no_kill:
        kinds += [(t, opts.kill_at) for t in targets]
    results: dict[str, list[dict[str, object]]] = {}
    for trial in range(1, opts.trials + 1):
        for target, kill_at in kinds:  # interleaved: load drifts hit every kind alike
            key = target if kill_at is None else f"{target} kill-at"
            if target == "docker" and not image_present(image):
                print(f"note: {image} was removed; building it again (not timed)")
                image = docker_image("benchsmoke")
            row = one_trial(target, kill_at, image, ws)
            results.setdefault(key, []).append(row)
            print(f"trial {trial} {key:16s} load {load():14s} {row}", flush=True)
    summarize(results)


if __name__ == "__main__":
    main()
