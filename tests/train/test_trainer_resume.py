"""Checkpoint/resume: every interrupted run must end bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainer_harness import Launcher, Proc, done_hash, free_port, start_event  # noqa: E402

pytestmark = pytest.mark.slow  # torchrun agents

STEPS = 24
ARGS = ["--steps", str(STEPS), "--batch-size", "16", "--bn"]
CKPT_EVERY = 5  # checkpoints at 5, 10, 15, 20 and the final 24


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """weights_sha256 of the uninterrupted run (no checkpointing at all)."""
    tmp = tmp_path_factory.mktemp("reference")
    with Launcher(tmp) as L:
        return done_hash(L.run_ok(ARGS + ["--log-every", "8"]))


# Dropout draws from torch's global RNG every step: a resume is bit-exact only if nothing
# else (such as starting a DataLoader iterator) draws from it differently after a restart.
DROPOUT = [
    "--steps",
    str(STEPS),
    "--batch-size",
    "16",
    "--model",
    "ddptrain_model:build_dropout_mlp",
]


@pytest.fixture(scope="module")
def dropout_reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("dropout_reference")
    with Launcher(tmp) as L:
        return done_hash(L.run_ok(DROPOUT + ["--log-every", "8"]))


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


def test_static_rendezvous_restart_without_contract_env(tmp_path: Path, reference: str) -> None:
    """Plain `torchrun --nproc-per-node 2` (static rendezvous) also restarts cleanly."""
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        p = L.torchrun(
            ckpt_args(ck, "--debug-step-delay", "0.15"),
            torchrun_args=["--master-port", str(free_port()), "--max-restarts", "1"],
            env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"},
        )
        wait_step(p, 7)
        os.kill(p.workers()[0], signal.SIGKILL)  # rank 0's worker this time
        assert p.wait(180) == 0, p.tail()
    assert start_event(p)["resume_step"] in (5, 10)
    assert done_hash(p) == reference


def test_dropout_model_resumes_bit_exact_mid_epoch(tmp_path: Path, dropout_reference: str) -> None:
    """Stopped after 10 of 24 steps (mid-epoch), resumed: the same weights as one run."""
    ck = tmp_path / "ck"
    first = [*DROPOUT, "--checkpoint-dir", str(ck)]
    first[first.index("--steps") + 1] = "10"
    with Launcher(tmp_path) as L:
        L.run_ok(first, name="first")
        q = L.run_ok([*DROPOUT, "--checkpoint-dir", str(ck)], name="second")
    assert start_event(q)["resume_step"] == 10
    assert done_hash(q) == dropout_reference


def test_only_global_rank_0_calls_torch_save(tmp_path: Path, dropout_reference: str) -> None:
    # Found by the third hostile pass: every rank torch.save'd its RNG state into memory
    # for the gather to rank 0, torch logged that as "torch.save" usage, and smoke, which
    # reads that log as "this rank saved", warned on every multi-node run of the built-in
    # trainer to save on global rank 0 only.
    ck = tmp_path / "ck"
    args = [*DROPOUT, "--checkpoint-dir", str(ck), "--checkpoint-every", str(CKPT_EVERY)]
    first = list(args)
    first[first.index("--steps") + 1] = "10"
    usage = {"PYTORCH_API_USAGE_STDERR": "1"}  # as in a smoke run
    tee = ["--standalone", "--tee", "2"]  # each stderr line prefixed [default<rank>]:
    with Launcher(tmp_path) as L:
        p = L.run_ok(first, torchrun_args=tee, env=usage, name="first")
        q = L.run_ok(args, torchrun_args=tee, env=usage, name="second")
    assert start_event(q)["resume_step"] == 10
    assert done_hash(q) == dropout_reference  # every rank's RNG state came back whole
    for run in (p, q):
        lines = run.stderr.splitlines()
        saved = {x.split(":")[0] for x in lines if x.endswith("PYTORCH_API_USAGE torch.save")}
        assert saved == {"[default0]"}, run.tail()


def test_dropout_model_worker_sigkill_restart(tmp_path: Path, dropout_reference: str) -> None:
    ck = tmp_path / "ck"
    args = [*DROPOUT, "--checkpoint-dir", str(ck), "--checkpoint-every", str(CKPT_EVERY)]
    with Launcher(tmp_path) as L:
        p = L.torchrun(
            [*args, "--debug-step-delay", "0.15"],
            torchrun_args=["--standalone", "--max-restarts", "2"],
        )
        wait_step(p, 12)
        os.kill(p.workers()[-1], signal.SIGKILL)
        assert p.wait(180) == 0, p.tail()
    assert start_event(p)["resume_step"] in (10, 15)
    assert done_hash(p) == dropout_reference


def test_agent_sigkill_then_fresh_launch(tmp_path: Path, reference: str) -> None:
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        p = L.torchrun(ckpt_args(ck, "--debug-step-delay", "0.15"), name="first")
        wait_step(p, 12)
        p.kill(signal.SIGKILL)  # agent and workers at once, as a node loss would
        killed_at = p.last_step()
        assert killed_at % CKPT_EVERY != 0 or killed_at > 12
        q = L.run_ok(ckpt_args(ck), name="second")
    st = start_event(q)
    assert st["resumed"] and st["resume_step"] in (10, 15)
    assert done_hash(q) == reference


def test_corrupt_newest_checkpoint_is_skipped(tmp_path: Path, reference: str) -> None:
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        L.run_ok(ckpt_args(ck, "--keep", "3"), name="first")
        steps = sorted(int(p.stem.split("-")[-1]) for p in ck.glob("ckpt-step-*.json"))
        assert steps == [15, 20, 24]  # --keep 3
        newest = ck / "ckpt-step-000000024.pt"
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0xFF
        newest.write_bytes(bytes(data))
        # Re-running the finished job: falls back to step 20 and re-does the last 4 steps.
        q = L.run_ok(ckpt_args(ck), name="second")
    assert start_event(q)["resume_step"] == 20
    assert "fails its sha256 check" in q.stderr
    assert done_hash(q) == reference


def test_kill_during_save_leaves_previous_checkpoint(tmp_path: Path, reference: str) -> None:
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        p = L.torchrun(ckpt_args(ck, "--debug-slow-save", "3"), name="first")
        # Step 5's write takes 3 s; wait until it is committed, then until the step-10
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
    mid, edge = tmp_path / "mid", tmp_path / "edge"
    with Launcher(tmp_path) as L:
        # Mid-epoch checkpoint from 2 ranks: 1 rank refuses it with one clear line.
        L.run_ok(["--steps", "3", "--checkpoint-dir", str(mid)], name="mid2")
        p = L.torchrun(["--steps", "6", "--checkpoint-dir", str(mid)], nproc=1, name="mid1")
        assert p.wait(120) != 0
        assert "written mid-epoch with world size 2" in p.stderr, p.tail()
        # Epoch-boundary checkpoint (1 epoch = 32 steps at 2 x 64): 1 rank continues with
        # the second epoch, which has 64 steps in its layout.
        L.run_ok(
            [
                "--epochs",
                "1",
                "--batch-size",
                "64",
                "--log-every",
                "32",
                "--checkpoint-dir",
                str(edge),
            ],
            name="edge2",
        )
        q = L.run_ok(
            [
                "--epochs",
                "2",
                "--batch-size",
                "64",
                "--log-every",
                "32",
                "--checkpoint-dir",
                str(edge),
            ],
            nproc=1,
            name="edge1",
        )
    st = start_event(q)
    assert st["resume_step"] == 32 and st["world_size"] == 1 and st["total_steps"] == 96
    assert q.events()[-1]["step"] == 96
