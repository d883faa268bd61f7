"""benchmarks/gpu_check.sh, as far as a machine without CUDA can check it: it parses, skips
with one line, and its summary reads the files it leaves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gpu_summary  # benchmarks/, on pyproject.toml's pythonpath
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine runs it all")
def test_without_cuda_it_skips_with_one_line() -> None:
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("gpu_check: skipped: no CUDA device")
    assert len(p.stdout.splitlines()) == 1


def test_summary_reads_the_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tests.rc").write_text("0\n")
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.train.test_x" name="test_nccl" '
        'time="2.5"/></testsuite></testsuites>'
    )
    (tmp_path / "bench.rc").write_text("0\n")
    results = {"small": {"steps_per_s_ratio": 0.96, "stall_ratio": 0.05}}
    (tmp_path / "bench.out").write_text("  small trial 0: …\n" + json.dumps(results, indent=2))
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_summary.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^tests/train/test_x.py::test_nccl +passed +2.5 s$", p.stdout, re.M)
    assert re.search(r"small steps_per_s_ratio +0.960 +target >= 0.97: missed$", p.stdout, re.M)
    assert re.search(r"small stall_ratio +0.050 +target <= 0.1$", p.stdout, re.M)
    # The timed-out benchmark: the script's main() here (its exit status above, in a process
    # of its own; each of those imports torch afresh).
    (tmp_path / "bench.rc").write_text("124\n")
    assert gpu_summary.main(tmp_path) == 1
    out = capsys.readouterr().out
    assert "timed out" in out and "FAILED" in out
