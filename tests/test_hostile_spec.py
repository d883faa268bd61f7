"""Spec fields that could forge what ddpdeploy writes or reads back (issue 24 §4): a label
or annotation key of ddpdeploy's own (its domain's, or one it writes itself, found by
rendering every target) is refused in the spec, one line naming the field and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli
from pydantic import ValidationError

from ddpdeploy.cluster.saved import record_annotations, with_saved_spec
from ddpdeploy.collect.pod import collect_helper_pod
from ddpdeploy.contract import RunRecord
from ddpdeploy.rules import TARGET_NAMES
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import render_objects

IMAGE = "registry.invalid/train:v1"
USER_LABELS = {"team": "vision", "example.com/cost-center": "42"}
USER_ANNOTATIONS = {"example.com/note": "hi"}


def spec_of(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"image": IMAGE, **fields})


def keys_in(node: Any, out: dict[str, set[str]]) -> dict[str, set[str]]:
    """Every label and annotation key on every object and pod template in ``node``."""
    if isinstance(node, dict):
        meta = node.get("metadata")
        if isinstance(meta, dict):
            out["labels"] |= set(meta.get("labels") or {})
            out["annotations"] |= set(meta.get("annotations") or {})
        for value in node.values():
            keys_in(value, out)
    elif isinstance(node, list):
        for value in node:
            keys_in(value, out)
    return out


def written_by_us() -> dict[str, set[str]]:
    """The keys ddpdeploy writes: every target rendered with every feature that adds one
    (checkpoint PVC, Volcano, a Kueue queue, the record and the saved spec on the cluster,
    collect's helper pod), the spec's own keys taken out."""
    found: dict[str, set[str]] = {"labels": set(), "annotations": set()}
    record = RunRecord(image_digest="sha256:" + "a" * 64, git_commit="b" * 40, git_dirty=True)
    for target in TARGET_NAMES:
        for scheduling in ({"scheduler": "volcano", "queue": "q"}, {"queue": "q"}):
            fields = {"target": target, "nodes": 2, "checkpoint": {"size": "1Gi"}}
            try:
                spec = spec_of(
                    **fields, scheduling=scheduling, labels=USER_LABELS,
                    annotations=USER_ANNOTATIONS,
                )  # fmt: skip
                objects = render_objects(spec, record)
            except (ValidationError, Exception):  # a target that cannot take the feature
                continue
            keys_in(with_saved_spec(objects, spec, record), found)
            keys_in(collect_helper_pod(spec, "busybox"), found)
    found["labels"] -= set(USER_LABELS)
    found["annotations"] -= set(USER_ANNOTATIONS)
    found["annotations"] |= set(record_annotations(record))
    return found


WRITTEN = written_by_us()


def test_the_render_writes_keys_of_its_own():
    assert "app.kubernetes.io/managed-by" in WRITTEN["labels"]
    assert "ddpdeploy.dev/spec" in WRITTEN["annotations"]
    assert "sidecar.istio.io/inject" in WRITTEN["annotations"]


@pytest.mark.parametrize(
    ("field", "key"),
    [(f, k) for f in ("labels", "annotations") for k in sorted(WRITTEN[f])]
    + [
        ("annotations", "ddpdeploy.dev/spec"),
        ("annotations", "record.ddpdeploy.dev/image-digest"),
        ("labels", "ddpdeploy.dev/role"),
        ("labels", "anything.ddpdeploy.dev/x"),
        ("annotations", "ddpdeploy.dev/anything"),
    ],
)
def test_a_key_ddpdeploy_writes_is_refused_in_the_spec(field, key):
    value = "x"
    with pytest.raises(ValidationError) as err:
        spec_of(**{field: {key: value}})
    (error,) = err.value.errors()
    assert error["loc"][0] == field
    assert "ddpdeploy's own" in error["msg"] and f"remove it from {field}" in error["msg"]


@pytest.mark.parametrize(
    "key", ["team", "example.com/x", "app.kubernetes.io/part-of", "notddpdeploy.dev/x"]
)
def test_keys_of_others_stay_allowed(key):
    assert spec_of(labels={key: "a"}, annotations={key: "b"}).labels == {key: "a"}


def test_a_forged_saved_spec_is_one_line_exit_2_nothing_written(tmp_path: Path):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("annotations: {ddpdeploy.dev/spec: '{}'}\n")
    out = run_cli("render", "-f", str(spec), "--image", IMAGE, "--out-dir", str(tmp_path / "o"))
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and not (tmp_path / "o").exists()
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {spec}: annotations: 'ddpdeploy.dev/spec' is under ")
    assert "remove it from annotations, or use a prefix of your own" in line


# ---- command.script: one rule on every target ---------------------------------------------


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("../../../etc/passwd", "leaves the workspace ('..')"),
        ("src/../../x.py", "leaves the workspace ('..')"),
        ("/etc/passwd", "is absolute"),
        ("-m", "starts with '-'"),
        ("--help", "starts with '-'"),
        (".", "names no file"),
        ("src/", "names no file"),
        ("a\\b.py", "contains '\\'"),
        ("a\x1b[2Jb.py", "contains a control character"),
    ],
)
def test_a_script_outside_the_workspace_is_refused_by_the_spec(script, why):
    with pytest.raises(ValidationError) as err:
        spec_of(command={"script": script})
    (error,) = err.value.errors()
    assert error["loc"] == ("command", "script")
    assert why in error["msg"] and "relative to the workspace" in error["msg"]


@pytest.mark.parametrize("script", ["train.py", "./train.py", "src/train.py", "a..b.py"])
def test_a_workspace_script_is_taken(script):
    assert spec_of(command={"script": script}).command.script == script


@pytest.mark.parametrize(
    "command",
    [
        ("render",),
        ("up", "--no-wait"),
        ("compose",),
        ("smoke", "--local"),
        ("smoke", "--docker"),
    ],
)
def test_every_target_refuses_it_alike(tmp_path, command):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("command: {script: ../../../etc/passwd}\n")
    env = {"KUBECONFIG": str(tmp_path / "none"), "DOCKER_HOST": "unix:///nonexistent"}
    out = run_cli(*command, "-f", str(spec), "--image", IMAGE, cwd=tmp_path, env=env)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: {spec}: command.script: '../../../etc/passwd' leaves the workspace ('..'); "
        "give the script's path relative to the workspace (the folder you run ddpdeploy in, "
        "which the image copies), e.g. train.py or src/train.py"
    )


# ---- text that is not characters ----------------------------------------------------------


# Found by the sixth hostile pass: "\ud800" in a quoted value rendered as U+FFFD in YAML and
# as a lone-surrogate escape in JSON (refused by strict parsers), with exit 0.
@pytest.mark.parametrize("value", ['"\\ud800"', '"a\\udfffb"'])
def test_a_lone_surrogate_in_the_spec_is_one_line_exit_2(tmp_path: Path, value):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text(f"image: {IMAGE}\nenv:\n  A: {value}\n")
    out = run_cli("render", "-f", str(spec), "-o", "json", "--out-dir", str(tmp_path / "o"))
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and not (tmp_path / "o").exists()
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {spec}:3: U+D") and "surrogate pair" in line, line


def test_a_character_written_as_its_escape_is_taken(tmp_path: Path):
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text(f'image: {IMAGE}\nenv: {{A: "\\U0001F600"}}\n')
    out = run_cli("render", "-f", str(spec), "-o", "json")
    assert out.returncode == 0, out.stderr
    assert '"value": "\\ud83d\\ude00"' in out.stdout  # JSON's own pair: a whole character


# The same through argv: bytes that are not UTF-8 reach Python as lone surrogates.
@pytest.mark.parametrize(
    "args", [("--image", "a\udcff"), ("--image", IMAGE, "--", "x\udcfe")], ids=["flag", "arg"]
)
def test_an_argument_that_is_not_utf8_is_one_line_exit_2(tmp_path: Path, args):
    out = subprocess.run(
        [sys.executable, "-m", "ddpdeploy", "render", *args],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stdout == b""
    (line,) = out.stderr.decode().strip().splitlines()
    assert "is not UTF-8 text (byte 0x" in line and line.endswith("; give it as UTF-8"), line
