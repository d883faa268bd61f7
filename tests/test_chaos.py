"""The chaos harness (benchmarks/bench_chaos.py) as a test: SIGKILLed workers of a smoke
target at different steps and nodes, under a CPU burner the harness starts and stops; every
kill recovers and every run ends with the clean run's weights (how fast: the benchmark's
table, docs/benchmarks.md). Also the chaos hold itself (ddpkit) and its plan.

Size: by default (CI's) one configuration, static rendezvous 2 nodes x 1 process, killed
twice in one run: once on each node (the second time rank 0's), at two steps (the hold's
release counts up), two restarts of one store, which ddpkit's init must survive. The
default c10d's kills are the `smoke --kill-at` tests' (tests/test_smoke_verdicts.py,
tests/test_smoke_scripts.py) and the e2e tier's. DDPDEPLOY_CHAOS_KILLS=N runs the harness's
own configurations (c10d 2x2 and static 2x1) with N kills per target, as
`benchmarks/bench_chaos.py` does with 20. The targets run one after the other: side by side
they loaded the 2 cores far past the burner's 2 x cores, and the test measured its own
neighbour, not the recovery.

Targets: `local` by default. A killed worker in a container is tested on real pods by the
e2e tier (tests/e2e/test_restarts.py: a worker process, a container and a pod killed, c10d
and static) and in a compose project by tests/docker/test_compose_run.py, so CI no longer
runs the docker series here (about three minutes of it);
DDPDEPLOY_CHAOS_TARGETS=local,docker runs both by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_chaos  # benchmarks/, on pyproject.toml's pythonpath
import pytest

from ddpdeploy.smoke import launch
from ddpdeploy.smoke.runner import KillAt

ROOT = Path(__file__).resolve().parents[1]

KILLS = int(os.environ.get("DDPDEPLOY_CHAOS_KILLS", "0"))  # 0: CI's size (above)
TARGETS = os.environ.get("DDPDEPLOY_CHAOS_TARGETS", "local").split(",")


def chaos_configs() -> list[bench_chaos.Config]:
    if KILLS:
        return bench_chaos.configs(TARGETS, KILLS)
    return [bench_chaos.Config(target, "static", (3, 6), procs=1) for target in TARGETS]


# ---- the plan's hold env (fast) ---------------------------------------------------------
def test_hold_env_only_for_a_step_kill():
    assert launch.hold_env(KillAt(step=7), "/tmp/r") == {
        launch.HOLD_STEP_ENV: "7",
        launch.HOLD_RELEASE_ENV: "/tmp/r",
    }
    assert launch.hold_env(KillAt(seconds=20.0), "/tmp/r") == {}
    assert launch.hold_env(KillAt(checkpoint=True)) == {}
    assert launch.hold_env(None) == {}
    assert launch.hold_steps_env([9, 3]) == {launch.HOLD_STEP_ENV: "3,9"}


def test_ddpkit_reads_the_plans_names():
    text = (ROOT / "train" / "ddpkit.py").read_text()
    for name in (launch.HOLD_STEP_ENV, launch.HOLD_RELEASE_ENV):
        assert f'"{name}"' in text


def test_configs_spread_kills_over_steps_and_shapes():
    configs = bench_chaos.configs(["local", "docker"], 20)
    for target in ("local", "docker"):
        mine = [c for c in configs if c.target == target]
        assert sum(len(c.kill_steps) for c in mine) == 20
        assert {c.mode for c in mine} == {"c10d", "static"}
        assert len({s for c in mine for s in c.kill_steps}) > 1
    assert bench_chaos.kill_plan(bench_chaos.Config("local", "c10d", (2,)))[0] == (1, 0)


# ---- the hold in a process (slow: imports torch) ----------------------------------------
_HOLDER = """
import sys, threading, time, ddpkit
out = []
def run():
    for step in range(1, 5):
        ddpkit.step_done(step)
        out.append((step, time.monotonic()))
t = threading.Thread(target=run); t.start()
time.sleep(1.5)
held = [s for s, _ in out]
open(sys.argv[1], "ab").write(b"\\n")
t.join(10)
print("held", held, "after", [s for s, _ in out], flush=True)
"""


def _hold_at_step_2(script: str, release: Path, arg: Path) -> subprocess.CompletedProcess[str]:
    """Run a holder script with ddpkit's hold at step 2 released by ``release``; exit 0."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "train"),
        launch.HOLD_STEP_ENV: "2",
        launch.HOLD_RELEASE_ENV: str(release),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, str(arg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_step_done_holds_at_the_step_until_the_release(tmp_path):
    release = tmp_path / "release"
    done = _hold_at_step_2(_HOLDER, release, release)
    # Steps 1 and 2 done, held inside step_done(2) until the byte came; then 3 and 4.
    assert "held [1] after [1, 2, 3, 4]" in done.stdout, done.stdout
    assert '{"event": "step", "step": 2, "hold": true}' in done.stdout


@pytest.mark.slow
def test_no_hold_once_released(tmp_path):
    # (Without the env nothing holds: every clean run of a ddpkit script shows that.)
    release = tmp_path / "release"
    release.write_bytes(b"\n")  # already released: a restarted worker passes the step
    script = _HOLDER.replace('open(sys.argv[1], "ab").write(b"\\n")', "")
    done = _hold_at_step_2(script, release, tmp_path / "unused")
    assert "held [1, 2, 3, 4]" in done.stdout, done.stdout
    assert "hold" not in done.stdout.replace("held", "")


# ---- the harness under load (slow: torchrun, docker) ------------------------------------
def _docker_image() -> str | None:
    """The built-in trainer's image on the local torch test image; None without an
    engine (a failure under DDPDEPLOY_REQUIRE_DOCKER=1, as in tests/docker)."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        if os.environ.get("DDPDEPLOY_REQUIRE_DOCKER") == "1":
            pytest.fail(f"DDPDEPLOY_REQUIRE_DOCKER=1 but no Docker engine: {exc}")
        return None
    import base_images

    torch_image = base_images.ensure_images(client)["torch"]
    return torch_image


@pytest.fixture(scope="module")
def chaos_image(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if "docker" not in TARGETS:
        yield None
        return
    torch_image = _docker_image()
    if torch_image is None:
        yield None
        return
    repo = f"ddpdeploy-test/chaos-{os.getpid()}"
    ws = tmp_path_factory.mktemp("image-ws")
    (ws / "README.md").write_text("built-in trainer only\n")
    cmd = [sys.executable, "-m", "ddpdeploy", "build", "-w", str(ws), "--image", repo]
    cmd += ["--base-image", torch_image, "--network", "none"]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert built.returncode == 0, built.stderr[-2000:]
    yield built.stdout.strip()
    import docker

    client = docker.from_env()
    for image in client.images.list(name=repo):
        for tag in image.tags:
            client.images.remove(tag, force=True)


def _series(target: str, image: str, ws: Path, out: dict[str, Any]) -> None:
    done, failed = [], []
    for config in [c for c in chaos_configs() if c.target == target]:
        try:
            done.append(bench_chaos.run_series(config, image, ws, timeout=600))
        except Exception as exc:  # reported with the table, not lost in the thread
            failed.append(f"{config.name}: {type(exc).__name__}: {exc}")
    out[target] = (done, failed)


@pytest.mark.slow
def test_chaos_under_load_recovers_to_the_clean_weights(tmp_path, chaos_image, capsys):
    targets = ["local"] + (["docker"] if chaos_image else [])  # docker: by hand (above)
    results: dict[str, Any] = {}
    start = time.monotonic()
    with bench_chaos.cpu_burner(os.cpu_count() or 1):
        for target in targets:
            ws = tmp_path / target
            ws.mkdir()
            _series(target, chaos_image or "", ws, results)
    series = [s for t in targets for s in results[t][0]]
    failed = [f for t in targets for f in results[t][1]]
    report = bench_chaos.table(series) + f"\nwall {time.monotonic() - start:.0f} s"
    with capsys.disabled():
        print("\n" + report)
    assert not failed, "\n".join(failed) + "\n" + report
    for target in targets:
        kills = [r for s in results[target][0] for r in s.rows]
        planned = [k for c in chaos_configs() if c.target == target for k in c.kill_steps]
        assert len(kills) == len(planned), report
    for s in series:
        assert s.clean_sha and s.chaos_sha == s.clean_sha, report
        for row in s.rows:
            # Every kill came back (how fast is benchmarks/bench_chaos.py's, not a test's).
            assert row.recovery is not None, report
