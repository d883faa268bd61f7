"""ddpkit, the module a user's script imports: save, load_latest, log, checkpoint_dir and the
restart-safe init_process_group, under real torchrun (gloo, CPU)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from trainer_harness import ROOT, Launcher, Proc, base_env, done_hash, free_port  # noqa: E402

TRAIN_DIR = ROOT / "train"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
HELPER = SCRIPTS / "helper_train.py"
STEPS = 12  # helper_train.py checkpoints every 3 steps, keeps 2


def script_env(ckpt: Path | None, **extra: str) -> dict[str, str]:
    """What ddpdeploy gives a script: ddpkit's folder on PYTHONPATH, the checkpoint dir."""
    path = os.pathsep.join(p for p in (str(TRAIN_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, **extra}
    if ckpt is not None:
        env["DDPDEPLOY_CHECKPOINT_DIR"] = str(ckpt)
    return env


def static_args() -> list[str]:  # torchrun's default rendezvous
    return ["--nnodes", "1", "--master-port", str(free_port()), "--max-restarts", "3"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Proc:
    """helper_train.py run through without interruption."""
    tmp = tmp_path_factory.mktemp("ddpkit_reference")
    with Launcher(tmp) as L:
        return L.run_ok([str(STEPS)], script=HELPER, env=script_env(tmp / "ck"))


pytestmark = pytest.mark.slow


def test_log_prints_only_from_rank_0(reference: Proc) -> None:
    lines = reference.stdout.splitlines()
    events = [json.loads(line)["event"] for line in lines]  # every stdout line is JSON
    assert events.count("start") == 1 and events.count("done") == 1
    assert events.count("step") == STEPS
    assert events.count("checkpoint") == STEPS // 3
    ckpt = [e for e in reference.events() if e["event"] == "checkpoint"]
    assert {e["rank"] for e in ckpt} == {0} and all(e["path"].endswith(".pt") for e in ckpt)
    # Both ranks ran: each said so on stderr, which is not the protocol.
    assert "rank 0 starting" in reference.stderr and "rank 1 starting" in reference.stderr


def test_killed_worker_resumes_to_uninterrupted_weights(tmp_path: Path, reference: Proc) -> None:
    """SIGKILL of rank 0's worker mid-run under static rendezvous, torchrun restarts the
    group, the script resumes from its newest checkpoint. No
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE (static ignores it anyway): the agent's store is
    shared and outlives the restart, which ddpkit.init_process_group must handle itself."""
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        p = L.torchrun(
            [str(STEPS), "0.3"],
            torchrun_args=static_args(),
            script=HELPER,
            env=script_env(ck, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="0"),
        )
        p.wait_for(lambda: p.last_step() >= 7)  # checkpoint 6 is durable (save is a barrier)
        os.kill(p.workers()[0], signal.SIGKILL)
        assert p.wait(180) == 0, p.tail()
    starts = [e for e in p.events() if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["resumed"], p.tail()
    assert starts[1]["resume_step"] in (6, 9)
    assert done_hash(p) == done_hash(reference)
    assert sorted(f.name for f in ck.iterdir()) == [
        ".ddpkit.lock", "ckpt-step-000000009.json", "ckpt-step-000000009.pt",
        "ckpt-step-000000012.json", "ckpt-step-000000012.pt",
    ]  # fmt: skip


def test_corrupt_newest_checkpoint_falls_back_in_one_line(tmp_path: Path, reference: Proc) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(reference.out_path.parent / "ck", ck)  # what the reference run left
    newest = ck / "ckpt-step-000000012.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    with Launcher(tmp_path) as L:
        q = L.run_ok([str(STEPS)], script=HELPER, env=script_env(ck), name="rerun")
    start = next(e for e in q.events() if e["event"] == "start")
    assert start["resume_step"] == 9
    said = [line for line in q.stderr.splitlines() if line.startswith("ddpkit:")]
    assert len(said) == 1, q.stderr
    assert str(newest) in said[0] and "fails its sha256 check" in said[0]
    assert done_hash(q) == done_hash(reference)


def test_checkpoint_dir_unset_is_one_line_exit_2(tmp_path: Path) -> None:
    env = base_env(script_env(None))
    p = subprocess.run(
        [sys.executable, str(HELPER), "3"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    said = [line for line in p.stderr.splitlines() if line.startswith("ddpkit:")]
    assert said == [
        "ddpkit: error: DDPDEPLOY_CHECKPOINT_DIR is not set; give the job a checkpoint volume "
        "(checkpoint: in ddpdeploy.yaml) or pass directory= to ddpkit"
    ]
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_save_and_load_latest_without_a_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single process (no torchrun, no init_process_group): rank 0 of a world of one."""
    import torch

    monkeypatch.syspath_prepend(str(TRAIN_DIR))
    monkeypatch.setenv("DDPDEPLOY_CHECKPOINT_DIR", str(tmp_path / "ck"))
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(k, raising=False)
    import ddpkit

    assert not torch.distributed.is_initialized()
    assert ddpkit.load_latest() is None  # fresh start: no folder yet
    for step in (1, 2, 3):
        path = ddpkit.save({"w": torch.full((3,), float(step)), "step": step}, step, keep=2)
        assert path == str(tmp_path / "ck" / f"ckpt-step-{step:09d}.pt")
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == [".ddpkit.lock"] + [
        f"ckpt-step-{s:09d}.{ext}" for s in (2, 3) for ext in ("json", "pt")
    ]
    sidecar: dict[str, Any] = json.loads((tmp_path / "ck" / "ckpt-step-000000003.json").read_text())
    assert {"sha256", "step", "host", "rank", "world_size", "file"} <= sidecar.keys()
    assert (sidecar["step"], sidecar["rank"], sidecar["world_size"]) == (3, 0, 1)
    latest = ddpkit.load_latest(map_location="cpu")
    assert latest["step"] == 3 and torch.equal(latest["w"], torch.full((3,), 3.0))


def test_a_step_logged_before_any_start_sends_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ported script that logs no `start` still shows each (re)start of its workers,
    which smoke's recovery line waits for; a script's own `start` is filled in."""
    import importlib

    monkeypatch.syspath_prepend(str(TRAIN_DIR))
    monkeypatch.setenv("DDPDEPLOY_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    import ddpkit

    ddpkit = importlib.reload(ddpkit)  # a fresh process: no start sent yet
    assert ddpkit.load_latest() is None
    ddpkit.log("step", step=1, loss=0.5)
    ddpkit.log("step", step=2, loss=0.4)
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["start", "step", "step"]
    assert events[0]["restart_count"] == 2 and events[0]["resumed"] is False
    ddpkit = importlib.reload(ddpkit)
    ddpkit.log("start", total_steps=60, world_size=8)
    (start,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert start["total_steps"] == 60 and start["world_size"] == 8  # the script's own win
    assert start["restart_count"] == 2 and "host" in start


def test_the_chaos_hold_is_read_at_the_first_step_not_at_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    monkeypatch.syspath_prepend(str(TRAIN_DIR))
    for k in ("RANK", "WORLD_SIZE", "DDPDEPLOY_CHAOS_HOLD_STEP"):
        monkeypatch.delenv(k, raising=False)
    import ddpkit

    ddpkit = importlib.reload(ddpkit)  # imported with no chaos env
    monkeypatch.setenv("DDPDEPLOY_CHAOS_HOLD_STEP", "2")
    monkeypatch.setenv("DDPDEPLOY_CHAOS_RELEASE", str(tmp_path / "release"))
    monkeypatch.setenv("DDPDEPLOY_CHAOS_HOLD_S", "0.2")  # nobody releases it: the bound
    for step in (1, 2, 3):
        ddpkit.step_done(step)
    assert capsys.readouterr().out.splitlines() == ['{"event": "step", "step": 2, "hold": true}']


def test_an_event_line_is_one_write_with_its_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found running nanoGPT: under PYTHONUNBUFFERED print() writes a line and its newline
    # in two writes, and torchrun's tee printed the lone newline as a line of its own, so
    # "[rank0]:" ended the line before it; an event line split so would not parse.
    import io

    monkeypatch.syspath_prepend(str(ROOT / "train"))
    import ddpkit

    writes: list[bytes] = []

    class Fd(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            writes.append(bytes(b))
            return len(b)

    # As python -u makes stdout: unbuffered, each text write passed through at once.
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(Fd(), write_through=True))
    ddpkit.emit({"event": "step", "step": 3})
    assert [json.loads(w) for w in writes] == [{"event": "step", "step": 3}]
    assert writes[0].endswith(b"\n")


def test_log_sends_tensor_and_numpy_scalars_and_names_a_field_it_cannot(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found by the sixth hostile pass: log("step", loss=torch.tensor(0.5)) (for loss.item())
    # or a numpy step was json's TypeError traceback naming neither field nor event, on
    # rank 0 only, while the other ranks went on to their next collective.
    import importlib

    import numpy as np
    import torch

    monkeypatch.syspath_prepend(str(TRAIN_DIR))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    import ddpkit

    ddpkit = importlib.reload(ddpkit)
    monkeypatch.setenv("RANK", "0")
    ddpkit.log("step", step=np.int64(4), loss=torch.tensor(0.5), lr=np.float32(0.25),
               extra={"n": [torch.tensor([2])]})  # fmt: skip
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert events[-1] == {"event": "step", "step": 4, "loss": 0.5, "lr": 0.25,
                          "extra": {"n": [2]}}  # fmt: skip
    loop: list[object] = []
    loop.append(loop)
    for rank in ("0", "1"):  # refused alike on a rank that prints nothing
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(TypeError) as e:
            ddpkit.log("step", step=5, loss=torch.ones(2))
        assert str(e.value) == (
            "ddpkit.log('step'): field loss is of type Tensor, which a protocol line cannot "
            "carry; pass a number, string, list or dict (e.g. float(loss))"
        )
        with pytest.raises(TypeError, match=r"field x cannot be JSON \(Circular reference"):
            ddpkit.log("eval", x=loop)
    assert capsys.readouterr().out == ""


# Found by the fifth hostile pass: load_latest(directory="") (a script's
# os.environ.get("CKPT", "")) returned None, a fresh start, saying nothing, where an empty
# $DDPDEPLOY_CHECKPOINT_DIR is one line, exit 2; save(directory="") failed on makedirs('').
def test_an_empty_directory_argument_is_refused_on_load_and_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(TRAIN_DIR))
    monkeypatch.chdir(tmp_path)
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(k, raising=False)
    import ddpkit

    ddpkit.save({"step": 1}, 1, directory=str(tmp_path))  # a checkpoint here, in the cwd
    for call in (
        lambda: ddpkit.load_latest(directory=""),
        lambda: ddpkit.save({}, 2, directory=" "),
    ):
        with pytest.raises(ValueError, match=r"names no folder; pass the checkpoint folder"):
            call()


def test_finish_destroys_the_group_runs_atexit_and_exits_with_its_code(tmp_path: Path) -> None:
    # Found under load in CI: a ddpkit script's workers aborted in torch's teardown after
    # its last line (SIGABRT) 5 times in 6; finish() leaves without that teardown.
    script = (
        "import atexit, ddpkit, torch.distributed as dist\n"
        "ddpkit.init_process_group('gloo', probe=False)\n"
        "atexit.register(lambda: print('atexit ran, group', dist.is_initialized()))\n"
        "print('world', ddpkit.world_size(), flush=False)\n"
        "ddpkit.finish(3)\n"
        "print('never')\n"
    )
    env = base_env({"PYTHONPATH": str(TRAIN_DIR)})
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 3, out.stderr
    assert out.stdout.splitlines() == ["world 1", "atexit ran, group False"], out.stdout


def test_a_console_line_names_at_most_16_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hang line and the save warning listed every rank behind: thousands in a big job.
    monkeypatch.syspath_prepend(str(TRAIN_DIR))
    import ddpkit

    assert ddpkit._first_of([]) == ""
    assert ddpkit._first_of(["0 (a)", "3 (b)"]) == "0 (a), 3 (b)"
    named = ddpkit._first_of([str(r) for r in range(1000)])
    assert named == ", ".join(map(str, range(16))) + " and 984 more"
