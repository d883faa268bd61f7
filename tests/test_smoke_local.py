"""`ddpdeploy smoke --local`: real torchrun agents on 127.0.0.1, started from the launch
contract; failures name the node, and no process outlives the command."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from cli_runner import run_cli
from local_smoke import HASH, leftovers, smoke, start_smoke, workers

pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # torchrun agents


@pytest.mark.parametrize("extra", [[], ["--elastic", "2:2"]], ids=["static", "elastic"])
def test_two_nodes_train_to_the_end(tmp_path, marker, extra):
    res = smoke(
        tmp_path,
        marker,
        "--nodes",
        "2",
        "--procs",
        "2",
        "--steps",
        "6",
        *extra,
    )
    assert res.returncode == 0, res.stderr
    assert HASH.search(res.stdout), res.stdout
    assert re.search(r"^steps\s+6$", res.stdout, re.M)
    assert '"world_size": 4' in res.stderr
    assert leftovers(marker) == []


def test_failing_node_is_named_with_its_last_lines(tmp_path, marker):
    # A model factory that fails only on node rank 1 (torchrun's GROUP_RANK).
    (tmp_path / "flaky.py").write_text(
        "import os\n"
        "from torch import nn\n"
        "def model():\n"
        "    if os.environ['GROUP_RANK'] == '1':\n"
        "        raise RuntimeError('boom on node one')\n"
        "    return nn.Linear(16, 4)\n"
    )
    res = smoke(
        tmp_path,
        marker,
        "--nodes",
        "2",
        "--steps",
        "5",
        "--",
        "--model",
        "flaky:model",
    )
    assert res.returncode == 1
    # c10d rendezvous (the default) hands out node ranks as agents join: either node may be
    # the one with GROUP_RANK 1.
    assert re.search(
        r"^error: node ddp-train-worker-[01] \(global rank 1\) exited with code", res.stderr, re.M
    ), res.stderr
    assert "boom on node one" in res.stderr
    assert leftovers(marker) == []


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


def test_ctrl_c_leaves_no_process_behind(tmp_path, marker):
    proc = start_smoke(tmp_path, marker, "--nodes", "2", "--steps", "100000")
    deadline = time.monotonic() + 120
    # Wait until training runs (workers exist), then interrupt as a terminal would.
    while time.monotonic() < deadline and len(leftovers(marker)) < 5:
        time.sleep(0.5)
    assert len(leftovers(marker)) >= 5, "agents and workers never started"
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert leftovers(marker) == []


def test_elastic_worker_restart_resumes_from_checkpoint(tmp_path, marker):
    # The contract's env for elastic jobs is what lets torchrun's own restarts reconnect
    # across two agents; SIGKILL one worker mid-run and the job must still finish.
    (tmp_path / "ddpdeploy.yaml").write_text(
        "name: restart\nnodes: 2\nprocs: 2\ncheckpoint: {claimName: local}\n"
        "rendezvous: {mode: elastic, minNodes: 2, maxNodes: 2, maxRestarts: 2}\n"
        "command: {args: [--checkpoint-every, '5', --debug-step-delay, '0.2']}\n"
    )
    proc = start_smoke(tmp_path, marker, "--steps", "30")
    ckpts = tmp_path / ".ddpdeploy" / "checkpoints" / "restart"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not any(ckpts.glob("*.json")):
        time.sleep(0.5)
    time.sleep(1.5)  # past the checkpoint, at a step that is not a checkpoint step
    victims = workers(marker)
    assert len(victims) == 4, victims
    os.kill(victims[-1], signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert re.search(r"^steps\s+30$", out, re.M)
    # The workers started again (a second "start" line) and resumed from the checkpoint.
    assert err.count('"event": "start"') >= 2
    assert '"resumed": true' in err


def test_every_targets_layout_trains_to_the_same_weights(tmp_path, marker):
    """Each target's contract (its names, rank source and injected env) emulated for 2 nodes
    x 2 procs: the same training, bit for bit, as the PyTorchJob layout."""
    hashes, first_node = {}, {}
    for target in ("pytorchjob", "trainjob", "indexed-job"):
        args = ("--target", target, "--nodes", "2", "--procs", "2", "--steps", "6")
        res = smoke(tmp_path, marker, *args)
        assert res.returncode == 0, res.stderr
        hashes[target] = HASH.search(res.stdout)[1]
        first_node[target] = re.search(r'^([\w-]+): \{"event": "start"', res.stderr, re.M)[1]
    assert len(set(hashes.values())) == 1, hashes
    # Rank 0's node, named as each target names its pods (c10d: whichever joined first).
    assert re.fullmatch(r"ddp-train-worker-[01]", first_node["pytorchjob"]), first_node
    assert re.fullmatch(r"ddp-train-node-0-[01]", first_node["trainjob"]), first_node
    assert re.fullmatch(r"ddp-train-[01]", first_node["indexed-job"]), first_node


THREADS = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"threads {os.environ.get('OMP_NUM_THREADS')} {torch.get_num_threads()}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("given", [None, "3"])
def test_one_process_per_node_gets_a_share_of_the_cores(tmp_path, marker, monkeypatch, given):
    # Found running minGPT: with one process per node torchrun leaves OMP_NUM_THREADS
    # unset, and two nodes on this host's cores ran twice as many threads as it has cores.
    (tmp_path / "threads.py").write_text(THREADS)
    (tmp_path / "ddpdeploy.yaml").write_text("nodes: 2\nprocs: 1\ncommand: {script: threads.py}\n")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = {"DDPDEPLOY_TEST_MARKER": marker}
    if given is not None:
        env["OMP_NUM_THREADS"] = given
    res = run_cli("smoke", "--local", "--ranks", "all", cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    share = given or str(max(1, len(os.sched_getaffinity(0)) // 2))
    said = re.findall(r"threads (\S+) (\d+)", res.stdout + res.stderr)
    assert [env for env, _ in said] == [share] * 2, res.stdout + res.stderr
    if given is None:  # (torch takes no more threads than this host has cores)
        assert [int(n) for _, n in said] == [int(share)] * 2, said
