"""Where the files ddpdeploy ships beside its code live (trainer, Dockerfile)."""

from __future__ import annotations

from pathlib import Path

from ddpdeploy.errors import UserError

_ROOT = Path(__file__).resolve().parent.parent


def trainer_dir() -> Path:
    """The in-container trainer's folder (train/ of the source tree)."""
    path = _ROOT / "train"
    if not (path / "ddptrain.py").is_file():
        raise UserError(
            f"the built-in trainer is missing at {path}; install ddpdeploy from its source tree "
            "(pip install -e .)"
        )
    return path


def trainer_script() -> Path:
    return trainer_dir() / "ddptrain.py"


def docker_dir() -> Path:
    return _ROOT / "docker"
