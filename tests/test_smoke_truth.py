"""`smoke --local` tells the truth: the root-cause rank of a failure with its own lines, no
process left behind when an agent is SIGKILLed, and a refusal to start thousands of workers
on a few cores."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from local_smoke import leftovers, smoke, start_smoke, workers

pytest.importorskip("torch")

# A user script (spec `command: {script: …}`) in which global rank 3 raises while its peers
# wait in an all-reduce; they then fail too, with gloo's "Connection closed by peer".
FAIL_ON_RANK_3 = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for i in range(5):
    t = torch.ones(1)
    dist.all_reduce(t)
    if i == 2 and os.environ["RANK"] == "3":
        raise RuntimeError("rank three gives up")
print("never reached", flush=True)
"""


@pytest.mark.slow  # torchrun agents
def test_failure_names_the_root_cause_rank_with_its_own_lines(tmp_path, marker):
    (tmp_path / "fail3.py").write_text(FAIL_ON_RANK_3)
    (tmp_path / "job.yaml").write_text("nodes: 2\nprocs: 2\ncommand: {script: fail3.py}\n")
    res = smoke(tmp_path, marker, "-f", "job.yaml")
    assert res.returncode == 1, res.stderr
    error = res.stderr[res.stderr.index("error: ") :]
    # Code 1 from the uncaught error; or SIGABRT when torch 2.13's teardown of a live gloo
    # group aborts the interpreter on its way out ("terminate called without an active
    # exception"): the user script's exit, which the report passes on as it is.
    assert re.match(
        r"error: node ddp-train-worker-[01] \(global rank 3\) exited with code "
        r"(1|-6 \(SIGABRT\));",
        error,
    ), error
    assert "RuntimeError: rank three gives up" in error
    # Only rank 3's own lines: none of its peers' consequences.
    assert "Connection closed" not in error and "[rank2]" not in error
    assert leftovers(marker) == []


def agent_of(node: str, marker: str) -> int:
    """The torchrun agent (not a worker) of the given node of the run tagged ``marker``."""
    for pid in leftovers(marker):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"torch.distributed.run" in cmd and f"DDPDEPLOY_SMOKE_NODE={node}".encode() in env:
            return pid
    raise AssertionError(f"no agent for node {node}")


@pytest.mark.slow  # torchrun agents
def test_sigkilled_agent_leaves_no_worker_behind(tmp_path, marker):
    # torchrun starts each worker in a session of its own: killing the agent (SIGKILL, so it
    # cannot pass anything on) orphans its workers, out of reach of its process group.
    proc = start_smoke(
        tmp_path, marker, "--nodes", "2", "--procs", "1", "--steps", "100000", "--",
        "--debug-step-delay", "0.05",
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(workers(marker)) < 2:
        time.sleep(0.5)
    assert len(workers(marker)) == 2, "the workers never started"
    os.kill(agent_of("ddp-train-worker-1", marker), signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-2000:]
    assert re.search(
        r"^error: node ddp-train-worker-1 .*exited with code -9 \(SIGKILL\)", err, re.M
    ), err
    assert leftovers(marker) == []


def test_too_many_workers_for_this_host_are_refused(tmp_path, marker):
    res = smoke(tmp_path, marker, "--nodes", "50", "--procs", "50", "--steps", "1")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: --nodes/--procs: 50 x 50 = 2500 worker processes on")
    assert "--force" in res.stderr
    assert leftovers(marker) == []
