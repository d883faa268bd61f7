"""GPU-only trainer checks on nccl: DDP semantics, bf16 autocast, bit-exact resume.

Skipped without CUDA (benchmarks/gpu_check.sh runs them on a GPU machine). nccl gives each
rank its own GPU (ddptrain.py binds LOCAL_RANK's device) and cannot run two ranks on one,
so the 2-rank tests need 2 GPUs; the others run with one rank per GPU present, at most 2,
so that a 1-GPU machine still checks nccl, autocast and resume with a world of one.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from trainer_harness import Launcher, Proc, done_hash, start_event  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
NPROC = min(GPUS, 2)  # ranks for the tests that work with one or two

pytestmark = [
    pytest.mark.slow,
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs CUDA (nccl backend, one rank per GPU)"),
]
needs_2_gpus = pytest.mark.skipif(
    GPUS < 2, reason="needs 2 GPUs: nccl cannot run 2 ranks on one GPU"
)

NCCL = ["--backend", "nccl"]
B = 16
STEPS = ["--steps", "10", "--log-every", "5"]
# The CPU tests demand 1e-6 for DDP == big batch. On CUDA a different batch size can pick a
# different GEMM kernel (another summation order), so allow a little more; a broken
# allreduce (sum instead of mean, or none) is off by far more than this.
GPU_TOL = 1e-5


def _max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double().cpu() - b[k].double().cpu()).abs().max()) for k in a)


def _load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def _losses(p: Proc) -> list[float]:
    return [float(e["loss"]) for e in p.events() if e.get("event") == "step"]


@needs_2_gpus
def test_nccl_ddp_equals_big_batch(tmp_path: Path) -> None:
    """2 ranks x B on nccl train like 1 rank x 2B: gradients are averaged over ranks."""
    with Launcher(tmp_path) as L:
        ddp2 = L.torchrun(
            STEPS + NCCL + ["--batch-size", str(B), "--save-final", str(tmp_path / "ddp2.pt")],
            nproc=2,
            name="ddp2",
        )
        big1 = L.torchrun(
            STEPS + NCCL + ["--batch-size", str(2 * B), "--save-final", str(tmp_path / "big1.pt")],
            nproc=1,
            name="big1",
        )
        for p in (ddp2, big1):
            assert p.wait(180) == 0, p.tail()
    assert start_event(ddp2)["device"] == "cuda"
    diff = _max_abs_diff(_load(tmp_path / "ddp2.pt"), _load(tmp_path / "big1.pt"))
    assert diff <= GPU_TOL


@needs_2_gpus
def test_nccl_weights_and_gradients_synced(tmp_path: Path) -> None:
    """The wrap broadcasts rank 0's weights; backward leaves every rank the mean gradient."""
    with Launcher(tmp_path) as L:
        L.run_ok(
            STEPS + NCCL + ["--batch-size", str(B), "--debug-dump", str(tmp_path / "d")],
            nproc=2,
            timeout=180,
        )
    d0, d1 = (_load(tmp_path / "d" / f"rank{r}.pt") for r in range(2))
    assert d0["pre_wrap_sha"] != d1["pre_wrap_sha"]  # seeded seed + rank
    assert d0["post_wrap_sha"] == d1["post_wrap_sha"] == d0["pre_wrap_sha"]
    assert _max_abs_diff(d0["grads_local"], d1["grads_local"]) > 1e-4
    assert _max_abs_diff(d0["grads_avg"], d1["grads_avg"]) == 0.0
    mean = {k: (d0["grads_local"][k] + d1["grads_local"][k]) / 2 for k in d0["grads_local"]}
    assert _max_abs_diff(d0["grads_avg"], mean) <= GPU_TOL
    assert d0["final_sha"] == d1["final_sha"]  # replicas stay identical


def test_bf16_autocast_trains(tmp_path: Path) -> None:
    """--amp on CUDA: bf16 autocast is really on (weights differ from fp32), and it learns."""
    args = ["--steps", "60", "--log-every", "10", "--batch-size", "32", *NCCL]
    with Launcher(tmp_path) as L:
        amp = L.torchrun(args + ["--amp"], nproc=NPROC, name="amp")
        fp32 = L.torchrun(args, nproc=NPROC, name="fp32")
        for p in (amp, fp32):
            assert p.wait(180) == 0, p.tail()
    assert start_event(amp)["device"] == "cuda"
    assert "--amp is GPU-only" not in amp.stderr, amp.tail()
    losses = _losses(amp)
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses), amp.tail()
    assert losses[-1] < 0.9 * losses[0], losses
    assert done_hash(amp) != done_hash(fp32)  # same seeds and data: only autocast differs


def test_nccl_resume_after_worker_sigkill_is_bit_exact(tmp_path: Path) -> None:
    """A worker killed mid-run, restarted by torchrun from the newest checkpoint, ends with
    the weights of an uninterrupted run, bit for bit."""
    args = ["--steps", "24", "--batch-size", "16", "--bn", *NCCL]
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        ref = L.run_ok(args + ["--log-every", "8"], nproc=NPROC, name="ref", timeout=180)
        ckpt = ["--checkpoint-dir", str(ck), "--checkpoint-every", "5"]
        restart = ["--standalone", "--max-restarts", "1"]
        slow = ["--debug-step-delay", "0.15"]  # time to kill it between checkpoints
        p = L.torchrun(args + ckpt + slow, nproc=NPROC, torchrun_args=restart, name="killed")
        p.wait_for(lambda: p.last_step() >= 12, timeout=120)
        os.kill(p.workers()[-1], signal.SIGKILL)  # the last rank's worker
        assert p.wait(180) == 0, p.tail()
    starts = [e for e in p.events() if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["restart_count"] == 1, p.tail()
    assert starts[1]["resume_step"] in (10, 15)
    assert done_hash(p) == done_hash(ref)
