"""`ddpdeploy smoke --local`: real torchrun agents on 127.0.0.1, started from the launch
contract, train to the same weights on two targets' layouts; a failing trainer is named, no
process outlives the command, and one process per node gets a share of the cores."""

from __future__ import annotations

import os
import re
import socket

import pytest
from cli_runner import run_cli
from local_smoke import HASH, leftovers, smoke

pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # torchrun agents


def test_bad_trainer_args_fail_cleanly(tmp_path, marker):
    res = smoke(
        tmp_path,
        marker,
        "--nodes",
        "1",
        "--",
        "--no-such-flag",
    )
    assert res.returncode == 1
    assert "exited with code" in res.stderr and "--no-such-flag" in res.stderr
    assert leftovers(marker) == []


def test_two_targets_layouts_train_alike_and_report_ddpkits_diagnostics(tmp_path, marker):
    """Two targets' contracts (their names, rank source and injected env) emulated for 2
    nodes x 2 procs: the same training, bit for bit, as the PyTorchJob layout. (Each
    layout's rendered env is checked in the fast tier, its compose project against a local
    run in tests/docker/test_compose_run.py.) Each report shows ddpkit's diagnostics: the
    probe's line and the rank times with a straggler named by host (the lines themselves:
    tests/test_smoke_diagnostics.py)."""
    host = socket.gethostname()
    hashes, first_node = {}, {}
    for target in ("pytorchjob", "trainjob"):
        # --ranks-every: smoke's flag, the spec's diagnostics setting, reaches the trainer.
        args = ("--target", target, "--nodes", "2", "--procs", "2", "--steps", "20")
        args += ("--ranks-every", "10", "--", "--debug-slow-rank", "3:0.05")
        res = smoke(tmp_path, marker, *args)
        assert res.returncode == 0, res.stderr
        hashes[target] = HASH.search(res.stdout)[1]
        assert re.search(r"^steps\s+20$", res.stdout, re.M), res.stdout
        assert '"world_size": 4' in res.stderr
        first_node[target] = re.search(r'^([\w-]+): \{"event": "start"', res.stderr, re.M)[1]
        (probe,) = [ln for ln in res.stdout.splitlines() if ln.startswith("probe ")]
        assert "busbw" in probe and "world 4, gloo; transport tcp" in probe, probe
        times = [ln for ln in res.stdout.splitlines() if ln.startswith("rank times")]
        assert len(times) == 1 and f"straggler: rank 3 ({host}) " in times[0], res.stdout
        # Live notes per window (the trainer's default is one at 50 steps: only the end's).
        assert "step 10:" in res.stderr and "step 20:" in res.stderr
        assert leftovers(marker) == []
    assert len(set(hashes.values())) == 1, hashes
    # Rank 0's node, named as each target names its pods (c10d: whichever joined first).
    assert re.fullmatch(r"ddp-train-worker-[01]", first_node["pytorchjob"]), first_node
    assert re.fullmatch(r"ddp-train-node-0-[01]", first_node["trainjob"]), first_node


# A module entry (`command.module`, run as `torchrun -m`) that prints on stderr only.
THREADS = """\
import os
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
said = f"rank {dist.get_rank()} of {dist.get_world_size()}: threads "
said += f"{os.environ.get('OMP_NUM_THREADS')} {torch.get_num_threads()}"
print(said, file=sys.stderr, flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("given", [None, "3"])
def test_one_process_per_node_gets_a_share_of_the_cores(tmp_path, marker, monkeypatch, given):
    # Found running minGPT: with one process per node torchrun leaves OMP_NUM_THREADS
    # unset, and two nodes on this host's cores ran twice as many threads as it has cores.
    (tmp_path / "threads.py").write_text(THREADS)
    (tmp_path / "ddpdeploy.yaml").write_text("nodes: 2\nprocs: 1\ncommand: {module: threads}\n")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = {"DDPDEPLOY_TEST_MARKER": marker}
    if given is not None:
        env["OMP_NUM_THREADS"] = given
    res = run_cli("smoke", "--local", "--ranks", "all", cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    share = given or str(max(1, len(os.sched_getaffinity(0)) // 2))
    # Every rank's line, with its rank, though none came on stdout.
    said = re.findall(r"^\[rank(\d)\] rank \1 of 2: threads (\S+) (\d+)$", res.stderr, re.M)
    assert sorted(rank for rank, _, _ in said) == ["0", "1"], res.stdout + res.stderr
    assert [env for _, env, _ in said] == [share] * 2, said
    if given is None:  # (torch takes no more threads than this host has cores)
        assert [int(n) for _, _, n in said] == [int(share)] * 2, said
