"""The repository tests and runs itself: nothing reads a path outside the clone, the copied
schemas are accounted for, and pyproject.toml's dependencies are what ddpdeploy imports."""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["ddpdeploy", "train", "tests", "benchmarks", ".ci", "docker", "setup.py"]
SCHEMAS = ROOT / "tests" / "schemas"
# Built from pieces so that this file does not match its own patterns.
OUTSIDE = [
    re.compile(re.escape("../" + "shared")),
    re.compile(re.escape("shared" + "/schemas")),
    # An absolute path into the CI machine's work folder; not a URL's path (…example.com/work/).
    re.compile(r"(?<![\w.:/-])" + re.escape("/" + "work/")),
]
# Path(__file__)[.resolve()].parent.parent… or .parents[N]: where a file climbs to.
CLIMB = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?((?:\.parent\b)+|\.parents\[(\d+)\])")


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*"))
    return [
        f
        for f in files
        if f.is_file()
        and "__pycache__" not in f.parts
        and SCHEMAS not in f.parents  # third-party files, checked by hash below
    ]


def outside_refs(f: Path, text: str) -> list[str]:
    """References in ``text`` (the content of ``f``) to places outside the clone."""
    found = [m.group(0) for pattern in OUTSIDE for m in pattern.finditer(text)]
    for m in CLIMB.finditer(text):
        levels = int(m.group(2)) + 1 if m.group(2) else m.group(1).count(".parent")
        target = f
        for _ in range(levels):
            target = target.parent
        if target != ROOT and ROOT not in target.parents:
            found.append(f"{m.group(0)} climbs to {target}")
    return found


def test_no_file_refers_to_a_path_outside_the_clone() -> None:
    found = [
        f"{f.relative_to(ROOT)}: {ref}"
        for f in scanned_files()
        for ref in outside_refs(f, f.read_text(errors="replace"))
    ]
    assert not found, "paths outside the clone:\n" + "\n".join(found)


def test_the_guard_catches_what_it_is_for() -> None:
    here = ROOT / "tests" / "x.py"
    bad = [
        "ROOT = '../" + "shared'",
        "load('sha" + "red/schemas/crd.yaml')",
        "sys.path.insert(0, '/" + "work/main')",
        "Path(__file__).resolve().parents[" + "2] / 'x'",
        "Path(__file__)" + ".parent.parent.parent",
    ]
    ok = [
        "https://example.com/work/x",
        "COPY workspace/ /workspace/",
        "Path(__file__).resolve().parents[1] / 'k8s'",
        "Path(__file__).parent.parent",
    ]
    assert [s for s in bad if not outside_refs(here, s)] == []
    assert [s for s in ok if outside_refs(here, s)] == []


def test_every_copied_schema_is_listed_with_its_hash() -> None:
    sources = (SCHEMAS / "SOURCES.md").read_text()
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", sources, re.M | re.S))
    files = {f.name for f in SCHEMAS.iterdir() if f.name != "SOURCES.md"}
    assert files == set(sections), "tests/schemas/ and SOURCES.md list different files"
    for name in files:
        digest = hashlib.sha256((SCHEMAS / name).read_bytes()).hexdigest()
        assert f"sha256: `{digest}`" in sections[name], f"{name}: sha256 differs from SOURCES.md"
        if name != "LICENSE-APACHE-2.0":
            assert "License: Apache-2.0. Copyright The " in sections[name], name


def imported_distributions() -> set[str]:
    """Distributions whose modules ddpdeploy/ imports (at top level or lazily)."""
    modules: set[str] = set()
    for f in (ROOT / "ddpdeploy").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {"ddpdeploy", "__future__"}
    owners = packages_distributions()
    missing = [m for m in third_party if m not in owners]
    assert not missing, f"imported but not installed here: {missing}"
    return {normal(d) for m in third_party for d in owners[m]}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_dependencies_are_what_the_code_imports() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {normal(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in reqs}

    declared = names(project["dependencies"])
    # torch is found (find_spec), not imported, by smoke; it is the `train` extra.
    optional = names(project["optional-dependencies"]["train"])
    imported = imported_distributions()
    assert imported - optional == declared
