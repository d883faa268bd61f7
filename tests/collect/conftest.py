"""collect's fixtures: a project folder with a local run's checkpoint folder, as `smoke
--local` leaves it, and a checkpoint folder to collect from directly."""

from __future__ import annotations

from pathlib import Path

import pytest
from fs_helpers import tmpfs_mountpoint

from .folders import RUN, put_checkpoint, put_trainer_checkpoint

mountpoint = tmpfs_mountpoint  # an empty folder to mount a tmpfs on (unmounted afterwards)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder in which a local run of job `j` made its checkpoint folder (empty)."""
    (tmp_path / "proj" / RUN).mkdir(parents=True)
    return tmp_path / "proj"


@pytest.fixture
def run_folder(project: Path) -> Path:
    """That run's checkpoint folder, .ddpdeploy/checkpoints/j in the project."""
    return project / RUN


@pytest.fixture
def local_run(project: Path) -> Path:
    """The project, where the local run of job `j` left checkpoints at steps 1 and 2."""
    for step in (1, 2):
        put_checkpoint(project / RUN, step, size=2000)
    return project


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A checkpoint folder with an intact step 1 (the fall-back) and nothing else yet."""
    folder = tmp_path / "src"
    put_trainer_checkpoint(folder, 1, b"step one")
    return folder
