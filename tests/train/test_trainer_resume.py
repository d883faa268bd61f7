"""Checkpoint/resume: every interrupted run must end bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainer_harness import Launcher, Proc, done_hash, start_event  # noqa: E402

pytestmark = pytest.mark.slow  # torchrun agents

STEPS = 24
# Dropout draws from torch's global RNG every step: a resume is bit-exact only if nothing
# else (such as starting a DataLoader iterator) draws from it differently after a restart.
# (BatchNorm's buffers come back bit-exact in test_trainer_without_numpy.py.)
ARGS = ["--steps", str(STEPS), "--batch-size", "16", "--model", "ddptrain_model:build_dropout_mlp"]
CKPT_EVERY = 5  # checkpoints at 5, 10, 15, 20 and the final 24


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """weights_sha256 of the uninterrupted run (no checkpointing at all)."""
    tmp = tmp_path_factory.mktemp("reference")
    with Launcher(tmp) as L:
        return done_hash(L.run_ok(ARGS + ["--log-every", "8"]))


def ckpt_args(d: Path, *extra: str) -> list[str]:
    return ARGS + ["--checkpoint-dir", str(d), "--checkpoint-every", str(CKPT_EVERY), *extra]


def wait_step(p: Proc, step: int) -> None:
    p.wait_for(lambda: p.last_step() >= step)


def test_worker_sigkill_torchrun_restart(tmp_path: Path, reference: str) -> None:
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        # No TORCH_DISABLE_SHARE_RDZV_TCP_STORE here: the trainer's own store namespacing
        # must make the restart work on one node with the agent's shared store.
        p = L.torchrun(
            ckpt_args(ck, "--debug-step-delay", "0.15"),
            torchrun_args=["--standalone", "--max-restarts", "2"],
            env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"},
        )
        wait_step(p, 12)
        os.kill(p.workers()[-1], signal.SIGKILL)  # one worker, not rank 0's
        assert p.wait(180) == 0, p.tail()
    starts = [e for e in p.events() if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["restart_count"] == 1
    assert starts[1]["resume_step"] in (10, 15)  # the newest checkpoint before the kill
    assert done_hash(p) == reference


def test_only_global_rank_0_calls_torch_save(tmp_path: Path, reference: str) -> None:
    """Stopped after 10 of 24 steps (mid-epoch) and resumed with --steps 24: the weights of
    one run; and in both runs only global rank 0 saved."""
    # Found by the third hostile pass: every rank torch.save'd its RNG state into memory
    # for the gather to rank 0, torch logged that as "torch.save" usage, and smoke, which
    # reads that log as "this rank saved", warned on every multi-node run of the built-in
    # trainer to save on global rank 0 only.
    ck = tmp_path / "ck"
    args = ckpt_args(ck)
    first = list(args)
    first[first.index("--steps") + 1] = "10"
    usage = {"PYTORCH_API_USAGE_STDERR": "1"}  # as in a smoke run
    tee = ["--standalone", "--tee", "2"]  # each stderr line prefixed [default<rank>]:
    with Launcher(tmp_path) as L:
        p = L.run_ok(first, torchrun_args=tee, env=usage, name="first")
        q = L.run_ok(args, torchrun_args=tee, env=usage, name="second")
    assert start_event(q)["resume_step"] == 10
    assert done_hash(q) == reference  # every rank's RNG state came back whole
    for run in (p, q):
        lines = run.stderr.splitlines()
        saved = {x.split(":")[0] for x in lines if x.endswith("PYTORCH_API_USAGE torch.save")}
        assert saved == {"[default0]"}, run.tail()


def test_kill_during_save_leaves_previous_checkpoint(tmp_path: Path, reference: str) -> None:
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        p = L.torchrun(ckpt_args(ck, "--debug-slow-save", "2"), name="first")
        # Step 5's write takes 2 s; wait until it is committed, then until the step-10
        # write is half-way (its temp file exists), and kill everything.
        p.wait_for(lambda: any(e["event"] == "checkpoint" for e in p.events()), timeout=90)
        p.wait_for(lambda: any(ck.glob(".tmp-*.pt")), timeout=60)
        p.kill(signal.SIGKILL)
        assert not (ck / "ckpt-step-000000010.json").exists()
        killed = {x.name for x in ck.glob(".tmp-*")}
        q = L.run_ok(ckpt_args(ck), name="second")
    assert start_event(q)["resume_step"] == 5
    # The killed writer's temp files stay until ten minutes old (a younger one may be a
    # live writer's, test_ddpkit_store.py); the second run left none of its own.
    assert {x.name for x in ck.glob(".tmp-*")} <= killed
    assert done_hash(q) == reference


def test_sigterm_checkpoints_and_exits_143(tmp_path: Path, reference: str) -> None:
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        # No periodic checkpoints: the one we find must come from the SIGTERM.
        p = L.torchrun(
            ARGS + ["--checkpoint-dir", str(ck), "--debug-step-delay", "0.15"], name="first"
        )
        wait_step(p, 6)
        os.kill(p.workers()[-1], signal.SIGTERM)  # one rank only: all must agree to stop
        assert p.wait(120) != 0  # torchrun reports the workers' non-zero exit
        ev = p.events()
        assert ev[-1]["event"] == "stopped", p.tail()
        stop_step = ev[-1]["step"]
        assert 6 <= stop_step < STEPS
        ckpts = [e for e in ev if e["event"] == "checkpoint"]
        assert [c["step"] for c in ckpts] == [stop_step]
        assert ckpts[0]["rank"] == 0 and ckpts[0]["host"]
        side = json.loads((ck / f"ckpt-step-{stop_step:09d}.json").read_text())
        assert side["step"] == stop_step and side["world_size"] == 2 and len(side["sha256"]) == 64
        assert "exitcode  : 143" in p.stderr or "exitcode: 143" in p.stderr, p.tail()
        q = L.run_ok(ARGS + ["--checkpoint-dir", str(ck)], name="second")
    assert start_event(q)["resume_step"] == stop_step
    assert done_hash(q) == reference


def test_world_size_change_only_at_epoch_boundary(tmp_path: Path) -> None:
    edge, mid = tmp_path / "edge", tmp_path / "mid"
    # One epoch = 32 steps at 2 x 64: a mid-epoch checkpoint at 20, the boundary's at 32.
    args = ["--batch-size", "64", "--log-every", "32"]
    with Launcher(tmp_path) as L:
        L.run_ok([*args, "--epochs", "1", "--checkpoint-dir", str(edge), "--checkpoint-every",
                  "20"], name="edge2")  # fmt: skip
        shutil.copytree(edge, mid)
        for f in mid.glob("ckpt-step-000000032.*"):
            f.unlink()
        # The mid-epoch checkpoint from 2 ranks: 1 rank (one process, no torchrun) refuses
        # it with one clear line ...
        p = L.python([*args, "--epochs", "2", "--checkpoint-dir", str(mid)], name="mid1")
        assert p.wait(120) != 0
        assert "written mid-epoch with world size 2" in p.stderr, p.tail()
        # ... and continues from the boundary's with the second epoch, which has 64 steps
        # in its layout.
        q = L.python([*args, "--epochs", "2", "--checkpoint-dir", str(edge)], name="edge1")
        assert q.wait(120) == 0, q.tail()
    st = start_event(q)
    assert st["resume_step"] == 32 and st["world_size"] == 1 and st["total_steps"] == 96
    assert q.events()[-1]["step"] == 96
