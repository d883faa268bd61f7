"""`ddpdeploy smoke --local` as the smoke tests run it (tests/test_smoke_local.py,
test_smoke_scripts.py, test_smoke_truth.py): every process of a run tagged with a marker in
its environment, so a test can find the workers and check nothing outlived the command. The
`marker` fixture (a fresh tag, its leftovers killed in teardown) is in tests/conftest.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from cli_runner import run_cli

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


def workers(marker: str) -> list[int]:
    """Trainer worker processes (not agents) of the run tagged with ``marker``."""
    out = []
    for pid in leftovers(marker):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            any(part.endswith(b"ddptrain.py") for part in cmd)
            and b"torch.distributed.run" not in cmd
        ):
            out.append(pid)
    return out


def smoke(cwd: Path, marker: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`ddpdeploy smoke --local ARGS` to the end, its processes tagged with ``marker``."""
    return run_cli(
        "smoke", "--local", *args, cwd=cwd, env={"DDPDEPLOY_TEST_MARKER": marker}, timeout=300
    )


def start_smoke(cwd: Path, marker: str, *args: str) -> subprocess.Popen[str]:
    """The same, left running so the test can interrupt it."""
    return subprocess.Popen(
        [sys.executable, "-m", "ddpdeploy", "smoke", "--local", *args],
        cwd=cwd,
        env={**os.environ, "DDPDEPLOY_TEST_MARKER": marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
