"""ddpdeploy's own folder in the user's workspace (.ddpdeploy) never shows in their `git
status` (issue 24 §5): it carries a .gitignore of `*`, written atomically when the folder is
made (fs.own_folder, the one way it is made), and again if it went missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ddpdeploy.errors import DdpdeployError
from ddpdeploy.fs import own_folder


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "train.py").write_text("print('hi')\n")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return tmp_path


def test_own_folder_is_ignored_from_inside(tmp_path):
    ws = repo(tmp_path)
    folder = own_folder(ws / ".ddpdeploy")
    (folder / "checkpoints" / "j").mkdir(parents=True)
    (folder / "checkpoints" / "j" / "ckpt-step-1.pt").write_bytes(b"x")
    assert (folder / ".gitignore").read_bytes() == b"*\n"
    assert git(ws, "status", "--porcelain", "--untracked-files=all") == ""
    # Again (idempotent), and a .gitignore that went missing comes back.
    (folder / ".gitignore").unlink()
    own_folder(ws / ".ddpdeploy")
    assert git(ws, "status", "--porcelain", "--untracked-files=all") == ""
    assert not [p for p in folder.iterdir() if p.name.endswith(".ddpdeploy-tmp")]


def test_a_file_in_its_place_is_one_line(tmp_path):
    (tmp_path / ".ddpdeploy").write_text("mine")
    with pytest.raises(DdpdeployError, match=r"cannot create .*\.ddpdeploy"):
        own_folder(tmp_path / ".ddpdeploy")
