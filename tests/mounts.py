"""A tmpfs of our own (read-only, or a few KiB to fill), for tests of full and read-only
disks. A plain module like cli_runner: `mountpoint = tmpfs_mountpoint` in a test module
makes the fixture available there."""

from __future__ import annotations

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
