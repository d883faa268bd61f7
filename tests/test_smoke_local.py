"""`ddpdeploy smoke --local`: real torchrun agents on 127.0.0.1, started from the launch
contract; failures name the node, and no process outlives the command."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import run_cli

pytest.importorskip("torch")

HASH = re.compile(r"^weights_sha256  ([0-9a-f]{64})$", re.M)


def leftovers(marker: str) -> list[int]:
    """PIDs whose environment carries ``marker``: anything the run left behind."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.fixture
def marker():
    value = f"ddpdeploy-test-{uuid.uuid4().hex}"
    yield value
    for pid in leftovers(value):  # keep the machine clean even when the test failed
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("extra", [[], ["--elastic", "2:2"]], ids=["static", "elastic"])
def test_two_nodes_train_to_the_end(tmp_path, marker, extra):
    res = run_cli(
        "smoke",
        "--local",
        "--nodes",
        "2",
        "--procs",
        "2",
        "--steps",
        "6",
        *extra,
        cwd=tmp_path,
        env={"DDPDEPLOY_TEST_MARKER": marker},
        timeout=300,
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
    res = run_cli(
        "smoke",
        "--local",
        "--nodes",
        "2",
        "--steps",
        "5",
        "--",
        "--model",
        "flaky:model",
        cwd=tmp_path,
        env={"DDPDEPLOY_TEST_MARKER": marker},
        timeout=300,
    )
    assert res.returncode == 1
    assert "error: node ddp-train-worker-0 (node rank 1, global rank 1) exited with code" in (
        res.stderr
    )
    assert "boom on node one" in res.stderr
    assert leftovers(marker) == []


def test_bad_trainer_args_fail_cleanly(tmp_path, marker):
    res = run_cli(
        "smoke",
        "--local",
        "--nodes",
        "1",
        "--",
        "--no-such-flag",
        cwd=tmp_path,
        env={"DDPDEPLOY_TEST_MARKER": marker},
        timeout=300,
    )
    assert res.returncode == 1
    assert "exited with code" in res.stderr and "--no-such-flag" in res.stderr
    assert leftovers(marker) == []


def test_ctrl_c_leaves_no_process_behind(tmp_path, marker):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddpdeploy",
            "smoke",
            "--local",
            "--nodes",
            "2",
            "--steps",
            "100000",
        ],
        cwd=tmp_path,
        env={**os.environ, "DDPDEPLOY_TEST_MARKER": marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
