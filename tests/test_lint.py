"""The tree's own checks, as CI runs them: ruff (style), import-linter (the floor plan in
pyproject.toml's [tool.importlinter]) and mypy --strict (the types), each through this
interpreter's copy from the dev extra."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# import-linter has no __main__: its console script's function, in this interpreter.
LINT_IMPORTS = ["-c", "from importlinter.cli import lint_imports_command as c; c()", "--no-cache"]


def _installed(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")


def _run(module: str, *args: str) -> str:
    """``python -m module args`` (or ``python -c …`` for import-linter) in the repository;
    its output when it fails."""
    _installed(module)
    argv = LINT_IMPORTS if module == "importlinter" else ["-m", module, *args]
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True)
    return "" if res.returncode == 0 else res.stdout + res.stderr


def test_ruff_check_is_clean():
    assert not (out := _run("ruff", "check", ".")), out


def test_ruff_format_is_clean():
    assert not (out := _run("ruff", "format", "--check", ".")), out


def test_the_floor_plan_holds():
    # importlinter's CLI module; its contracts count imports inside functions and under
    # TYPE_CHECKING (a test below plants one of each and sees it refused).
    assert not (out := _run("importlinter")), out


@pytest.mark.slow  # a cold mypy run of the package and the trainer takes 15-30 s
def test_mypy_strict_is_clean():
    assert not (out := _run("mypy")), out


def test_the_contract_sees_imports_inside_functions_and_under_type_checking(tmp_path):
    """A copy of the package with one lazy import up the floors, one TYPE_CHECKING import of
    rich below the commands and one lazy import of the CLI in the trainer: each contract
    breaks."""
    import shutil

    _installed("importlinter")
    shutil.copytree(ROOT / "ddpdeploy", tmp_path / "ddpdeploy")
    shutil.copytree(ROOT / "train", tmp_path / "train")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "train" / "ddptrain_model.py", "a") as f:
        f.write("\n\ndef _planted() -> None:\n    from ddpdeploy import spec  # noqa\n")
    with open(tmp_path / "ddpdeploy" / "spec" / "fields.py", "a") as f:
        f.write("\n\ndef _planted() -> None:\n    from ddpdeploy.cluster import watch  # noqa\n")
    with open(tmp_path / "ddpdeploy" / "events.py", "a") as f:
        f.write("\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rich  # noqa\n")
    res = subprocess.run(
        [sys.executable, *LINT_IMPORTS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode != 0
    assert "ddpdeploy.spec.fields -> ddpdeploy.cluster.watch" in res.stdout, res.stdout
    assert "ddpdeploy.events -> rich" in res.stdout, res.stdout
    assert "train.ddptrain_model -> ddpdeploy.spec" in res.stdout, res.stdout


def test_nothing_in_the_cluster_room_prints():
    """print() and sys.stdout/stderr are the commands' (the import contract covers
    adapters.stdout, rich and typer; this covers the builtins)."""
    found = []
    for path in sorted((ROOT / "ddpdeploy" / "cluster").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                found.append(f"{path.name}:{node.lineno}: print()")
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("stdout", "stderr")
                and getattr(node.value, "id", None) == "sys"
            ):
                found.append(f"{path.name}:{node.lineno}: sys.{node.attr}")
    assert not found, found
