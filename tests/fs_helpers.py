"""A tmpfs of our own (read-only, or a few KiB to fill), for tests of full and read-only
disks. A plain module like cli_runner: `mountpoint = tmpfs_mountpoint` in a test module
makes the fixture available there."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mount_tmpfs(path: Path, options: str) -> None:
    """Mount a tmpfs with ``options`` on ``path``; skip where mounting is not allowed."""
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()}); needs root")


@pytest.fixture(name="mountpoint")
def tmpfs_mountpoint(tmp_path: Path) -> Iterator[Path]:
    """An empty folder to mount on, unmounted afterwards."""
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    subprocess.run(["umount", str(path)], capture_output=True, check=False)


def without_dac_override(unreadable: Path | None = None) -> list[str]:
    """A command prefix under which file modes bind root too (tests run as root, which
    reads and writes anything): drop the two capabilities that let it, keeping the uid, so
    the engine's socket stays reachable. [] when not root; skips where it cannot be
    arranged, checked on ``unreadable`` (a mode-000 file) when given."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
    drop = "-dac_override,-dac_read_search"
    prefix = [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}"]
    if unreadable is not None:
        probe = subprocess.run([*prefix, "cat", str(unreadable)], capture_output=True)
        if probe.returncode == 0:
            pytest.skip("setpriv could not drop CAP_DAC_OVERRIDE here")
    return prefix
