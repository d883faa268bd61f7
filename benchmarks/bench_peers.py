"""Benchmark (run by hand, not a test): `ddpdeploy smoke` against its nearest peer, TorchX,
for the same 2 nodes x 2 procs x 20-step job of the built-in trainer (issue 18 section 5).

    python benchmarks/bench_peers.py                      # 5 rounds, docker and local
    python benchmarks/bench_peers.py --rounds 3 --pairs docker
    python benchmarks/bench_peers.py --phases             # + smoke --docker phase by phase
    python benchmarks/bench_peers.py --before /tmp/old    # + an older checkout's smoke, e.g.
                                                          # from `git archive REV | tar -x`

Pairs, interleaved round by round (which side goes first alternates):
  docker: `ddpdeploy smoke --docker --nodes 2 --procs 2 --steps 20 --base-image BASE` (the
          image build check included, as a user runs it) against `torchx run -s local_docker
          dist.ddp -j 2x2 --image IMAGE --script <the trainer in the image>`, IMAGE being the
          one that smoke --docker builds (the same bytes run on both sides);
  local:  `ddpdeploy smoke --local ...` against `torchx run -s local_cwd dist.ddp -j 2x2
          --script train/ddptrain.py`.
Both sides pass the trainer `--backend gloo --steps 20` and must end with the same
`weights_sha256` (TorchX's log carries the trainer's `done` line); a mismatch fails the run.
TorchX lives in its own venv outside the clone (--torchx-venv, default
/var/cache/ddpdeploy-bench/torchx-venv: `python -m venv DIR && DIR/bin/pip install torchx
torch==2.13.0`), so neither side imports the other's packages. `wall` is the whole command as
a user waits for it: interpreter start, image check, containers up and down.

--overhead N: what smoke --docker adds around the job, N interleaved trials without the job
(every node's entrypoint is `true`, so the containers exit at once): the image check
(`ddpdeploy build`, up to date: in-process now, a second interpreter before, run from a
--before checkout) and the project's up and down through the SDK path (smoke.composerun).

--phases: one more smoke --docker run with its stderr time-stamped on arrival (the build
check's line, the first line of a node, the report), and `docker events` for the project's
network, containers and teardown.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ["--backend", "gloo", "--steps", "20"]
JOB = ["--nodes", "2", "--procs", "2", "--steps", "20"]
IN_IMAGE = "/opt/ddpdeploy/train/ddptrain.py"  # image_layout's trainer path
_SMOKE_HASH = re.compile(r"^weights_sha256\s+([0-9a-f]{64})", re.M)
_DONE_HASH = re.compile(r'"event": "done".*?"weights_sha256": "([0-9a-f]{64})"')
_IMAGE = re.compile(r"^(?:built|up to date:) (\S+)", re.M)


def base_image() -> str:
    sys.path.insert(0, str(ROOT / "tests" / "docker"))
    from base_images import ensure_images  # the CI's image cache; builds when missing

    return str(ensure_images()["torch"])


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str, int]:
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    return time.monotonic() - start, done.stdout + done.stderr, done.returncode


class Sides:
    """The four commands and where they run."""

    def __init__(self, torchx: Path, base: str, before: Path | None = None) -> None:
        self.torchx = str(torchx / "bin" / "torchx")
        self.base = base
        self.ws = Path(tempfile.mkdtemp(prefix="bench-peers-ws-"))
        (self.ws / "README.md").write_text("built-in trainer\n")
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # --before: that checkout's code, no bytecode written into it.
        self.before_env = None
        if before is not None:
            self.before_env = {**self.env, "PYTHONPATH": str(before)}
            self.before_env["PYTHONDONTWRITEBYTECODE"] = "1"
        # TorchX's env: its own venv only, nothing of ours on the path.
        self.tx_env = {
            k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")
        }
        self.tx_env["PATH"] = f"{torchx / 'bin'}:{os.environ.get('PATH', '')}"
        self.image = ""

    def build(self) -> None:
        cmd = [sys.executable, "-m", "ddpdeploy", "build", "--image", "ddpdeploy-smoke/ddp-train"]
        cmd += ["--base-image", self.base]
        done = subprocess.run(cmd, cwd=self.ws, env=self.env, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise SystemExit("the image build failed (see above)")
        self.image = done.stdout.strip()

    def smoke(self, target: str) -> list[str]:
        cmd = [sys.executable, "-m", "ddpdeploy", "smoke", f"--{target}", *JOB]
        return cmd + (["--base-image", self.base] if target == "docker" else [])

    def torchx_cmd(self, target: str) -> list[str]:
        cmd = [self.torchx, "run", "--workspace", "", "--wait", "--log"]
        if target == "docker":
            cmd += ["-s", "local_docker", "dist.ddp", "-j", "2x2", "--image", self.image]
            return cmd + ["--script", IN_IMAGE, "--", *TRAINER]
        cmd += ["-s", "local_cwd", "dist.ddp", "-j", "2x2"]
        return cmd + ["--script", str(ROOT / "train" / "ddptrain.py"), "--", *TRAINER]

    def run(self, side: str, target: str) -> dict[str, object]:
        if side in ("ddpdeploy", "before"):
            env = self.env if side == "ddpdeploy" else self.before_env
            assert env is not None
            wall, out, code = timed(self.smoke(target), self.ws, env)
            match = _SMOKE_HASH.search(out)
            if target == "docker" and (found := _IMAGE.search(out)):
                self.image = found[1]
        else:
            wall, out, code = timed(self.torchx_cmd(target), self.ws, self.tx_env)
            match = _DONE_HASH.search(out)
        if code != 0 or match is None:
            tail = "\n".join(out.splitlines()[-15:])
            raise SystemExit(f"{side} {target} failed (exit {code}):\n{tail}")
        return {"side": side, "target": target, "wall": wall, "sha": match[1], "load": load()}


def rounds(sides: Sides, pairs: list[str], n: int) -> list[dict[str, object]]:
    trials = []
    if "docker" in pairs and not sides.image:
        sides.build()  # the image smoke --docker builds (and then finds up to date)
    for i in range(n):
        for target in pairs:
            order = ["ddpdeploy", "torchx"] + (["before"] if sides.before_env else [])
            order = order if i % 2 == 0 else order[::-1]
            for side in order:
                t = sides.run(side, target)
                t["round"] = i + 1
                trials.append(t)
                print(
                    f"round {i + 1} {target:6} {side:9} wall {t['wall']:6.2f} s  "
                    f"sha {str(t['sha'])[:12]}  load {t['load']}",
                    flush=True,
                )
    return trials


def summary(trials: list[dict[str, object]], pairs: list[str]) -> None:
    peer = {"docker": "TorchX local_docker", "local": "TorchX local_cwd"}
    print("\n| pair | ddpdeploy trials (s) | median | TorchX trials (s) | median | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    before = [t for t in trials if t["side"] == "before"]
    for target in pairs:
        walls = {
            side: [float(t["wall"]) for t in trials if t["target"] == target and t["side"] == side]  # type: ignore[arg-type]
            for side in ("ddpdeploy", "torchx")
        }
        ours, theirs = (statistics.median(walls[s]) for s in ("ddpdeploy", "torchx"))
        mine, peers = (", ".join(f"{w:.2f}" for w in walls[s]) for s in ("ddpdeploy", "torchx"))
        print(
            f"| smoke --{target} vs {peer[target]} | {mine} | **{ours:.2f}** | {peers} "
            f"| **{theirs:.2f}** | {ours / theirs:.2f} |"
        )
    for target in pairs:
        walls = [float(t["wall"]) for t in before if t["target"] == target]  # type: ignore[arg-type]
        if walls:
            text = ", ".join(f"{w:.2f}" for w in walls)
            mid = statistics.median(walls)
            print(f"| smoke --{target}, the --before checkout | {text} | **{mid:.2f}** | | | |")
    hashes = {str(t["sha"]) for t in trials}
    print(f"\nweights_sha256 of every trial: {', '.join(sorted(hashes))}")
    if len(hashes) != 1:
        raise SystemExit("the trials ended with different weights: not the same job")


def phases(sides: Sides) -> None:
    """One smoke --docker run, its stderr lines and the engine's events time-stamped."""
    events = subprocess.Popen(
        [
            "docker",
            "events",
            "--format",
            "{{json .}}",
            "--filter",
            "type=container",
            "--filter",
            "type=network",
            "--filter",
            "type=volume",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    seen: list[tuple[float, str]] = []

    def read_events() -> None:
        assert events.stdout is not None
        for raw in events.stdout:
            e = json.loads(raw)
            name = e.get("Actor", {}).get("Attributes", {}).get("name", "")
            if "ddpdeploy-ddp-train-" in name:  # smoke runs of the bench job (others too)
                seen.append((time.monotonic(), f"engine: {e['Type']} {e['Action']} {name}"))

    threading.Thread(target=read_events, daemon=True).start()
    time.sleep(0.5)
    start = time.monotonic()
    proc = subprocess.Popen(
        sides.smoke("docker"),
        cwd=sides.ws,
        env=sides.env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    first_node = False
    for line in proc.stderr:
        text = line.rstrip()
        if text.startswith(("smoke:", "built", "up to date")) or (
            ":" in text and not first_node and text.startswith("ddp-train")
        ):
            first_node = first_node or text.startswith("ddp-train")
            seen.append((time.monotonic(), text[:100]))
    proc.wait()
    seen.append((time.monotonic(), "command exited"))
    time.sleep(0.5)
    events.terminate()
    print("\nphases of one smoke --docker run (s since the command started):")
    for at, text in sorted(seen):
        if at >= start:
            print(f"  {at - start:6.2f}  {text}")


def overhead(sides: Sides, trials: int, before: Path | None) -> None:
    """Up, down and the image check (and --before's build) through smoke --docker's one
    path, the SDK (the compose CLI's 1.29 numbers are in docs/benchmarks.md's history)."""
    from ddpdeploy.image.build import build_image
    from ddpdeploy.smoke.compose import LOCAL_REPO, compose_plan
    from ddpdeploy.smoke.composerun import ComposeRun, engine
    from ddpdeploy.spec import JobSpec, spec_with

    client = engine()
    spec = JobSpec.model_validate({"nodes": 2, "procs": 2})
    local = spec_with(spec, {"image": f"{LOCAL_REPO}/{spec.name}"})
    plan = compose_plan(spec, sides.image, {})
    for svc in plan.project["services"].values():
        svc["entrypoint"] = ["true"]
    rows: dict[str, list[float]] = {}

    def note(key: str, seconds: float) -> None:
        rows.setdefault(key, []).append(seconds)

    for _ in range(trials):
        start = time.monotonic()
        run = ComposeRun(plan.project, plan.nodes, "bench", client=client)
        note("up (sdk)", time.monotonic() - start)
        while any(c is None for c in run.exit_codes().values()):
            time.sleep(0.05)
        start = time.monotonic()
        run.stop()
        note("down (sdk)", time.monotonic() - start)
        start = time.monotonic()
        build_image(local, workspace=sides.ws, base_image=sides.base)
        note("image check, in-process (up to date)", time.monotonic() - start)
        if before is not None:
            cmd = [sys.executable, "-m", "ddpdeploy", "build", "--image", "ddpdeploy-bench/before"]
            env = {**sides.env, "PYTHONPATH": str(before), "PYTHONDONTWRITEBYTECODE": "1"}
            start = time.monotonic()
            subprocess.run(
                cmd + ["--base-image", sides.base],
                cwd=sides.ws,
                env=env,
                capture_output=True,
                check=True,
            )
            note("image check, --before (a cached build)", time.monotonic() - start)
    print("\n| phase | trials (s) | median |\n| --- | --- | --- |")
    for key, walls in rows.items():
        text = ", ".join(f"{w:.2f}" for w in walls)
        print(f"| {key} | {text} | **{statistics.median(walls):.2f}** |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", default="docker,local")
    parser.add_argument(
        "--torchx-venv", type=Path, default=Path("/var/cache/ddpdeploy-bench/torchx-venv")
    )
    parser.add_argument("--phases", action="store_true")
    parser.add_argument("--overhead", type=int, default=0, metavar="N")
    parser.add_argument("--before", type=Path, help="an older checkout's smoke, run alongside")
    args = parser.parse_args()
    if not (args.torchx_venv / "bin" / "torchx").exists():
        raise SystemExit(
            f"no TorchX in {args.torchx_venv}: python -m venv DIR && "
            "DIR/bin/pip install torchx torch==2.13.0"
        )
    sides = Sides(args.torchx_venv, base_image(), args.before)
    pairs = [p for p in args.pairs.split(",") if p]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
        f"load {load()}"
    )
    try:
        if args.overhead:
            sides.build()
            overhead(sides, args.overhead, args.before)
        trials = rounds(sides, pairs, args.rounds) if args.rounds else []
        if trials:
            summary(trials, pairs)
        if args.phases:
            phases(sides)
    finally:
        shutil.rmtree(sides.ws, ignore_errors=True)


if __name__ == "__main__":
    main()
