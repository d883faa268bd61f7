"""ddpkit's diagnostics under real torchrun (gloo, CPU): the start-up probe and its floor,
the ranks event naming a straggler and the hang watchdog; for the built-in trainer and for
a user's script (scripts/diag_train.py). The record of what ran: test_trainer_cli.py."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from trainer_harness import ROOT, Launcher, Proc  # noqa: E402

pytestmark = pytest.mark.slow  # torchrun agents

DIAG = Path(__file__).resolve().parent / "scripts" / "diag_train.py"
HOST = socket.gethostname()
PROBE_ON = {"DDPDEPLOY_PROBE": "1"}


def script_env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT / "train"), **extra}


def of(p: Proc, event: str) -> list[dict[str, Any]]:
    return [e for e in p.events() if e.get("event") == event]


def hang_run(L: Launcher, args: list[str], nproc: int, **kw: Any) -> Proc:
    p = L.torchrun(args, nproc=nproc, torchrun_args=["--standalone", "--max-restarts", "0"], **kw)
    assert p.wait(90) != 0, p.tail()  # bounded: the watchdog ends it
    return p


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Proc, Path]:
    """The built-in trainer on 4 ranks, the probe on: rank 2 slowed in its data loading (a
    ranks event every 10 steps), then rank 3 hung at step 21 (the watchdog after 3 s, the
    stacks into the checkpoint folder)."""
    tmp = tmp_path_factory.mktemp("trainer")
    ck = tmp / "ck"
    args = ["--steps", "500", "--ranks-every", "10", "--debug-slow-rank", "2:0.06",
            "--debug-hang-rank", "3:21", "--hang-timeout-s", "3",
            "--checkpoint-dir", str(ck)]  # fmt: skip
    with Launcher(tmp) as L:
        return hang_run(L, args, nproc=4, env=PROBE_ON), ck


@pytest.fixture(scope="module")
def script_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Proc, Path]:
    """scripts/diag_train.py on 2 ranks: rank 1 slowed 0.05 s a step in its data loading (a
    ranks event every 4 steps), then hung at step 10 (the watchdog after 3 s)."""
    tmp = tmp_path_factory.mktemp("script")
    ck = tmp / "ck"
    env = script_env(DDPDEPLOY_RANKS_EVERY="4", DDPDEPLOY_HANG_TIMEOUT_S="3",
                     DDPDEPLOY_CHECKPOINT_DIR=str(ck))  # fmt: skip
    with Launcher(tmp) as L:
        return hang_run(L, ["500", "1", "0.05", "1", "10"], nproc=2, script=DIAG, env=env), ck


def test_probe_reports_before_training(trainer_run: tuple[Proc, Path]) -> None:
    p, _ = trainer_run
    (probe,) = of(p, "probe")  # rank 0 only
    events = [e["event"] for e in p.events()]
    assert events.index("probe") < events.index("start")  # before training
    assert probe["world_size"] == 4 and probe["backend"] == "gloo"
    assert probe["transport"] == "tcp" and probe["transports"] == {"tcp": [0, 1, 2, 3]}
    assert probe["sizes"][0]["mb"] == 1 and probe["seconds"] < 10
    for s in probe["sizes"]:  # busbw = algbw x 2(n-1)/n
        assert s["busbw_gbps"] > 0 and abs(s["busbw_gbps"] - s["algbw_gbps"] * 1.5) < 0.01
    assert probe["busbw_gbps"] == max(s["busbw_gbps"] for s in probe["sizes"])
    assert probe["slowest"]["rank"] in range(4) and probe["slowest"]["host"] == HOST
    assert probe["ok"] is True and probe["warnings"] == []


def test_probe_floor_fails_before_step_1_in_one_line(tmp_path: Path) -> None:
    with Launcher(tmp_path) as L:
        p = L.torchrun(["--steps", "5", "--probe-min-busbw", "1000000"], env=PROBE_ON)
        assert p.wait(120) != 0
    (probe,) = of(p, "probe")
    assert probe["ok"] is False and probe["min_busbw_gbps"] == 1000000
    assert not of(p, "start") and not of(p, "step")
    lines = [x for x in p.stderr.splitlines() if x.startswith("ddpkit: error:")]
    assert len(lines) == 1 and "below the floor 1000000.0 GB/s" in lines[0]
    assert "exitcode  : 3" in p.stderr  # every worker exits 3


def test_probe_floor_from_env_for_a_script(tmp_path: Path) -> None:
    env = script_env(**PROBE_ON, DDPDEPLOY_PROBE_MIN_BUSBW="1000000")
    with Launcher(tmp_path) as L:
        p = L.torchrun(["3"], script=DIAG, env=env)
        assert p.wait(120) != 0
    assert of(p, "probe")[0]["ok"] is False and not of(p, "done")
    assert "ddpkit: error: probe: bus bandwidth" in p.stderr


def test_slow_rank_is_named_as_straggler_with_its_host(trainer_run: tuple[Proc, Path]) -> None:
    ranks = of(trainer_run[0], "ranks")
    assert [e["step"] for e in ranks] == [10, 20] and all(e["steps"] == 10 for e in ranks)
    for e in ranks:
        assert [s["rank"] for s in e["stragglers"]] == [2]
        assert e["stragglers"][0]["host"] == HOST and e["stragglers"][0]["x_median"] > 1.2
        assert e["slowest"]["rank"] == 2 and e["slowest"]["data_s"] >= 0.06
        assert e["fastest"]["host"] == HOST and e["gather_ms"] > 0


def test_default_window_is_50_steps_then_about_10_s(tmp_path: Path) -> None:
    # Unset --ranks-every: a window of 50 steps, then one sized to ~10 s of steps. A step
    # here takes milliseconds, so the next event is the last step's; had the ranks derived
    # different windows, their all_gathers would not match and the run would not finish.
    with Launcher(tmp_path) as L:
        p = L.run_ok(["--steps", "200"], nproc=2)
    ranks = of(p, "ranks")
    assert [(e["step"], e["steps"]) for e in ranks] == [(50, 50), (200, 150)], ranks
    assert all(e["stragglers"] == [] for e in ranks), ranks  # nobody was slowed


def test_next_window_follows_the_step_time() -> None:
    import ddpkit  # train/, on pyproject.toml's pythonpath

    assert ddpkit.next_every(0.002) == 5000  # 10 s of 2 ms steps
    assert ddpkit.next_every(0.5) == 50  # never fewer than the first window
    assert ddpkit.next_every(1e-7) == ddpkit.RANKS_MAX
    assert ddpkit.next_every(0.0) == 50  # no step time measured: the first window again


def test_script_timing_api_names_the_straggler(script_run: tuple[Proc, Path]) -> None:
    ranks = of(script_run[0], "ranks")
    assert [e["step"] for e in ranks] == [4, 8]
    assert all([s["rank"] for s in e["stragglers"]] == [1] for e in ranks), ranks


def check_hang(p: Proc, folder: Path, rank: int, step: int, n: int, script: bool = False) -> None:
    (hang,) = of(p, "hang")
    assert hang["ranks"] == [rank] and hang["step"] == step
    assert hang["hosts"] == {str(rank): HOST} and hang["dir"] == str(folder)
    assert hang["missing_stacks"] == []
    stacks = sorted(folder.glob("hang-rank*.txt"))
    assert [s.name for s in stacks] == [f"hang-rank{r}.txt" for r in range(n)]
    assert sorted(hang["stacks"]) == [str(s) for s in stacks]
    for s in stacks:  # every thread's stack: the main thread and the watchdog's
        text = s.read_text()
        assert "Current thread" in text and "Thread 0x" in text and "_on_hang" in text
    assert "threading.py" in (folder / f"hang-rank{rank}.txt").read_text()  # Event().wait()
    lines = [x for x in p.stderr.splitlines() if x.startswith("ddpkit: error: hang:")]
    assert len(lines) == 1 and f"reach step {step}: {rank} ({HOST})" in lines[0]
    codes = re.findall(r"exitcode\s+: (-?\d+) \(pid", p.stderr)
    # Every worker leaves by the watchdog's exit; a script that keeps SIGTERM's default
    # may be ended by torchrun's SIGTERM once the first worker left, all stacks written.
    assert len(codes) == n and set(codes) <= ({"124", "-15"} if script else {"124"}), codes
    assert "Connection closed" not in p.stderr  # no worker died of its peers leaving


def test_hung_rank_triggers_the_watchdog(trainer_run: tuple[Proc, Path]) -> None:
    p, ck = trainer_run
    assert max(e["step"] for e in of(p, "step")) == 20
    check_hang(p, ck, rank=3, step=21, n=4)


def test_hung_rank_in_a_script_stacks_in_the_checkpoint_folder(
    script_run: tuple[Proc, Path],
) -> None:
    p, ck = script_run
    check_hang(p, ck, rank=1, step=10, n=2, script=True)


def test_a_script_that_only_logs_steps_gets_the_hang_watchdog(tmp_path: Path) -> None:
    # Found by the sixth hostile pass: docs/own-script.md's port logs steps and never calls
    # step_done, and only step_done armed the watchdog, so a hang ran to smoke's --timeout
    # (900 s by default) with no line. Rank 1 hangs in its own code, not in a timed phase,
    # so the watchdog cannot name it: the line says what it knows, not "all wait".
    ck = tmp_path / "ck"
    env = script_env(DDPDEPLOY_HANG_TIMEOUT_S="3", DDPDEPLOY_CHECKPOINT_DIR=str(ck))
    script = DIAG.parent / "hang_logging_steps.py"
    with Launcher(tmp_path) as L:
        p = hang_run(L, [], nproc=2, script=script, env=env)
    (hang,) = of(p, "hang")
    assert hang["step"] == 3 and hang["ranks"] == [] and hang["missing_stacks"] == []
    assert sorted(x.name for x in ck.glob("hang-rank*.txt")) == ["hang-rank0.txt", "hang-rank1.txt"]
    assert "hang_logging_steps.py" in (ck / "hang-rank1.txt").read_text()
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("ddpkit: error: hang:")]
    assert "ranks that did not reach step 3: none named (every rank finished step 2; " in line
    assert "all wait" not in line
