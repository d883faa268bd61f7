"""Rendered objects -> text (YAML or JSON), and a GitOps folder written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ddpdeploy.errors import UserError

Obj = dict[str, Any]

KUSTOMIZATION = "kustomization.yaml"
_MARKER = "# Written by ddpdeploy render; edit ddpdeploy.yaml and render again.\n"


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Block style, no anchors (replica templates repeat in full, as kubectl shows them),
    multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(obj: Obj) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096)


def to_text(objects: list[Obj], fmt: str) -> str:
    fmt = fmt.lower()
    if fmt == "yaml":
        return "---\n".join(to_yaml(o) for o in objects)
    if fmt == "json":
        if len(objects) == 1:
            return json.dumps(objects[0], indent=2) + "\n"
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    raise UserError(f"-o/--output: {fmt!r} is not a format; use yaml or json")


def file_name(obj: Obj) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def folder_files(objects: list[Obj]) -> dict[str, str]:
    """File name -> content for a kustomize folder holding ``objects``."""
    files = {file_name(o): to_yaml(o) for o in objects}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(files),
    }
    files[KUSTOMIZATION] = _MARKER + to_yaml(kustomization)
    return files


def write_folder(out_dir: Path, files: dict[str, str]) -> None:
    """Replace ``out_dir`` with exactly ``files``, all at once.

    The new folder is written beside it, then swapped in by rename, so a failure leaves the
    old folder as it was. A folder ddpdeploy did not write is never replaced.
    """
    out_dir = out_dir.resolve()
    if out_dir.exists():
        if not out_dir.is_dir():
            raise UserError(f"--out-dir: {out_dir} exists and is not a folder")
        ours = out_dir / KUSTOMIZATION
        has_files = any(out_dir.iterdir())
        if has_files and not (ours.is_file() and ours.read_text().startswith(_MARKER)):
            raise UserError(
                f"--out-dir: {out_dir} holds files ddpdeploy did not write; "
                "choose a new or empty folder"
            )
    parent = out_dir.parent
    if not parent.is_dir():
        raise UserError(f"--out-dir: parent folder {parent} does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=parent))
    old: Path | None = None
    try:
        for name, content in files.items():
            path = tmp / name
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
        tmp.chmod(0o755)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=parent))
            old.rmdir()
            out_dir.rename(old)
        tmp.rename(out_dir)
    except OSError as exc:
        if old is not None and not out_dir.exists():
            old.rename(out_dir)
        raise UserError(f"--out-dir: cannot write {out_dir}: {exc}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists():
            shutil.rmtree(old, ignore_errors=True)
