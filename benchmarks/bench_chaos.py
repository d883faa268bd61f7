"""Chaos harness: many `--kill-at` kills on both smoke targets, c10d and static, under a
CPU load the harness makes itself; every kill's kill -> next step time, one table.

Each configuration runs the built-in trainer twice on its target: a clean run, then one run
where a worker is SIGKILLed at each of several steps in turn (a different node and local
rank each time; torchrun restarts the group, which resumes from the newest checkpoint).
The kills land at their step because every rank holds there (ddpkit's chaos hold) until
the kill is done. Each run's weights_sha256 must equal the clean run's.

    python benchmarks/bench_chaos.py                    # 20 kills per target, load 2 x cores
    python benchmarks/bench_chaos.py --targets local --kills 5 --load 0

tests/test_chaos.py runs the same harness at the size CI affords.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECOVERY_LIMIT_S = 30.0


# ---- the load --------------------------------------------------------------------------
def _burn() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        pass


@contextlib.contextmanager
def cpu_burner(n: int) -> Iterator[None]:
    """``n`` busy processes while the block runs; always killed on the way out."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_burn, daemon=True) for _ in range(n)]
    try:
        for p in procs:
            p.start()
        yield
    finally:
        for p in procs:
            if p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
            p.join(5)


# ---- one configuration ------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    target: str  # local | docker
    mode: str  # the spec's rendezvous.mode: c10d (the default) | static | elastic
    kill_steps: tuple[int, ...]
    nodes: int = 2
    procs: int = 2
    steps: int = 0  # 0: two past the last kill

    @property
    def name(self) -> str:
        return f"{self.target} {self.mode} {self.nodes}x{self.procs}"

    @property
    def total_steps(self) -> int:
        return self.steps or max(self.kill_steps) + 2


@dataclass
class KillRow:
    config: str
    step: int
    node: str
    what: str
    recovery: float | None = None
    resumed_at: int | None = None


@dataclass
class Series:
    config: Config
    clean_sha: str | None = None
    chaos_sha: str | None = None
    rows: list[KillRow] = field(default_factory=list)
    wall: float = 0.0


def job_spec(config: Config) -> Any:
    from ddpdeploy.spec import JobSpec

    args = ["--steps", str(config.total_steps), "--checkpoint-every", "1", "--no-probe"]
    doc: dict[str, Any] = {
        "name": "chaos",
        "nodes": config.nodes,
        "procs": config.procs,
        "checkpoint": {"claimName": "chaos"},
        "command": {"args": args},
    }
    kills = len(config.kill_steps)
    if config.mode == "static":  # restarts through PET_MAX_RESTARTS (start_target)
        doc["rendezvous"] = {"mode": "static"}
    elif config.mode == "elastic":
        doc["rendezvous"] = {"mode": "elastic", "minNodes": config.nodes,
                             "maxNodes": config.nodes, "maxRestarts": kills}  # fmt: skip
    else:
        doc["rendezvous"] = {"mode": config.mode, "maxRestarts": kills}
    return JobSpec.model_validate(doc)


def start_target(config: Config, spec: Any, image: str, ws: Path, kill: bool) -> Any:
    """The target of one run: the same plan `ddpdeploy smoke` runs, with the chaos hold at
    every kill step of a chaos run."""
    from ddpdeploy.smoke import launch

    restarts = len(config.kill_steps) if not spec.c10d else None
    steps = list(config.kill_steps) if kill else []
    if config.target == "local":
        from ddpdeploy.paths import trainer_script
        from ddpdeploy.smoke.local import LocalRun, fresh_folder

        folder = ws / ".ddpdeploy" / "checkpoints" / "chaos"
        fresh_folder(folder, keep=False)
        hold = launch.hold_steps_env(steps) if steps else None
        port = _free_port()
        nodes = launch.local_nodes(spec, port, str(trainer_script()), str(folder), restarts, hold)
        return LocalRun(nodes, ws)
    from ddpdeploy.smoke.compose import compose_plan
    from ddpdeploy.smoke.composerun import ComposeRun

    hold = launch.hold_steps_env(steps, launch.CONTAINER_RELEASE) if steps else {}
    job = compose_plan(spec, image, launch.run_env(restarts, hold=hold))
    release = launch.CONTAINER_RELEASE if steps else None
    return ComposeRun(job.project, job.nodes, job.name, release=release)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunFailed(Exception):
    pass


def follow(target: Any, config: Config, kills: list[tuple[int, int]], timeout: float) -> Any:
    """Follow one run to its end; at each held kill step SIGKILL the next (node, local
    rank) of ``kills`` and time kill -> the restarted group's first step. Returns (done
    event fields, kill rows)."""
    from ddpdeploy.events import Event, parse_event, split_ranks

    def rank0_events(text: str) -> list[Event]:
        # A killed rank's partial line runs on into the next rank's: each is its own.
        found = [parse_event(t) for rank, t in split_ranks(text) if rank in (0, None)]
        return [e for e in found if e is not None]

    names = [n.name for n in target.nodes]
    rows: list[KillRow] = []
    pending: KillRow | None = None
    kill_at = 0.0
    restarted = False
    done: dict[str, Any] | None = None
    started = time.monotonic()
    tails: list[str] = []
    for line in target.events(poll=0.1):
        if line is not None:
            tails = (tails + [f"{line.node}: {line.text}"])[-40:]
            for event in rank0_events(line.text) if line.stream == "stdout" else []:
                if event.kind == "start" and pending is not None:
                    restarted = True
                elif event.kind in ("step", "done"):
                    if pending is not None and restarted:
                        pending.recovery = time.monotonic() - kill_at
                        pending.resumed_at = event.step
                        pending, restarted = None, False
                    if event.kind == "done":
                        done = event.fields
                    elif event.fields.get("hold") and event.step in config.kill_steps:
                        node_i, local = kills[len(rows) % len(kills)]
                        node = names[node_i % len(names)]
                        kill_at = time.monotonic()
                        what = target.kill_worker(node, local)
                        pending = KillRow(config.name, int(event.step), node, what)
                        rows.append(pending)
        failed = target.failed()
        if failed is not None:
            raise RunFailed(f"{config.name}: {failed} failed:\n" + "\n".join(tails[-25:]))
        if target.finished():
            for rest in target.drain():
                tails.append(f"{rest.node}: {rest.text}")
                for event in rank0_events(rest.text):
                    if event.kind == "done":
                        done = event.fields
                        if pending is not None and restarted:
                            pending.recovery = time.monotonic() - kill_at
                            pending.resumed_at = event.step
            break
        if time.monotonic() - started > timeout:
            raise RunFailed(f"{config.name}: no end within {timeout:g} s:\n" + "\n".join(tails))
    return done, rows


def kill_plan(config: Config) -> list[tuple[int, int]]:
    """(node index, local rank) for the kills in turn: every node and local rank."""
    pairs = list(itertools.product(range(config.nodes), range(config.procs)))
    # The node without global rank 0 first (the CLI's choice), then the others.
    return pairs[config.procs :] + pairs[: config.procs]


def run_series(config: Config, image: str, ws: Path, timeout: float = 900) -> Series:
    spec = job_spec(config)
    series = Series(config)
    t0 = time.monotonic()
    with start_target(config, spec, image, ws, kill=False) as target:
        done, _ = follow(target, config, [], timeout)
    series.clean_sha = (done or {}).get("weights_sha256")
    with start_target(config, spec, image, ws, kill=True) as target:
        done, rows = follow(target, config, kill_plan(config), timeout)
    series.chaos_sha = (done or {}).get("weights_sha256")
    series.rows = rows
    series.wall = time.monotonic() - t0
    return series


def table(series: list[Series]) -> str:
    out = [f"{'config':24s} {'kill step':>9s} {'node':22s} {'killed':28s} {'kill->step':>10s}"]
    for s in series:
        for r in s.rows:
            rec = f"{r.recovery:8.1f} s" if r.recovery is not None else "      none"
            out.append(f"{r.config:24s} {r.step:9d} {r.node:22s} {r.what:28s} {rec:>10s}")
        same = "same" if s.clean_sha and s.clean_sha == s.chaos_sha else "DIFFERENT"
        out.append(f"{s.config.name:24s} weights {same} ({(s.chaos_sha or '?')[:12]}), "
                   f"wall {s.wall:.0f} s")  # fmt: skip
    recs = [r.recovery for s in series for r in s.rows if r.recovery is not None]
    if recs:
        out.append(
            f"kills {len(recs)}: kill -> next step median {statistics.median(recs):.1f} s, "
            f"max {max(recs):.1f} s"
        )
    return "\n".join(out)


def configs(targets: list[str], kills: int) -> list[Config]:
    """``kills`` kills per target over two configurations (c10d, the default, 2x2: every
    local rank of both nodes in turn; static 2x1: both nodes; the built-in trainer's
    ddpkit.init_process_group makes static restarts safe), at different steps. Two, not
    four: each configuration costs a clean run and two compose projects, as much as several
    kills."""
    shapes = [("c10d", 2), ("static", 1)]
    out = []
    for target in targets:
        per = [kills // 2 + (1 if i < kills % 2 else 0) for i in range(2)]
        for (mode, procs), n in zip(shapes, per, strict=True):
            if n:
                first = 3 if procs == 1 else 2  # 2, 5, 6, 9, ... and 3, 6, 7, 10, ...
                steps = tuple(first + 2 * i + (i % 2) for i in range(n))
                out.append(Config(target, mode, steps, procs=procs))
    return out


def docker_image() -> str:
    from bench_smoke import docker_image as build

    return build("benchchaos")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="local,docker")
    parser.add_argument("--kills", type=int, default=20, help="kills per target")
    parser.add_argument("--load", type=int, default=2 * (os.cpu_count() or 1),
                        help="busy processes while it runs (default 2 x cores)")  # fmt: skip
    parser.add_argument("--image", help="a ready image for docker (else one is built)")
    parser.add_argument("--json", type=Path, help="write every kill's row here")
    opts = parser.parse_args()
    targets = opts.targets.split(",")
    image = opts.image or (docker_image() if "docker" in targets else "")
    ws = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    done: list[Series] = []
    failures: list[str] = []
    with cpu_burner(opts.load):
        for config in configs(targets, opts.kills):
            try:
                series = run_series(config, image, ws)
            except RunFailed as exc:
                failures.append(str(exc))
                print(f"FAILED {exc}", flush=True)
                continue
            done.append(series)
            print(table([series]), f"\nload {os.getloadavg()[0]:.1f}", flush=True)
    print("\n" + table(done))
    if opts.json:
        rows = [r.__dict__ for s in done for r in s.rows]
        opts.json.write_text(json.dumps(rows, indent=1))
    slow = [r for s in done for r in s.rows if r.recovery is None or r.recovery > RECOVERY_LIMIT_S]
    differ = [s.config.name for s in done if not s.clean_sha or s.clean_sha != s.chaos_sha]
    if failures or slow or differ:
        print(f"failed runs {len(failures)}, kills over {RECOVERY_LIMIT_S:g} s {len(slow)}, "
              f"weights differ {differ}")  # fmt: skip
        sys.exit(1)


if __name__ == "__main__":
    main()
