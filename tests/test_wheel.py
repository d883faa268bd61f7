"""The wheel and the sdist carry everything ddpdeploy runs.

Built here, installed (not editable) with its `train` extra and torch==2.13.0 into one fresh
venv outside the source tree, and run from an empty folder, as a user who ran
`pip install 'ddpdeploy[train]'` would. The venv's torch is this environment's, linked in
(its 750 MB unpacked again took most of a minute and says nothing about the wheel); pip
installs everything else there, the train extra's numpy and torch's own dependencies
included. Slow (a build and a venv), and part of the suite all the same.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {
    "ddpdeploy/_data/train/ddptrain.py",
    "ddpdeploy/_data/train/ddptrain_ckpt.py",
    "ddpdeploy/_data/train/ddpkit.py",
    "ddpdeploy/_data/train/ddptrain_model.py",
    "ddpdeploy/_data/docker/Dockerfile",
}


def run(argv: list[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    p = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    return p


def check(argv: list[str | Path], cwd: Path, **kw) -> subprocess.CompletedProcess[str]:
    p = run(argv, cwd, **kw)
    assert p.returncode == 0, f"{argv} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def contents(wheel: Path) -> dict[str, str]:
    """File name -> sha256 of everything in a wheel but its own metadata."""
    with zipfile.ZipFile(wheel) as z:
        return {
            n: hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist() if ".dist-info/" not in n
        }


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel built from the tree, and the one built from the sdist."""
    out = tmp_path_factory.mktemp("dist")
    check([sys.executable, "-m", "build", "--sdist", "--outdir", out / "sdist", ROOT], out)
    (sdist,) = (out / "sdist").glob("ddpdeploy-*.tar.gz")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w"]
    check([*pip_wheel, out / "tree", ROOT], out)
    check([*pip_wheel, out / "from-sdist", sdist], out)
    (tree,) = (out / "tree").glob("*.whl")
    (from_sdist,) = (out / "from-sdist").glob("*.whl")
    return {"tree": tree, "sdist": from_sdist}


def link_torch(venv: Path, shelf: Path) -> None:
    """Make this environment's torch the venv's own: its top-level folders and dist-info,
    linked into ``shelf``, which a .pth file puts on the venv's path. pip takes it as
    installed; a torch that is not 2.13.0 (or none) it installs into the venv instead."""
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return
    shelf.mkdir()
    for top in {str(f).split("/")[0] for f in dist.files or [] if not str(f).startswith("..")}:
        (shelf / top).symlink_to(Path(str(dist.locate_file(top))))
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "torch-of-the-tests.pth").write_text(f"{shelf}\n")


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]):
    """(bin folder, clean env, empty working folder) of a fresh venv holding the wheel."""
    base = tmp_path_factory.mktemp("user")
    venv = base / "venv"
    check([sys.executable, "-m", "venv", venv], base)
    link_torch(venv, base / "torch")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # --no-compile: byte-compiling every dependency took longer than the rest of the install;
    # Python compiles what a run imports, as it would without the .pyc files.
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]
    check([*pip, f"{wheels['tree']}[train]", "torch==2.13.0"], base, env=env)
    empty = base / "work"
    empty.mkdir()
    return venv / "bin", env, empty


def test_wheel_ships_trainer_and_dockerfile_but_no_tests_or_caches(wheels) -> None:
    names = set(contents(wheels["tree"]))
    assert names >= SHIPPED
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n or ".pyc" in n]
    # Every file of the source folders, nothing else under _data.
    source = {
        f"ddpdeploy/_data/{p.relative_to(ROOT)}"
        for folder in ("train", "docker")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert {n for n in names if n.startswith("ddpdeploy/_data/")} == source


def test_sdist_builds_the_same_wheel(wheels) -> None:
    # The checkout may hold a build/ folder from an older tree: setup.py's build_py clears
    # the package from it, so deleted modules do not ship.
    assert contents(wheels["sdist"]) == contents(wheels["tree"])


def test_installed_wheel_finds_its_own_files(user) -> None:
    bin_dir, env, empty = user
    code = "from ddpdeploy import paths; print(paths.trainer_script()); print(paths.docker_dir())"
    p = check([bin_dir / "python", "-c", code], empty, env=env)
    site = bin_dir.parent.resolve()
    for line in p.stdout.splitlines():
        assert Path(line).resolve().is_relative_to(site), line


def test_installed_wheel_runs_the_smoke_job_from_an_empty_folder(user) -> None:
    bin_dir, env, empty = user
    argv = [bin_dir / "ddpdeploy", "smoke", "--local", "--nodes", "1", "--procs", "2"]
    p = check([*argv, "--steps", "3"], empty, env=env, timeout=300)
    assert "steps           3" in p.stdout
    assert "weights_sha256  " in p.stdout


def test_installed_wheel_shows_a_scripts_own_output_first(user, tmp_path: Path) -> None:
    """A user's torch script under `smoke --local`: every rank's first line is the script's,
    not torch's "Failed to initialize NumPy" warning (the train extra brings numpy)."""
    bin_dir, env, _ = user
    shutil.copy(ROOT / "tests" / "scripts" / "plain.py", tmp_path / "plain.py")
    (tmp_path / "ddpdeploy.yaml").write_text("nodes: 1\ncommand: {script: plain.py}\n")
    argv = [bin_dir / "ddpdeploy", "smoke", "--local", "--procs", "2", "--ranks", "all"]
    p = check(argv, tmp_path, env=env, timeout=300)
    assert "[rank0] epoch 0 loss" in p.stderr, p.stderr
    assert "NumPy" not in p.stderr + p.stdout, p.stderr


def test_installed_wheel_build_reaches_the_engine(user, tmp_path: Path) -> None:
    bin_dir, env, empty = user
    dead = f"unix://{tmp_path / 'no-engine.sock'}"
    p = run([bin_dir / "ddpdeploy", "build"], empty, env={**env, "DOCKER_HOST": dead})
    # Exit 1 = the outside world failed; a missing trainer or Dockerfile would be exit 2.
    assert p.returncode == 1, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "cannot reach the Docker engine" in line and dead in line
