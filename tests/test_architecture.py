"""docs/architecture.md shows the floor plan the import contract holds: its block between the
`floors` markers is made from pyproject.toml's [tool.importlinter] and must equal it.

After changing the contract: `python tests/test_architecture.py --write` rewrites the block.
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the dev extra brings tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- floors: made from pyproject.toml's [tool.importlinter]; `python tests/test_architecture.py --write` -->"  # noqa: E501
END = "<!-- end of floors -->"


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return found


def block() -> str:
    """The floors top to bottom (`a | b`: beside each other, neither imports the other;
    `a : b`: one floor that may import within), then every other contract's rule."""
    floors = next(c for c in contracts() if c["type"] == "layers")
    lines = ["```text", "ddpdeploy/  (top: imports only what is below it)"]
    for layer in floors["layers"]:  # type: ignore[attr-defined]
        lines.append(f"  {layer}")
    lines += ["```", ""]
    for contract in contracts():
        if contract["type"] == "layers":
            continue
        lines.append(f"- **{contract['name']}** (`{contract['id']}`, {contract['type']})")
    return "\n".join([BEGIN, *lines, END])


def shown() -> str:
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def test_the_architecture_page_shows_the_contract() -> None:
    assert shown() == block(), (
        "docs/architecture.md's floors differ from pyproject.toml's [tool.importlinter]; "
        "run `python tests/test_architecture.py --write`"
    )


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    text = DOC.read_text()
    DOC.write_text(text.replace(shown(), block()))
