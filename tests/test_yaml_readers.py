"""Rendered YAML means, to every YAML 1.2 (and 1.1) reader on the cluster side, exactly the
JSON that `-o json` prints: strings that look like numbers, bools, nulls or dates stay
strings, wherever the user can put a string."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from yaml_readers import kubectl_load_all, kustomize_load_all, ruamel_load_all

from ddpdeploy.adapters.out_dir import write_folder
from ddpdeploy.render.output import folder_files, to_text
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import render_objects

# fmt: off
TRICKY = [
    "1e-3", "1E+5", "0o17", "0x1F", "0b101", "1_000", "012", "0777", "1.10", "1.", ".5",
    "-.5", "+1", "-0", "1:30", "190:20:30", ".inf", "-.Inf", "+Infinity", ".NaN", "nan",
    "inf", "0x1p-2", "yes", "Yes", "NO", "on", "OFF", "y", "n", "Y", "N", "true", "True",
    "FALSE", "null", "Null", "NULL", "~", "=", "<<", "2024-01-01", "2024-1-1",
    "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5", "café", "日本語", "é1",
    "500Gi", "v1", "1.2.3", "--lr", "a: b", "a #b", "#c", " lead", "trail ", "two\nlines",
    "end\n", "", "-", "? x", "[x]", "{x}", "*a", "&a", "!tag", "%x", "@x", "`x", "'q'", '"q"',
    "|", ">", "\t", "\\", "\x85", "\u2028", "\ufeffbom",
]
# fmt: on


def _valid(doc: dict[str, Any]) -> bool:
    try:
        JobSpec.model_validate({"image": "t:1", **doc})
    except ValidationError:
        return False
    return True


def tricky_spec() -> dict[str, Any]:
    """Every tricky string in args, env, annotations and nodeSelector values; in labels and
    as env/label keys where the spec accepts it there."""
    return {
        "image": "t:1",
        "command": {"script": "train.py", "args": TRICKY},
        "env": {
            **{f"V{i}": s for i, s in enumerate(TRICKY)},
            **{s: "k" for s in TRICKY if _valid({"env": {s: "x"}})},
        },
        "annotations": {f"example.com/a{i}": s for i, s in enumerate(TRICKY)},
        # nodeSelector values are label values to the API server, and so to the spec.
        "nodeSelector": {
            f"k{i}": s for i, s in enumerate(TRICKY) if _valid({"nodeSelector": {"k": s}})
        },
        "labels": {
            **{f"l{i}": s for i, s in enumerate(TRICKY) if _valid({"labels": {"k": s}})},
            **{s: "v" for s in TRICKY if _valid({"labels": {s: "v"}})},
        },
        "checkpoint": {"size": "1Gi"},
    }


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    objects = render_objects(JobSpec.model_validate(tricky_spec()))
    text = to_text(objects, "yaml")
    path = tmp_path_factory.mktemp("yaml") / "all.yaml"
    path.write_text(text, encoding="utf-8")
    folder = tmp_path_factory.mktemp("kustomize") / "deploy"
    write_folder(str(folder), folder_files(objects))
    expected = json.loads(to_text(objects, "json"))["items"]
    return {"text": text, "path": path, "folder": folder, "expected": expected}


def test_the_matrix_reaches_every_place():
    objects = render_objects(JobSpec.model_validate(tricky_spec()))
    (job,) = [o for o in objects if o["kind"] == "PyTorchJob"]
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    labels = pod["metadata"]["labels"]
    assert {"yes", "on", "012", "1e-3", "true", "null", "y"} <= set(labels.values())
    assert {"yes", "on", "012", "1e-3", "true", "null"} <= set(pod["spec"]["nodeSelector"].values())
    assert {"yes", "on", "null", "true", "y"} <= set(labels)
    env_names = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert {"yes", "on", "null", ".inf"} <= env_names


def test_ruamel_yaml_1_2_reads_what_json_says(rendered):
    assert ruamel_load_all(rendered["text"]) == rendered["expected"]


def test_kubectl_reads_what_json_says(rendered):
    assert kubectl_load_all(rendered["path"]) == rendered["expected"]


def _without_nel(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_nel(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_without_nel(v) for v in node]
    return node.replace("\x85", " ") if isinstance(node, str) else node


def test_kustomize_reads_the_folder_as_json_says(rendered):
    by_kind = {o["kind"]: o for o in kustomize_load_all(rendered["folder"])}
    # KNOWN LIMITATION, not ours to fix here: go-yaml v3 (kustomize 5.8) reads the standard
    # escape "\N" (U+0085, NEL) as a space; every other string survives. The spec should
    # refuse control characters in strings (reported to the spec owner).
    assert by_kind == {o["kind"]: _without_nel(o) for o in rendered["expected"]}


def test_the_readers_tell_the_difference(tmp_path):
    """Without the quoting (plain PyYAML, YAML 1.1), these readers change the values: the
    checks above can fail."""
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    obj["data"] = {"a": "1e-3", "b": "0o17", "c": "0x1F", "d": "1_000"}
    plain = yaml.safe_dump(obj)
    assert "a: 1e-3" in plain  # PyYAML left it unquoted
    (tmp_path / "plain.yaml").write_text(plain)
    assert ruamel_load_all(plain)[0]["data"] != obj["data"]
    assert kubectl_load_all(tmp_path / "plain.yaml")[0]["data"] != obj["data"]
    ours = to_text([obj], "yaml")
    (tmp_path / "ours.yaml").write_text(ours)
    assert ruamel_load_all(ours) == [obj]
    assert kubectl_load_all(tmp_path / "ours.yaml") == [obj]


def test_plain_strings_stay_plain():
    """Quoting is only where needed: flags, quantities and names read as they always did."""
    job = to_text(render_objects(JobSpec.model_validate({"image": "t:1", "memory": "2Gi"})), "yaml")
    assert "- --backend\n" in job and "memory: 2Gi\n" in job and "kind: PyTorchJob\n" in job
