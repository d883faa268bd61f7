"""A test must not depend on the signal disposition pytest inherits (issue 24 §5): pytest
started with SIGINT ignored (in the background, from a script) still passes the test that
delivers a real SIGINT between write and rename, and leaves the disposition as it found
it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_files.py::test_an_interrupt_between_write_and_rename_keeps_the_old_file"
CHECK = """
import signal

def test_the_disposition_is_left_as_found():
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
"""


def test_the_sigint_test_passes_with_sigint_ignored(tmp_path):
    after = tmp_path / "test_after.py"
    after.write_text(CHECK)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", TEST, str(after)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "2 passed" in res.stdout
