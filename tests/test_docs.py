"""The docs site builds strictly (a broken link or anchor, a page missing from the nav fail)
and the README stays a five-minute read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs")  # in the dev extra; CI installs it


def test_site_builds_strict(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q"]
        + ["-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()


def test_readme_is_short_and_links_only_existing_pages() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160, "README.md: keep it a five-minute read"
    for link in sorted(set(_doc_links(readme))):
        assert (ROOT / link).is_file(), f"README.md links {link}, which does not exist"


def _doc_links(text: str) -> list[str]:
    """Relative links into docs/ (`](docs/x.md)` or `](docs/x.md#anchor)`)."""
    out = []
    for part in text.split("](docs/")[1:]:
        out.append("docs/" + part.split(")", 1)[0].split("#", 1)[0])
    return out
