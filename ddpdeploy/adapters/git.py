"""git, for the image's provenance: the workspace's HEAD commit and origin URL."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _run(workspace: Path, *args: str) -> str | None:
    """git's stdout; None when git is missing or fails."""
    try:
        out = subprocess.run(
            ["git", "-C", str(workspace), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def _git(workspace: Path, *args: str) -> str | None:
    return (_run(workspace, *args) or "").strip() or None


def revision(workspace: Path) -> str | None:
    """HEAD's commit of the repository holding ``workspace``, or None outside git."""
    return _git(workspace, "rev-parse", "HEAD")


def dirty(workspace: Path) -> bool | None:
    """Whether the repository holding ``workspace`` has uncommitted changes (untracked
    files too: they go into the image); None outside git."""
    if revision(workspace) is None:
        return None
    status = _run(workspace, "status", "--porcelain")
    return None if status is None else bool(status.strip())  # a failed status: unknown


def source(workspace: Path) -> str:
    """The origin URL for the OCI source label, without credentials someone put in it."""
    url = _git(workspace, "remote", "get-url", "origin") or ""
    if "://" in url and "@" in url.split("://", 1)[1].split("/", 1)[0]:
        scheme, rest = url.split("://", 1)
        url = f"{scheme}://{rest.split('@', 1)[1]}"
    return url
