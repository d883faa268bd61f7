"""The record of what ran and the diagnostics settings, in every target's env: the
launch contract adds them once (DDPDEPLOY_SPEC_SHA256, DDPDEPLOY_IMAGE, a built image's
digest and git facts, ddpkit's diagnostics env), and pods, compose services and local
agents all get them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_main

from ddpdeploy.cluster.saved import RECORD_PREFIX, SPEC_ANNOTATION, saved_record, with_saved_spec
from ddpdeploy.commands.options import spec_from_flags
from ddpdeploy.contract import RunRecord, facts_env, record_env, record_from_env
from ddpdeploy.image import plan as image
from ddpdeploy.image.build import BuiltImage
from ddpdeploy.rules import DIAGNOSTICS_ENV, RECORD_ENV, RESERVED_ENV, TARGET_NAMES
from ddpdeploy.smoke.compose import render_compose
from ddpdeploy.smoke.launch import local_nodes
from ddpdeploy.spec import JobSpec, canonical_json, spec_sha256, spec_with
from ddpdeploy.targets import render_objects

DIGEST = "sha256:" + "ab" * 32
IMAGE = "ghcr.io/me/train:v1"
RECORD = RECORD_PREFIX


def pod_envs(objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The literal env of every training container in ``objects`` (any target's nesting:
    a TrainJob keeps it under spec.trainer)."""
    found: list[dict[str, str]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("env"), list) and "image" in node:
                found.append({e["name"]: e.get("value") for e in node["env"]})
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(objects)
    assert found, "no training container found"
    return found


def compose_envs(spec: JobSpec, record: RunRecord | None = None) -> list[dict[str, str]]:
    project = render_compose(spec, cpu=True, record=record)
    return [s["environment"] for s in project["services"].values() if "environment" in s]


def local_envs(spec: JobSpec) -> list[dict[str, str]]:
    return [n.env for n in local_nodes(spec, 29500, "/t/ddptrain.py")]


def every_env(spec: JobSpec, record: RunRecord | None = None) -> list[dict[str, str]]:
    """Each node's env on the spec's cluster target, in compose and as local agents."""
    envs = pod_envs(render_objects(spec, record)) + compose_envs(spec, record)
    if record is None:  # a local run has no image: nothing of one to record
        envs += local_envs(spec)
    return envs


SPECS = {
    target: JobSpec.model_validate({"image": IMAGE, "nodes": 2, "gpus": 2, "target": target})
    for target in TARGET_NAMES
}


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_every_target_gets_the_specs_sha256_and_image(target):
    spec = SPECS[target]
    envs = every_env(spec)
    assert len(envs) >= 5  # the pod template(s), 2 compose services, 2 local agents
    for env in envs:
        # compose and local run a CPU job derived from the spec; they record the spec's.
        assert env["DDPDEPLOY_SPEC_SHA256"] == spec_sha256(spec)
        assert env["DDPDEPLOY_IMAGE"] == IMAGE
        assert "DDPDEPLOY_IMAGE_DIGEST" not in env and "DDPDEPLOY_GIT_COMMIT" not in env
        assert not set(DIAGNOSTICS_ENV) & set(env)  # defaults: ddpkit's own, no env


def test_the_sha256_is_that_of_the_spec_the_cluster_keeps():
    """A user recomputes it from the job's annotation: `kubectl get pytorchjob NAME -o
    jsonpath='{.metadata.annotations.ddpdeploy\\.dev/spec}' | sha256sum`."""
    spec = SPECS["pytorchjob"]
    (job,) = [o for o in with_saved_spec(render_objects(spec), spec) if o["kind"] == "PyTorchJob"]
    saved = job["metadata"]["annotations"][SPEC_ANNOTATION]
    assert saved == canonical_json(spec)
    assert pod_envs([job])[0]["DDPDEPLOY_SPEC_SHA256"] == hashlib.sha256(saved.encode()).hexdigest()


def test_the_sha256_ignores_the_files_layout_but_not_its_values(tmp_path: Path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("image: t:1\nnodes: 2\n")
    b.write_text("# the same job\nnodes: 2\nimage: 't:1'\nname: ddp-train\ngpus: 0\n")
    assert spec_sha256(spec_from_flags(a)) == spec_sha256(spec_from_flags(b))
    assert spec_sha256(spec_from_flags(a)) != spec_sha256(spec_from_flags(a, {"--nodes": 3}))
    doc = json.loads(canonical_json(spec_from_flags(a)))
    assert doc["nodes"] == 2 and doc["diagnostics"]["probe"] is True  # every field, valued


def test_smoke_records_the_spec_it_was_given_not_its_cpu_job():
    spec = SPECS["pytorchjob"]
    cpu = spec_with(spec, {"gpus": 0, "procs": 2, "backend": "gloo"})
    assert spec_sha256(cpu) != spec_sha256(spec)
    assert {e["DDPDEPLOY_SPEC_SHA256"] for e in local_envs(spec)} == {spec_sha256(spec)}
    assert {e["DDPDEPLOY_SPEC_SHA256"] for e in compose_envs(spec)} == {spec_sha256(spec)}


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_a_built_images_digest_and_git_facts_reach_every_pod_and_service(target):
    spec = SPECS[target]
    record = BuiltImage(IMAGE, DIGEST, "c0ffee" * 6 + "abcd", True).record()
    for env in every_env(spec, record):
        assert env["DDPDEPLOY_IMAGE_DIGEST"] == DIGEST
        assert env["DDPDEPLOY_GIT_COMMIT"] == "c0ffee" * 6 + "abcd"
        assert env["DDPDEPLOY_GIT_DIRTY"] == "1"
        assert env["DDPDEPLOY_SPEC_SHA256"] == spec_sha256(spec)
    clean = RunRecord(image_digest=DIGEST, git_commit="abc", git_dirty=False)
    assert {e["DDPDEPLOY_GIT_DIRTY"] for e in every_env(spec, clean)} == {"0"}


def test_a_digest_pinned_image_names_its_own_digest():
    pinned = spec_with(SPECS["pytorchjob"], image=f"ghcr.io/me/train@{DIGEST}")
    for env in pod_envs(render_objects(pinned)) + compose_envs(pinned):
        assert env["DDPDEPLOY_IMAGE"] == f"ghcr.io/me/train@{DIGEST}"
        assert env["DDPDEPLOY_IMAGE_DIGEST"] == DIGEST
    # What ddpdeploy knows of the image it ran wins (compose runs a local image's ID).
    other = "sha256:" + "cd" * 32
    assert {
        e["DDPDEPLOY_IMAGE_DIGEST"] for e in compose_envs(pinned, RunRecord(image_digest=other))
    } == {other}


def test_no_image_no_image_env():
    spec = JobSpec()
    for env in local_envs(spec):
        assert env["DDPDEPLOY_SPEC_SHA256"] == spec_sha256(spec)
        assert not {"DDPDEPLOY_IMAGE", "DDPDEPLOY_IMAGE_DIGEST"} & set(env)


FLAGS = {
    "--no-probe": (True, "DDPDEPLOY_PROBE", "0"),
    "--probe-min-busbw": (12.5, "DDPDEPLOY_PROBE_MIN_BUSBW", "12.5"),
    "--hang-timeout": (90.0, "DDPDEPLOY_HANG_TIMEOUT_S", "90"),
    "--ranks-every": (10, "DDPDEPLOY_RANKS_EVERY", "10"),
    "--straggler-factor": (1.5, "DDPDEPLOY_STRAGGLER_FACTOR", "1.5"),
    "--rdma": ("rdma/hca=1", "DDPDEPLOY_RDMA", "1"),
}


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("target", TARGET_NAMES)
def test_each_diagnostics_flag_sets_its_env_alone_on_every_target(flag, target):
    value, name, expected = FLAGS[flag]
    spec = spec_from_flags(None, {"--image": IMAGE, "--nodes": 2, "--target": target, flag: value})
    for env in every_env(spec):
        assert env[name] == expected
        assert not (set(DIAGNOSTICS_ENV) - {name}) & set(env)  # only what was set


def test_hang_timeout_zero_turns_the_watchdog_off():
    # ddpkit reads 0 as "auto" and a negative value as "off".
    spec = spec_from_flags(None, {"--image": IMAGE, "--hang-timeout": 0.0})
    assert {e["DDPDEPLOY_HANG_TIMEOUT_S"] for e in every_env(spec)} == {"-1"}


def test_the_diagnostics_section_from_a_file(tmp_path: Path):
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text(
        "image: t:1\ndiagnostics: {probe: false, probeMinBusbw: 3, hangTimeoutSeconds: 120,\n"
        "  ranksEvery: 25, stragglerFactor: 2}\n"
    )
    (env,) = pod_envs(render_objects(spec_from_flags(path)))
    assert {k: env[k] for k in DIAGNOSTICS_ENV if k in env} == {
        "DDPDEPLOY_PROBE": "0",
        "DDPDEPLOY_PROBE_MIN_BUSBW": "3",
        "DDPDEPLOY_HANG_TIMEOUT_S": "120",
        "DDPDEPLOY_RANKS_EVERY": "25",
        "DDPDEPLOY_STRAGGLER_FACTOR": "2",
    }


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--probe-min-busbw", "0"], "error: --probe-min-busbw: must be greater than 0 (got 0.0)"),
        (
            ["--probe-min-busbw", "nan"],
            "error: Invalid value for '--probe-min-busbw': write 'nan' as a plain decimal number",
        ),
        (
            ["--straggler-factor", "1"],
            "error: --straggler-factor: must be greater than 1 (got 1.0)",
        ),
        (["--ranks-every", "0"], "error: --ranks-every: must be greater than or equal to 1"),
        (["--hang-timeout", "-5"], "error: --hang-timeout: must be greater than or equal to 0"),
    ],
)
def test_bad_values_are_one_line_naming_the_flag(tmp_path: Path, args, line):
    res = run_main("render", "--image", "t:1", *args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    (only,) = res.stderr.strip().splitlines()
    assert only.startswith(line), only


def test_bad_values_in_the_file_name_the_field(tmp_path: Path):
    (tmp_path / "ddpdeploy.yaml").write_text("image: t:1\ndiagnostics: {stragglerFactor: 0.5}\n")
    res = run_main("render", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip() == (
        "error: ddpdeploy.yaml: diagnostics.stragglerFactor: must be greater than 1 (got 0.5)"
    )


@pytest.mark.parametrize("name", sorted(DIAGNOSTICS_ENV))
def test_a_user_env_for_a_diagnostics_setting_names_its_field(tmp_path: Path, name):
    assert name in RESERVED_ENV
    (tmp_path / "ddpdeploy.yaml").write_text(f"image: t:1\nenv: {{{name}: '1'}}\n")
    res = run_main("render", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert f"{name} is set by ddpdeploy's launch contract" in line
    assert f"use {DIAGNOSTICS_ENV[name]} instead" in line


@pytest.mark.parametrize("name", sorted(RECORD_ENV))
def test_a_user_env_cannot_forge_the_record(tmp_path: Path, name):
    with pytest.raises(Exception, match=f"{name} is set by ddpdeploy's launch contract"):
        JobSpec.model_validate({"env": {name: "x"}})


def test_the_build_labels_its_dirty_flag_beside_its_revision():
    args = image.build_args("b:1", "", "abc", "", dirty=True)
    assert args["REVISION"] == "abc" and args["DIRTY"] == "true"
    assert image.build_args("b:1", "", None, "")["DIRTY"] == ""  # outside git: unknown
    dockerfile = (Path(__file__).resolve().parents[1] / "docker" / "Dockerfile").read_text()
    assert 'dev.ddpdeploy.git.dirty="${DIRTY}"' in dockerfile and 'ARG DIRTY=""' in dockerfile


# ---- real runs ---------------------------------------------------------------------------


def test_git_dirty_is_true_false_or_unknown(tmp_path: Path):
    import subprocess

    from ddpdeploy.adapters import git

    outside = tmp_path / "plain"  # tmp_path is outside any repository here
    outside.mkdir()
    assert git.dirty(outside) is None  # not a repository: unknown, not "clean"
    repo = tmp_path / "repo"
    repo.mkdir()
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    (repo / "a.py").write_text("x = 1\n")
    for args in (["init", "-q"], ["add", "a.py"], ["commit", "-q", "-m", "a"]):
        subprocess.run([*cmd, *args], check=True, capture_output=True)
    assert git.dirty(repo) is False
    (repo / "b.py").write_text("untracked, but it goes into the image\n")
    assert git.dirty(repo) is True


# ---- the record read back (what `scale` and `resume` carry forward) ----------------------

COMMIT = "c0ffee" * 6 + "abcd"


@pytest.mark.parametrize(
    "record",
    [
        RunRecord(image_digest=DIGEST, git_commit=COMMIT, git_dirty=True),
        RunRecord(image_digest=DIGEST, git_commit="ab" * 32, git_dirty=False),  # SHA-256 git
        RunRecord(git_commit=COMMIT),
        RunRecord(image_digest=DIGEST),
        RunRecord(),
    ],
)
def test_the_record_reads_back_from_the_env_it_gave(record):
    spec = SPECS["pytorchjob"]
    assert record_from_env(record_env(spec, record)) == (record, [])
    assert record_from_env(facts_env(record)) == (record, [])
    for env in pod_envs(render_objects(spec, record)):  # the pods' own env says the same
        assert record_from_env(env) == (record, [])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DDPDEPLOY_GIT_COMMIT", "not-hex"),
        ("DDPDEPLOY_GIT_COMMIT", COMMIT.upper()),
        ("DDPDEPLOY_GIT_COMMIT", COMMIT[:12]),  # a build records the full commit
        ("DDPDEPLOY_GIT_COMMIT", COMMIT + "\n"),
        ("DDPDEPLOY_GIT_COMMIT", "[bold red]" + COMMIT + "[/]"),
        ("DDPDEPLOY_GIT_DIRTY", "true"),
        ("DDPDEPLOY_GIT_DIRTY", 1),
        ("DDPDEPLOY_IMAGE_DIGEST", "sha256:" + "ab" * 31),
        ("DDPDEPLOY_IMAGE_DIGEST", "sha512:" + "ab" * 64),
        ("DDPDEPLOY_IMAGE_DIGEST", "\x1b]0;pwned\x07" + DIGEST),
    ],
)
def test_a_malformed_value_is_dropped_alone(name, value):
    good = {
        "DDPDEPLOY_GIT_COMMIT": COMMIT,
        "DDPDEPLOY_GIT_DIRTY": "1",
        "DDPDEPLOY_IMAGE_DIGEST": DIGEST,
    }
    record, dropped = record_from_env({**good, name: value})
    assert dropped == [name]
    kept = {k: v for k, v in good.items() if k != name}
    assert facts_env(record) == kept


def test_a_digest_other_than_the_pinned_images_is_dropped():
    pinned = f"ghcr.io/me/train@{DIGEST}"
    other = "sha256:" + "cd" * 32
    env = {"DDPDEPLOY_IMAGE_DIGEST": other, "DDPDEPLOY_GIT_COMMIT": COMMIT}
    assert record_from_env(env, pinned) == (
        RunRecord(git_commit=COMMIT),
        ["DDPDEPLOY_IMAGE_DIGEST"],
    )
    assert record_from_env(env, IMAGE)[0].image_digest == other  # a tag pins nothing
    assert record_from_env({"DDPDEPLOY_IMAGE_DIGEST": DIGEST}, pinned) == (
        RunRecord(image_digest=DIGEST),
        [],
    )


def test_the_saved_record_round_trips_and_is_absent_without_one():
    spec = SPECS["pytorchjob"]
    record = RunRecord(image_digest=DIGEST, git_commit=COMMIT, git_dirty=False)
    objects = with_saved_spec(render_objects(spec, record), spec, record)
    for obj in objects:  # the PVC too: it outlives `down`, for `resume`
        assert {k: v for k, v in obj["metadata"]["annotations"].items() if RECORD in k} == {
            f"{RECORD}DDPDEPLOY_IMAGE_DIGEST": DIGEST,
            f"{RECORD}DDPDEPLOY_GIT_COMMIT": COMMIT,
            f"{RECORD}DDPDEPLOY_GIT_DIRTY": "0",
        }
    assert {saved_record(o, spec.image) for o in objects} == {(record, None)}
    for obj in with_saved_spec(render_objects(spec), spec):  # `up` without --build, `render`
        assert not [k for k in obj["metadata"]["annotations"] if RECORD in k]
        assert saved_record(obj) == (None, None)


def _job_with(annotations: dict[str, Any]) -> dict[str, Any]:
    spec = SPECS["pytorchjob"]
    (job,) = [o for o in with_saved_spec(render_objects(spec), spec) if o["kind"] == "PyTorchJob"]
    job["metadata"]["annotations"].update(annotations)
    return job


def test_a_tampered_saved_record_warns_once_naming_the_field_not_its_value():
    evil = "[bold red]x[/]\x1b[2J\u202e"
    job = _job_with(
        {f"{RECORD}DDPDEPLOY_GIT_COMMIT": evil, f"{RECORD}DDPDEPLOY_GIT_DIRTY": "2"}
        | {f"{RECORD}DDPDEPLOY_IMAGE_DIGEST": DIGEST}
    )
    record, warning = saved_record(job)
    assert record == RunRecord(image_digest=DIGEST)
    meta = job["metadata"]
    assert warning == (
        f"PyTorchJob {meta['namespace']}/{meta['name']}: its run record is malformed in "
        f"{RECORD}DDPDEPLOY_GIT_COMMIT, {RECORD}DDPDEPLOY_GIT_DIRTY; left out of the new pods"
    )
    assert evil not in warning
    only_bad = _job_with({f"{RECORD}DDPDEPLOY_GIT_DIRTY": "yes", f"{RECORD}OTHER": "ignored"})
    assert saved_record(only_bad)[0] is None  # nothing left: no record at all
    assert saved_record(_job_with({f"{RECORD}OTHER": "x"})) == (None, None)  # not ours to read
