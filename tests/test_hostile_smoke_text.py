"""Every line smoke prints from a job is plain text (issue 24 §4), as `logs` and `status`
show a pod's: a script that prints OSC (the terminal's title), CSI (clear the screen, move
the cursor), C1 controls and bidi overrides, on stdout and stderr and inside its events,
cannot reach the terminal through the live output, the notes, the report or the failure
summary. A real `smoke --local` run of such a script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli

pytest.importorskip("torch")


ESC = "\x1b"
HOSTILE = {
    "osc": f"{ESC}]0;pwned title\x07",
    "csi": f"{ESC}[2J{ESC}[1;1H",
    "c1": "\x9b31m\x9d0;t\x9c",
    "bidi": "\u202eevil\u202c\u2066x\u2069",
}
FORBIDDEN = [ESC, "\x07", "\x9b", "\x9c", "\x9d", "\u202e", "\u202c", "\u2066", "\u2069"]


def hostile_script(exit_code: int) -> str:
    marks = json.dumps(HOSTILE)
    return f"""
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")  # a run that joins no group is no green run (issue 24 §2)
marks = json.loads({marks!r})
for name, mark in marks.items():
    print(f"out {{name}} <{{mark}}> end", flush=True)
    print(f"err {{name}} <{{mark}}> end", file=sys.stderr, flush=True)
if os.environ.get("RANK") == "0":
    print(json.dumps({{"event": "start", "total_steps": 2, "note": marks["osc"]}}), flush=True)
    slowest = {{"rank": 0, "host": marks["csi"]}}
    print(json.dumps({{"event": "ranks", "step": 1, "slowest": slowest}}), flush=True)
    print(json.dumps({{"event": "step", "step": 1, "loss": 0.5}}), flush=True)
    print(json.dumps({{"event": "done", "step": 2, "weights_sha256": marks["bidi"]}}), flush=True)
dist.destroy_process_group()
sys.exit({exit_code})
"""


def run(tmp_path: Path, marker: str, exit_code: int):
    (tmp_path / "hostile.py").write_text(hostile_script(exit_code))
    (tmp_path / "ddpdeploy.yaml").write_text("command: {script: hostile.py}\n")
    return run_cli(
        "smoke", "--local", cwd=tmp_path, env={"DDPDEPLOY_TEST_MARKER": marker}, timeout=300
    )


def assert_plain(text: str) -> None:
    for bad in FORBIDDEN:
        assert bad not in text, (bad, text)


@pytest.mark.slow
def test_a_successful_run_shows_the_jobs_text_plain(tmp_path, marker):
    res = run(tmp_path, marker, 0)
    assert res.returncode == 0, res.stderr
    assert_plain(res.stdout)
    assert_plain(res.stderr)
    # The text itself is shown, each escape a mark (live output, stdout and stderr lines).
    assert "out osc <\N{REPLACEMENT CHARACTER}> end" in res.stderr
    assert "err bidi <" in res.stderr
    assert "start" in res.stderr  # the start event's note
    assert "weights_sha256  \N{REPLACEMENT CHARACTER}evil" in res.stdout  # the report
    assert "rank times" in res.stdout and "(\N{REPLACEMENT CHARACTER}" in res.stdout


@pytest.mark.slow
def test_a_failing_runs_summary_shows_the_jobs_text_plain(tmp_path, marker):
    res = run(tmp_path, marker, 3)
    assert res.returncode == 1, res.stderr
    assert_plain(res.stdout)
    assert_plain(res.stderr)
    summary = res.stderr[res.stderr.index("error: ") :]
    assert "exited with code 3" in summary
    assert "err csi <\N{REPLACEMENT CHARACTER}\N{REPLACEMENT CHARACTER}> end" in summary


LONG_LINES = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
if os.environ.get("RANK") == "1":
    for i in range(6):
        print(f"line {i} " + "x" * 1_000_000, file=sys.stderr, flush=True)
    sys.exit(3)
dist.barrier()
"""


@pytest.mark.slow
def test_a_failures_last_lines_are_cut_to_a_readable_length(tmp_path, marker):
    # Found by the third hostile pass: a rank's 50 MB lines were shown whole in the failure
    # summary (600 MB on the terminal) and kept whole in memory (4.5 GB).
    (tmp_path / "long.py").write_text(LONG_LINES)
    (tmp_path / "ddpdeploy.yaml").write_text("procs: 2\ncommand: {script: long.py}\n")
    res = run_cli(
        "smoke", "--local", "--ranks", "0", cwd=tmp_path,
        env={"DDPDEPLOY_TEST_MARKER": marker}, timeout=300,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-2000:]
    summary = res.stderr.split("error: ", 1)[1]
    assert "rank 1" in summary.splitlines()[0], summary[:500]
    assert "line 5 xxx" in summary and "… (998007 more characters)" in summary
    assert len(summary) < 30_000, len(summary)
