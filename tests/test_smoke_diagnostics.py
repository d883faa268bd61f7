"""smoke shows ddpkit's diagnostics: the probe line, the rank times with a straggler named
by host, and a hang (the ranks that did not arrive, where the stacks are): the pure lines of
ddpdeploy.events and a real `smoke --local` hang on 2 nodes (torchrun agents). A real
report's probe and rank-times lines: tests/test_smoke_local.py's layout runs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from cli_runner import run_cli

from ddpdeploy.events import describe, parse_event

HOST = socket.gethostname()

PROBE = (
    '{"event": "probe", "world_size": 4, "backend": "nccl", "transport": "Socket", '
    '"busbw_gbps": 1.5, "min_busbw_gbps": 10.0, "ok": false, "sizes": [{"mb": 1, '
    '"busbw_gbps": 0.9}, {"mb": 64, "busbw_gbps": 1.5}], "slowest": {"rank": 3, "host": '
    '"node-1"}, "warnings": ["RDMA was asked for but NCCL on node-1 chose TCP sockets"]}'
)
RANKS = (
    '{"event": "ranks", "step": 50, "median_work_s": 0.002, "slowest": {"rank": 2, "host": '
    '"node-1", "work_s": 0.05}, "fastest": {"rank": 0, "host": "node-0", "work_s": 0.001}, '
    '"stragglers": [{"rank": 2, "host": "node-1", "work_s": 0.05, "x_median": 25.0}]}'
)
HANG = (
    '{"event": "hang", "step": 6, "idle_s": 61.0, "ranks": [3, 7], "hosts": {"3": "node-1", '
    '"7": "node-3"}, "stacks": ["/ckpt/hang-rank0.txt", "/ckpt/hang-rank1.txt"], '
    '"dir": "/ckpt"}'
)


def line(text: str) -> str:
    event = parse_event(text)
    assert event is not None
    said = describe(event)
    assert said is not None
    return said


def test_probe_line() -> None:
    said = line(PROBE)
    assert said.startswith("busbw 1.5 GB/s; per size: 1 MB 0.9, 64 MB 1.5; world 4, nccl")
    assert "transport Socket" in said and "slowest rank 3 (node-1)" in said
    assert "BELOW the floor 10.0 GB/s" in said and "warning: RDMA was asked for" in said


def test_ranks_line_names_the_straggler_with_its_host() -> None:
    said = line(RANKS)
    assert "slowest rank 2 (node-1) 50.0 ms" in said and "fastest rank 0 (node-0)" in said
    assert said.endswith("straggler: rank 2 (node-1) 25.0x")
    calm = RANKS.replace('"stragglers": [{"rank": 2, "host": "node-1", "work_s": 0.05, '
                         '"x_median": 25.0}]', '"stragglers": []')  # fmt: skip
    assert line(calm).endswith("no straggler")


def test_hang_line_names_ranks_hosts_and_stacks() -> None:
    said = line(HANG)
    assert said == (
        "hung at step 6 (no step for 61.0 s): ranks that did not arrive: 3 (node-1), "
        "7 (node-3); stacks of 2 rank(s) in /ckpt"
    )


def test_sparse_events_still_describe_and_others_do_not() -> None:
    assert line('{"event": "probe"}').startswith("busbw ? GB/s")
    assert line('{"event": "hang"}').startswith("hung at step ?")
    assert describe(parse_event('{"event": "step", "step": 1}')) is None  # type: ignore[arg-type]


@pytest.mark.slow  # torchrun agents
def test_smoke_says_which_rank_hung_and_where_the_stacks_are(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ck = tmp_path / "ck"
    res = run_cli("smoke", "--local", "--nodes", "2", "--procs", "1", "--steps", "500", "--",
                  "--debug-hang-rank", "1:4", "--hang-timeout-s", "3", "--checkpoint-dir",
                  str(ck), cwd=tmp_path, timeout=300)  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    want = f"ranks that did not arrive: 1 ({HOST}); stacks of 2 rank(s) in {ck}"
    assert "error: hang: hung at step 4 (no step for" in res.stderr and want in res.stderr
    assert "exited with code 124" in res.stderr
    assert sorted(p.name for p in ck.glob("hang-rank*.txt")) == [
        f"hang-rank{r}.txt" for r in range(2)
    ]


def test_a_hang_with_no_rank_behind_says_the_watchdog_cannot_tell() -> None:
    # Found by the seventh hostile pass: with every rank past the step before, none is named,
    # and the line said so as if it were a finding; the stacks are what tell.
    said = line('{"event": "hang", "step": 3, "idle_s": 15.0, "ranks": [], "dir": "/ck"}')
    assert "did not arrive: none named (the watchdog cannot tell which: see the stacks)" in said


@pytest.mark.slow  # torchrun agents
def test_a_hung_rank_that_printed_nothing_is_said_to_with_its_stacks(tmp_path: Path) -> None:
    # Found by the seventh hostile pass: rank 1 hung in its own code, having printed nothing,
    # and "its last lines" were its agent's: the OMP_NUM_THREADS banner and torchrun's
    # `failed (exitcode: 124)` line.
    pytest.importorskip("torch")
    script = Path(__file__).parent / "scripts" / "hang_in_own_code.py"
    (tmp_path / "hang.py").write_text(script.read_text())
    spec = "nodes: 1\nprocs: 2\ncommand: {script: hang.py}\ncheckpoint: {size: 1Gi}\n"
    (tmp_path / "ddpdeploy.yaml").write_text(spec)
    res = run_cli("smoke", "--local", "--hang-timeout", "5", cwd=tmp_path, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    error = "error: " + res.stderr.split("\nerror: ", 1)[1]  # after the live output
    stacks = tmp_path / ".ddpdeploy" / "checkpoints" / "ddp-train" / "hang-rank1.txt"
    assert error.splitlines()[1] == (
        f"node ddp-train-worker-0 (global rank 1) exited with code 124; it printed nothing; "
        f"its stacks: {stacks}"
    ), error
    assert "OMP_NUM_THREADS" not in error and "exitcode" not in error, error
    assert "hang.py" in stacks.read_text()  # its own frame, in its sleep
