"""DDP semantics, one test each, shown on real 2-process gloo runs of train/ddptrain.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from trainer_harness import Launcher, done_hash  # noqa: E402

pytestmark = pytest.mark.slow  # torchrun agents

B = 16
STEPS = ["--steps", "10", "--log-every", "5"]


def _dumps(d: Path, n: int = 2) -> list[dict[str, Any]]:
    return [torch.load(d / f"rank{r}.pt", weights_only=False) for r in range(n)]


def _max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


RECORDING_DATA = """
import os
import torch
class Recording(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 32, generator=g)
        self.f = open(f'seen{os.environ["RANK"]}.txt', 'a')
    def __len__(self):
        return 64
    def __getitem__(self, i):
        self.f.write(f'{i}\\n'); self.f.flush()
        return self.x[i], i % 10
def make():
    return Recording()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """All launches the tests below inspect, started once (each costs seconds)."""
    tmp = tmp_path_factory.mktemp("semantics")
    (tmp / "recording_data.py").write_text(RECORDING_DATA)
    out: dict[str, Any] = {"tmp": tmp}
    with Launcher(tmp) as L:
        specs = {
            # 2 ranks x B vs 1 rank x 2B: the DDP == big batch identity.
            "ddp2": (2, STEPS + ["--batch-size", str(B), "--save-final", str(tmp / "ddp2.pt")]),
            "big1": (1, STEPS + ["--batch-size", str(2 * B), "--save-final", str(tmp / "big1.pt")]),
            # --grad-accum 2 with micro-batch B/2 (no_sync on the first) vs ddp2.
            "accum": (
                2,
                STEPS
                + [
                    "--batch-size",
                    str(B // 2),
                    "--grad-accum",
                    "2",
                    "--save-final",
                    str(tmp / "accum.pt"),
                ],
            ),
            # Plain BatchNorm, per-rank dumps, a rank-local optimizer difference (rank 1 uses
            # 2x lr); and a dataset that records which samples each rank loads (64 samples,
            # 4 steps an epoch, 2 epochs).
            "bn": (
                2,
                [
                    "--dataset",
                    "recording_data:make",
                    "--batch-size",
                    "8",
                    "--epochs",
                    "2",
                    "--bn",
                    "--debug-desync-opt",
                    "--debug-dump",
                    str(tmp / "bn"),
                ],
            ),
            # CPU SyncBatchNorm vs one rank with the whole batch and plain BatchNorm.
            "syncbn2": (
                2,
                STEPS
                + [
                    "--batch-size",
                    str(B),
                    "--bn",
                    "--sync-bn",
                    "--debug-dump",
                    str(tmp / "syncbn"),
                    "--save-final",
                    str(tmp / "syncbn2.pt"),
                ],
            ),
            "bnbig1": (
                1,
                STEPS
                + ["--batch-size", str(2 * B), "--bn", "--save-final", str(tmp / "bnbig1.pt")],
            ),
        }
        # Two at a time: the host has two cores.
        names = list(specs)
        for i in range(0, len(names), 2):
            procs = []
            for name in names[i : i + 2]:
                nproc, args = specs[name]
                # One rank: one process, no torchrun agent (seconds less on two cores).
                p = L.torchrun(args, nproc=nproc, name=name) if nproc > 1 else L.python(args, name)
                procs.append((name, p))
            for name, p in procs:
                assert p.wait(180) == 0, p.tail()
                out[name] = p
    return out


def test_ddp_equals_big_batch(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    a = torch.load(tmp / "ddp2.pt", weights_only=True)
    b = torch.load(tmp / "big1.pt", weights_only=True)
    assert _max_abs_diff(a, b) <= 1e-6


def test_initial_weights_synced_at_wrap(runs: dict[str, Any]) -> None:
    d0, d1 = _dumps(runs["tmp"] / "bn")
    # Ranks are seeded seed + rank, so each builds a different model ...
    assert d0["pre_wrap_sha"] != d1["pre_wrap_sha"]
    # ... and DDP's constructor broadcasts rank 0's weights to all.
    assert d0["post_wrap_sha"] == d1["post_wrap_sha"] == d0["pre_wrap_sha"]


def test_gradients_are_averaged(runs: dict[str, Any]) -> None:
    d0, d1 = _dumps(runs["tmp"] / "bn")
    # Different data per rank: different local gradients.
    assert _max_abs_diff(d0["grads_local"], d1["grads_local"]) > 1e-4
    # After backward every rank holds the same gradient: the mean of the local ones.
    assert _max_abs_diff(d0["grads_avg"], d1["grads_avg"]) == 0.0
    mean = {k: (d0["grads_local"][k] + d1["grads_local"][k]) / 2 for k in d0["grads_local"]}
    assert _max_abs_diff(d0["grads_avg"], mean) <= 1e-6


def test_optimizer_state_not_synced(runs: dict[str, Any]) -> None:
    # Same averaged gradients + same optimizer state => replicas stay identical ...
    s0, s1 = _dumps(runs["tmp"] / "syncbn")
    assert all(torch.equal(s0["state"][k], s1["state"][k]) for k in s0["state"])
    assert _max_abs_diff(s0["optimizer"]["state"][0], s1["optimizer"]["state"][0]) == 0.0
    # ... but DDP never syncs optimizer state or hyperparameters: a rank-local difference
    # (rank 1 uses 2x lr) makes the replicas drift apart although gradients are averaged.
    d0, d1 = _dumps(runs["tmp"] / "bn")
    assert d0["optimizer"]["param_groups"][0]["lr"] != d1["optimizer"]["param_groups"][0]["lr"]
    params = [k for k in d0["state"] if "running" not in k and "num_batches" not in k]
    assert not all(torch.equal(d0["state"][k], d1["state"][k]) for k in params)
    assert _max_abs_diff(d0["grads_avg"], d1["grads_avg"]) == 0.0


def test_seeds_not_synced(runs: dict[str, Any]) -> None:
    d0, d1 = _dumps(runs["tmp"] / "bn")
    assert not torch.equal(d0["rng_sample"], d1["rng_sample"])


def test_batchnorm_stats_differ_without_sync_bn(runs: dict[str, Any]) -> None:
    d0, d1 = _dumps(runs["tmp"] / "bn")
    key = "1.running_mean"
    assert not torch.equal(d0["state"][key], d1["state"][key])


def test_cpu_sync_bn_stats_equal_and_exact(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    d0, d1 = _dumps(tmp / "syncbn")
    for key in ("1.running_mean", "1.running_var"):
        assert torch.equal(d0["state"][key], d1["state"][key])
    # Gradients through the synced statistics are exact: 2 ranks x B with --sync-bn train
    # like 1 rank x 2B with plain BatchNorm (weights and running stats).
    a = torch.load(tmp / "syncbn2.pt", weights_only=True)
    b = torch.load(tmp / "bnbig1.pt", weights_only=True)
    assert _max_abs_diff(a, b) <= 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch SyncBatchNorm needs CUDA")
def test_gpu_sync_bn(tmp_path: Path) -> None:
    with Launcher(tmp_path) as L:
        p = L.run_ok(["--steps", "3", "--bn", "--sync-bn", "--backend", "nccl"], nproc=1)
        done_hash(p)


def test_distributed_sampler_covers_each_sample_once(runs: dict[str, Any]) -> None:
    tmp = runs["tmp"]
    per_rank = [[int(v) for v in (tmp / f"seen{r}.txt").read_text().split()] for r in range(2)]
    assert [len(s) for s in per_rank] == [64, 64]  # 32 per rank per epoch, 2 epochs
    epochs = [[s[e * 32 : (e + 1) * 32] for s in per_rank] for e in range(2)]
    for ep in epochs:
        assert sorted(ep[0] + ep[1]) == list(range(64))  # each sample exactly once
    assert epochs[0][0] != epochs[1][0]  # set_epoch reshuffles


def test_grad_accum_equals_bigger_micro_batch(runs: dict[str, Any]) -> None:
    """--grad-accum 2 with micro-batch 8 (no_sync on the first) == micro-batch 16."""
    tmp = runs["tmp"]
    wa = torch.load(tmp / "accum.pt", weights_only=True)
    wb = torch.load(tmp / "ddp2.pt", weights_only=True)
    assert _max_abs_diff(wa, wb) <= 1e-6
