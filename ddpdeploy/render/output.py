"""Rendered objects -> text (YAML or JSON), and what a GitOps folder should hold.

Pure: no files here. `ddpdeploy.adapters.out_dir` reads the folder, asks `plan_folder` what
to do, and does it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from ddpdeploy.errors import UserError
from ddpdeploy.obj import Obj

KUSTOMIZATION = "kustomization.yaml"
# Names and sha256 of the files ddpdeploy wrote, in `sha256sum` format, so that
# `sha256sum -c .ddpdeploy-render.sha256` checks them too. Not .yaml/.json: `kubectl apply -f
# DIR` reads only those extensions.
RECORD = ".ddpdeploy-render.sha256"


def written_by(command: str) -> str:
    """The first line of a file a ddpdeploy command writes whole (`render --out-dir`'s
    kustomization.yaml, `compose`'s file): where it comes from, and how `compose --out` tells
    its own earlier output from a file it must not replace."""
    return f"# Written by ddpdeploy {command}; edit ddpdeploy.yaml and {command} again.\n"


_MARKER = written_by("render")

# A plain scalar that some YAML reader in use could take for something other than a string:
# YAML 1.1 (PyYAML; go-yaml v2 under sigs.k8s.io/yaml, i.e. kubectl, which also tries Go's
# ParseInt/ParseFloat) or YAML 1.2 core (go-yaml v3 in kustomize, ruamel). Broader than any
# one resolver on purpose: a needless quote costs nothing, a missing one changes the data.
_NUMBER_LIKE = re.compile(
    r"""[-+]?(
        [0-9][0-9_]*(\.[0-9_]*)?([e][-+]?[0-9_]+)?       # 12 1_000 012 1.5 1. 1e-3
      | \.[0-9_]+([e][-+]?[0-9_]+)?                      # .5
      | 0x[0-9a-f_]*(\.[0-9a-f_]*)?(p[-+]?[0-9_]+)?      # 0x1F, Go's hex floats
      | 0[ob][0-9a-f_]*                                  # 0o17 0b101
      | [0-9][0-9_]*(:[0-9_]+)+(\.[0-9_]*)?              # 1:30 (sexagesimal, 1.1)
      | [0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([t\s].*)?         # dates and times (1.1, go-yaml)
      | \.?(inf|infinity|nan)
      | y|n|yes|no|on|off|true|false|null|~
    )""",
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Block style, no anchors (replica templates repeat in full, as kubectl shows them),
    multi-line strings as literal blocks, strings that could read as non-strings quoted."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _ambiguous(value: str) -> bool:
    return _NUMBER_LIKE.fullmatch(value) is not None


# A lone surrogate (a log's JSON "\ud800", read back by `status`) cannot be written as
# UTF-8: libyaml's emitter raised UnicodeEncodeError, a traceback of `status -o yaml`.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    value = _SURROGATE.sub("\ufffd", value)
    # Block scalars are never resolved implicitly; the emitter falls back to double quotes
    # where a literal block cannot hold the value (e.g. trailing spaces).
    if "\n" in value:
        style: str | None = "|"
    elif _ambiguous(value):
        style = "'"
    else:
        style = None  # the emitter still quotes what PyYAML's own resolver would misread
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(obj: Obj) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096)


def to_text(objects: list[Obj], fmt: Literal["yaml", "json"]) -> str:
    if fmt == "yaml":
        return "---\n".join(to_yaml(o) for o in objects)
    if len(objects) == 1:
        return json.dumps(objects[0], indent=2) + "\n"
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"


def file_name(obj: Obj) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def folder_files(objects: list[Obj]) -> dict[str, str]:
    """File name -> content for a kustomize folder holding ``objects`` (the record aside)."""
    files = {file_name(o): to_yaml(o) for o in objects}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(files),
    }
    files[KUSTOMIZATION] = _MARKER + to_yaml(kustomization)
    return files


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_text(hashes: dict[str, list[str]]) -> str:
    """The record: one `sha256sum` line per (name, hash); a name may have several."""
    return "".join(f"{h}  {name}\n" for name in sorted(hashes) for h in hashes[name])


_RECORD_LINE = re.compile(r"([0-9a-f]{64})  ([^/\\\x00\n]+)")


def parse_record(text: str) -> dict[str, set[str]]:
    """Name -> the hashes ddpdeploy wrote it with; ValueError names a line it cannot read."""
    recorded: dict[str, set[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = _RECORD_LINE.fullmatch(line)
        if match is None or match[2] in (".", "..", RECORD):
            raise ValueError(f"line {number}")
        recorded.setdefault(match[2], set()).add(match[1])
    return recorded


NOT_A_FILE = "not a regular file"


@dataclass
class FolderPlan:
    """What to do in the folder: write ``write``, then remove ``remove``; the record holds
    ``interim`` (every file matches one of its hashes throughout) and then ``final``."""

    write: dict[str, str]
    remove: list[str] = field(default_factory=list)
    interim: str = ""
    final: str = ""


def plan_folder(
    folder: str, files: dict[str, str], recorded: dict[str, set[str]], on_disk: dict[str, str]
) -> FolderPlan:
    """Decide, or refuse in one line, how ``folder`` comes to hold ``files``.

    ``recorded``: the record's names and hashes ({} when there is none); ``on_disk``: name ->
    sha256 (or NOT_A_FILE) for each of those names, and each of ``files``, that exists.
    A file is ours to replace or remove only while it still has a hash ddpdeploy wrote (or
    already holds exactly the new content); anything else in the folder is never touched.
    """
    new = {name: sha256(text.encode()) for name, text in files.items()}
    stale = sorted(n for n in recorded if n not in files and n in on_disk)
    for name in [*files, *stale]:
        have = on_disk.get(name)
        if have is None or have in recorded.get(name, ()) or have == new.get(name):
            continue
        path = _join(folder, name)
        if name in recorded and have != NOT_A_FILE:
            raise UserError(
                f"--out-dir: {path} was changed by hand since ddpdeploy wrote it; keep the "
                "change in a kustomize overlay or a patch file beside it, restore or delete "
                "the file, then render again"
            )
        what = "is not a regular file" if have == NOT_A_FILE else "exists"
        raise UserError(
            f"--out-dir: {path} {what} and ddpdeploy did not write it (it is not in {RECORD}); "
            "rename or delete it, or choose another folder"
        )
    interim = {n: set(hashes) for n, hashes in recorded.items()}
    for n, h in new.items():
        interim.setdefault(n, set()).add(h)
    return FolderPlan(
        write=files,
        remove=stale,
        interim=record_text({n: sorted(hashes) for n, hashes in interim.items()}),
        final=record_text({n: [h] for n, h in new.items()}),
    )


def _join(folder: str, name: str) -> str:
    return f"{folder}{name}" if folder.endswith("/") else f"{folder}/{name}"
