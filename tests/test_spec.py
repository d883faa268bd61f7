"""JobSpec loading: file + flags, and one clear line for every kind of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdeploy.commands.options import spec_from_flags
from ddpdeploy.errors import UserError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text(text)
    return path


def test_defaults_are_a_one_node_cpu_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = spec_from_flags()
    assert (spec.name, spec.nodes, spec.gpus, spec.procs_per_node) == ("ddp-train", 1, 0, 1)
    assert spec.resolved_backend == "gloo"
    assert not spec.elastic


def test_flags_override_file_and_args_append(tmp_path):
    path = write(tmp_path, "name: a\nnodes: 2\ngpus: 8\ncommand: {args: ['--lr', '0.1']}\n")
    spec = spec_from_flags(path, {"--nodes": 4, "--name": "b", "--gpus": None}, ["--steps", "5"])
    assert (spec.name, spec.nodes, spec.gpus, spec.procs_per_node) == ("b", 4, 8, 8)
    assert spec.command.args == ["--lr", "0.1", "--steps", "5"]
    assert spec.resolved_backend == "nccl"


def test_default_file_in_cwd_is_read(tmp_path, monkeypatch):
    write(tmp_path, "name: from-cwd\n")
    monkeypatch.chdir(tmp_path)
    assert spec_from_flags().name == "from-cwd"


def test_elastic_flag_sets_range_and_restarts(tmp_path):
    spec = spec_from_flags(None, {"--elastic": "2:6", "--nodes": 4, "--max-restarts": 3})
    assert spec.elastic
    rdzv = spec.rendezvous
    assert (rdzv.min_nodes, rdzv.max_nodes, rdzv.max_restarts) == (2, 6, 3)


@pytest.mark.parametrize(
    ("text", "flags", "expected"),
    [
        ("", {"--name": "Bad_Name"}, "--name: must be a DNS-1035 label"),
        ("name: 9lives\n", {}, "name: must be a DNS-1035 label"),
        ("", {"--nodes": 0}, "--nodes: must be greater than or equal to 1"),
        ("", {"--gpus": -1}, "--gpus: must be greater than or equal to 0"),
        ("", {"--procs": 0}, "--procs: must be greater than or equal to 1"),
        ("memory: 4GB\n", {}, "memory: '4GB' is not a Kubernetes quantity"),
        ("cpu: lots\n", {}, "cpu: 'lots' is not a Kubernetes quantity"),
        ("shmSize: 1.5.3Gi\n", {}, "shmSize: '1.5.3Gi' is not a Kubernetes quantity"),
        ("", {"--image": "Repo:tag"}, "--image: 'Repo:tag': the repository 'Repo' must be lowerc"),
        # Found by the third hostile pass: UPPER read as a registry host, so this passed the
        # checks and the server's dry run, and the kubelet refused it (InvalidImageName).
        ("", {"--image": "UPPER/x:y"}, "--image: 'UPPER/x:y': the repository 'UPPER/x' must be"),
        ("", {"--image": "ghcr.io/Team/t:1"}, "the repository 'Team/t' must be lowercase"),
        ("", {"--image": "repo:bad tag"}, "--image: 'repo:bad tag' is not an image reference"),
        ("", {"--elastic": "3:1"}, "--elastic: minNodes (3) must not exceed maxNodes (1)"),
        ("", {"--elastic": "2"}, "--elastic: '2' is not MIN:MAX"),
        ("", {"--elastic": "1:3", "--nodes": 5}, "nodes (5) must lie within the elastic range"),
        (
            "rendezvous: {mode: static}\n",
            {"--max-restarts": 3},
            "--max-restarts: maxRestarts needs c10d rendezvous",
        ),
        ("rendezvous: {minNodes: 2}\n", {}, "minNodes/maxNodes need mode: elastic"),
        ("foo: 1\n", {}, "(top level): unknown field 'foo'"),
        (
            "rendezvous: {mode: elastic, minNodes: 1, maxNodes: 2, bogus: 1}\n",
            {},
            "rendezvous: unknown field 'bogus'",
        ),
        ("nodes: [2\n", {}, "YAML syntax error"),
        ("- 1\n- 2\n", {}, "the top level must be a mapping"),
        ("backend: mpi\n", {}, "backend: must be 'auto', 'nccl' or 'gloo'"),
        ("backend: nccl\n", {}, "backend nccl needs GPUs"),
        ("gpus: 8\nprocs: 4\n", {}, "procs (4) must equal gpus (8)"),
        ("checkpoint: {size: 1Gi, claimName: x}\n", {}, "checkpoint: set claimName"),
        ("checkpoint: {claimName: x, mountPath: rel}\n", {}, "mountPath must be an absolute"),
        ("env: {'1BAD': x}\n", {}, "env name '1BAD' is invalid"),
        ("labels: {team: 'a b'}\n", {}, "label value 'a b' is invalid"),
        ("runPolicy: {cleanPodPolicy: Sometimes}\n", {}, "runPolicy.cleanPodPolicy: must be"),
        ("name: " + "a" * 60 + "\nnodes: 12\n", {}, "shorten name to at most 53 characters"),
        ("command: {script: a.py, module: b}\n", {}, "set either script or module"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(tmp_path, text, flags, expected):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        spec_from_flags(path, flags)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert info.value.exit_code == 2


def test_missing_file_names_the_flag(tmp_path):
    with pytest.raises(UserError, match=r"-f/--file: .*nope.yaml not found"):
        spec_from_flags(tmp_path / "nope.yaml")


def test_yaml_error_names_line_and_column(tmp_path):
    path = write(tmp_path, "name: a\nnodes: [2\n")
    with pytest.raises(UserError, match=r"ddpdeploy.yaml:3:1: YAML syntax error"):
        spec_from_flags(path)


def test_env_and_label_scalars_become_strings(tmp_path):
    spec = spec_from_flags(write(tmp_path, "env: {OMP_NUM_THREADS: 4, FLAG: true}\n"))
    assert spec.env == {"OMP_NUM_THREADS": "4", "FLAG": "true"}


@pytest.mark.parametrize(
    "image",
    [
        "train:v1",
        "ghcr.io/team/train:v1",
        "localhost:5000/a/b_c__d-e:1.0",
        "registry.example.com/x@sha256:" + "a" * 64,
        "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
        "GHCR.IO/team/train:V1",  # the host is case-insensitive, a tag may have capitals
        "Registry:5000/train:v1",
        "localhost/train:v1",
    ],
)
def test_real_image_references_are_accepted(image):
    assert spec_from_flags(None, {"--image": image}).image == image


@pytest.mark.parametrize("user_value", [None, "logfire"])
def test_pydantic_plugin_setting_is_left_as_the_user_had_it(user_value):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    if user_value is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = user_value
    code = "import os, ddpdeploy.spec; print(os.environ.get('PYDANTIC_DISABLE_PLUGINS'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(user_value)


def test_spec_with_validates_the_changed_spec_as_a_whole():
    from ddpdeploy.spec import spec_with

    spec = spec_from_flags(None, {"--image": "t:1", "--nodes": 2})
    assert spec_with(spec, image="t:2", nodes=3) == spec_from_flags(
        None, {"--image": "t:2", "--nodes": 3}
    )
    with pytest.raises(UserError, match=r"^image: 'Bad Image' is not an image reference"):
        spec_with(spec, image="Bad Image")
    with pytest.raises(UserError, match="^nodes: must be greater than or equal to 1"):
        spec_with(spec, nodes=0)
    elastic = spec_from_flags(None, {"--nodes": 2, "--elastic": "1:3"})
    with pytest.raises(UserError, match="must lie within the elastic range 1:3"):
        spec_with(elastic, nodes=4)


def test_a_control_character_names_its_line_column_and_fix(tmp_path):
    # Found by the second hostile pass: PyYAML's ReaderError has no problem_mark, so this
    # was "YAML syntax error: invalid YAML" with no place and no fix.
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text('name: j\nannotations: {"x": "\x1b[31m"}\n')
    with pytest.raises(UserError) as info:
        spec_from_flags(spec, None, None)
    assert str(info.value) == (
        f"{spec}:2:21: YAML syntax error: character U+001B is not allowed in YAML; remove it, "
        'or write it as an escape in a double-quoted string ("\\u001b")'
    )
