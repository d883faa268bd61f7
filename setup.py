"""Build hook: ship train/ and docker/ inside the wheel as ddpdeploy/_data/{train,docker}.

They stay single-source at the top of the repository (users copy the trainer from there, and
the trainer runs by path under torchrun, beside its own modules); ddpdeploy.paths finds the
packaged copies through importlib.resources. Editable installs skip the copy and read the
source tree. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("train", "docker")


class BuildPyWithData(build_py):
    def run(self) -> None:
        if not self.editable_mode:
            # build/lib outlives a build: a module deleted or moved since the last one would
            # otherwise ship again in this wheel (setuptools only adds and overwrites).
            shutil.rmtree(Path(self.build_lib, "ddpdeploy"), ignore_errors=True)
        super().run()
        if self.editable_mode:
            return
        for name in SHIPPED:
            shutil.copytree(
                ROOT / name,
                Path(self.build_lib, "ddpdeploy", "_data", name),
                ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"),
                dirs_exist_ok=True,
            )


setup(cmdclass={"build_py": BuildPyWithData})
