"""`ddpdeploy schema` and `init`'s editor modeline: the schema describes every field, and
every committed example and init's own output validate against it."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cli_runner import run_cli, run_main

from ddpdeploy.commands.options import spec_from_flags

EXAMPLES = sorted(
    (Path(__file__).resolve().parents[1] / "k8s" / "examples").glob("*.ddpdeploy.yaml")
)


@cache
def printed_schema() -> dict[str, Any]:
    result = run_main("schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def errors(doc: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(printed_schema())
    return [e.message for e in validator.iter_errors(doc)]


def properties(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    models = [schema, *schema["$defs"].values()]
    return [(n, p) for m in models for n, p in m.get("properties", {}).items()]


def test_every_field_is_camel_case_and_described():
    props = properties(printed_schema())
    assert len(props) > 40
    for name, prop in props:
        assert "_" not in name, name
        assert prop.get("description"), f"{name} has no description"


def test_allowed_values_and_bounds_are_in_the_schema():
    schema = printed_schema()
    assert schema["properties"]["backend"]["enum"] == ["auto", "nccl", "gloo"]
    assert schema["properties"]["nodes"]["minimum"] == 1
    assert schema["properties"]["nodes"]["maximum"] == 100_000
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_committed_examples_validate(example):
    assert EXAMPLES
    assert errors(yaml.safe_load(example.read_text())) == []


def test_init_output_validates_and_its_modeline_names_the_schema(tmp_path):
    result = run_cli("init", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "ddpdeploy.yaml").read_text()
    first = text.splitlines()[0]
    assert first == "# yaml-language-server: $schema=./.ddpdeploy.schema.json"
    schema_file = tmp_path / first.split("$schema=")[1]
    assert json.loads(schema_file.read_text()) == printed_schema()
    assert errors(yaml.safe_load(text)) == []
    assert spec_from_flags(tmp_path / "ddpdeploy.yaml").nodes == 2


@pytest.mark.parametrize(
    "doc",
    [
        {"nodez": 2},
        {"shm_size": "1Gi"},
        {"backend": "mpi"},
        {"nodes": 0},
        {"nodes": "two"},
        {"rendezvous": {"mode": "sometimes"}},
        {"checkpoint": {"size": "lots"}},
        {"name": "Bad_Name"},
        {"image": "Repo:tag"},
        {"memory": "4GB"},
        {"command": {"module": "a b"}},
        {"tolerations": [{"operator": "Maybe"}]},
    ],
)
def test_known_bad_documents_fail_the_schema(doc):
    assert errors(doc) != []


def test_init_refuses_a_directory_even_with_force(tmp_path):
    (tmp_path / "d").mkdir()
    result = run_main("init", "d", "--force", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.strip() == "error: d is a directory; give a file path, e.g. d/ddpdeploy.yaml"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert list((tmp_path / "d").iterdir()) == []


def test_init_keeps_files_unless_forced_and_replaces_links_not_targets(tmp_path):
    assert run_main("init", cwd=tmp_path).returncode == 0
    again = run_main("init", cwd=tmp_path)
    assert again.returncode == 2 and "exists; pass --force" in again.stderr
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("name: keep-me\n")
    link = tmp_path / "linked.yaml"
    link.symlink_to(elsewhere)
    os.chmod(tmp_path / "ddpdeploy.yaml", 0o600)
    assert run_main("init", "--force", cwd=tmp_path).returncode == 0
    assert (tmp_path / "ddpdeploy.yaml").stat().st_mode & 0o777 == 0o600
    assert run_main("init", "linked.yaml", "--force", cwd=tmp_path).returncode == 0
    assert elsewhere.read_text() == "name: keep-me\n" and not link.is_symlink()
