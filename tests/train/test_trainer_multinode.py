"""Two torchrun agents on one host as two "nodes" (--nnodes 2 --nproc-per-node 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainer_harness import Launcher, Proc, done_hash, free_port, start_event  # noqa: E402

pytestmark = pytest.mark.slow  # torchrun agents

ARGS = ["--steps", "12", "--batch-size", "16", "--log-every", "4"]


def _two_nodes(L: Launcher, args: list[str]) -> list[Proc]:
    """Both agents of a c10d rendezvous (the default mode) on 127.0.0.1."""
    tr = ["--nnodes", "2", "--max-restarts", "0", "--rdzv-backend", "c10d",
          "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "test-job"]  # fmt: skip
    return [L.torchrun(args, nproc=2, torchrun_args=tr, name=f"node{n}") for n in range(2)]


def _rank0(procs: list[Proc]) -> Proc:
    with_start = [p for p in procs if any(e["event"] == "start" for e in p.events())]
    assert len(with_start) == 1  # only global rank 0 logs
    return with_start[0]


def test_world_of_four_same_weights_everywhere(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    with Launcher(tmp_path) as L:
        procs = _two_nodes(L, ARGS + ["--debug-dump", str(dump)])
        for p in procs:
            assert p.wait(180) == 0, p.tail()
    p0 = _rank0(procs)
    assert start_event(p0)["world_size"] == 4
    hashes = {torch.load(dump / f"rank{r}.pt", weights_only=False)["final_sha"] for r in range(4)}
    assert hashes == {done_hash(p0)}
