"""Two torchrun agents on one host as two "nodes" (--nnodes 2 --nproc-per-node 2)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainer_harness import Launcher, Proc, done_hash, free_port, start_event  # noqa: E402

pytestmark = pytest.mark.slow  # torchrun agents

ARGS = ["--steps", "12", "--batch-size", "16", "--log-every", "4"]


def _two_nodes(L: Launcher, args: list[str], mode: str, max_restarts: int = 0) -> list[Proc]:
    port = free_port()
    common = ["--nnodes", "2", "--max-restarts", str(max_restarts)]
    procs = []
    for node in range(2):
        if mode == "static":
            tr = common + [
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
            ]
        else:
            tr = common + [
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "test-job",
            ]
        procs.append(L.torchrun(args, nproc=2, torchrun_args=tr, name=f"{mode}-node{node}"))
    return procs


def _rank0(procs: list[Proc]) -> Proc:
    with_start = [p for p in procs if any(e["event"] == "start" for e in p.events())]
    assert len(with_start) == 1  # only global rank 0 logs
    return with_start[0]


@pytest.mark.parametrize("mode", ["static", "c10d"])
def test_world_of_four_same_weights_everywhere(tmp_path: Path, mode: str) -> None:
    dump = tmp_path / "dump"
    with Launcher(tmp_path) as L:
        procs = _two_nodes(L, ARGS + ["--debug-dump", str(dump)], mode)
        for p in procs:
            assert p.wait(180) == 0, p.tail()
    p0 = _rank0(procs)
    assert start_event(p0)["world_size"] == 4
    hashes = {torch.load(dump / f"rank{r}.pt", weights_only=False)["final_sha"] for r in range(4)}
    assert hashes == {done_hash(p0)}


def test_c10d_worker_restart_across_two_agents(tmp_path: Path) -> None:
    """A worker SIGKILLed on one node: both agents restart their workers (the failing one
    counts a restart, the healthy one does not) and the run ends as if never interrupted.
    Needs the contract's TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (the harness sets it)."""
    with Launcher(tmp_path) as L:
        ref = _two_nodes(L, ARGS, "c10d")
        for p in ref:
            assert p.wait(180) == 0, p.tail()
        reference = done_hash(_rank0(ref))

        ck = tmp_path / "ck"
        args = ARGS + [
            "--checkpoint-dir",
            str(ck),
            "--checkpoint-every",
            "4",
            "--debug-step-delay",
            "0.2",
        ]
        procs = _two_nodes(L, args, "c10d", max_restarts=2)
        procs[0].wait_for(lambda: max(p.last_step() for p in procs) >= 6, timeout=120)
        log_node = next(p for p in procs if p.last_step() >= 6)
        other = procs[1] if log_node is procs[0] else procs[0]
        os.kill(other.workers()[-1], signal.SIGKILL)  # on the node without rank 0
        for p in procs:
            assert p.wait(240) == 0, p.tail()
    starts = [e for p in procs for e in p.events() if e["event"] == "start"]
    assert len(starts) == 2 and starts[-1]["resumed"] and starts[-1]["resume_step"] in (4, 8)
    final = [e for p in procs for e in p.events() if e["event"] == "done"]
    assert [e["weights_sha256"] for e in final] == [reference]
