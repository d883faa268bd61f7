"""A local run's end when a process of the run outlives SIGKILL: one line naming it, not a
silent give-up after the reaper's deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ddpdeploy.errors import OperationError
from ddpdeploy.smoke import reaper
from ddpdeploy.smoke.local import LocalRun

pytestmark = pytest.mark.slow  # starts a process


def test_a_process_that_outlives_sigkill_is_named_with_its_state(monkeypatch, tmp_path: Path):
    run = LocalRun([], tmp_path)
    child = subprocess.Popen(["sleep", "60"])
    # Stand-in: the kernel keeps a process past SIGKILL only while it is blocked in I/O
    # (state D, a hung mount), which a test cannot cause here; the reaper's kills miss.
    monkeypatch.setattr(reaper.os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(reaper.os, "killpg", lambda pgrp, sig: None)
    monkeypatch.setattr(reaper, "KILL_TIMEOUT_S", 0.3)
    try:
        with pytest.raises(OperationError) as raised:
            run.stop()
    finally:
        monkeypatch.undo()
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    line = str(raised.value)
    assert f"1 process(es) of this run outlived SIGKILL for 0.3 s: pid {child.pid} (S)" in line
    assert f"ps -o pid,stat,wchan:20,cmd -p {child.pid}" in line
    assert not run.log_dir.exists()  # the rest of the teardown still ran


def test_a_run_whose_processes_all_die_stops_quietly(tmp_path: Path):
    run = LocalRun([], tmp_path)
    child = subprocess.Popen(["sleep", "60"])
    run.stop()  # raises nothing
    child.wait(5)  # the reaper may have reaped it already (then Popen reads 0)
    assert reaper.state(child.pid) is None


def test_orphans_that_exit_are_reaped_while_the_run_goes_on(tmp_path: Path):
    run = LocalRun([], tmp_path)
    try:
        # Each start leaves an orphan that exits at once: re-parented here, a zombie.
        for _ in range(5):
            subprocess.run(["sh", "-c", "sh -c 'exit 0' & exit 0"], check=True)
        time.sleep(0.3)
        zombies = [p for p, (state, _) in reaper.descendants().items() if state == "Z"]
        assert len(zombies) >= 1  # without the reaping they stay until the run's end
        run.exit_codes()  # what the run loop calls several times a second
        left = [p for p, (state, _) in reaper.descendants().items() if state == "Z"]
        assert left == []
    finally:
        run.stop()
