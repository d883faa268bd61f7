"""Where the files ddpdeploy ships beside its code live (trainer, Dockerfile), and where a
local run keeps its checkpoints.

A wheel carries them as package data, ddpdeploy/_data/{train,docker} (setup.py copies them
there at build time); an editable install or a source checkout has them at the top of the
repository, next to the package. Both are real folders: the trainer runs by path under
torchrun, and the image build copies them into its context.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ddpdeploy.errors import UserError

DEFAULT_FILE = "ddpdeploy.yaml"  # the job spec a command reads when -f names none
SCHEMA_FILE = ".ddpdeploy.schema.json"  # written by `ddpdeploy init` beside the spec file
OWN_DIR = ".ddpdeploy"  # ddpdeploy's own folder in the workspace (fs.own_folder makes it)


def _shipped(name: str, marker: str) -> Path:
    package = Path(str(resources.files("ddpdeploy")))
    candidates = (package / "_data" / name, package.parent / name)
    for path in candidates:
        if (path / marker).is_file():
            return path
    raise UserError(
        f"ddpdeploy's {name}/{marker} is missing (looked in {candidates[0]} and "
        f"{candidates[1]}); reinstall ddpdeploy (pip install --force-reinstall ddpdeploy)"
    )


def trainer_dir() -> Path:
    """The in-container trainer's folder: ddptrain.py and its sibling modules."""
    return _shipped("train", "ddptrain.py")


def trainer_script() -> Path:
    return trainer_dir() / "ddptrain.py"


def helpers_dir() -> Path:
    """The folder to put on a script's PYTHONPATH so that it can ``import ddpkit`` (the
    helpers ship beside the trainer, in the image as in the wheel)."""
    return _shipped("train", "ddpkit.py")


def docker_dir() -> Path:
    """The folder holding the image's Dockerfile."""
    return _shipped("docker", "Dockerfile")


def local_checkpoints(name: str) -> Path:
    """Where `smoke --local` keeps job ``name``'s checkpoints and `collect --from local`
    reads them, relative to the workspace (this folder)."""
    return Path(OWN_DIR, "checkpoints", name)


def package_file(*parts: str) -> Path:
    """A file of the ddpdeploy package itself (a script that runs elsewhere, such as
    smoke/killworker.py inside a container), as installed."""
    return Path(str(resources.files("ddpdeploy").joinpath(*parts)))
