"""`ddpdeploy up --build`: build the workspace, push it to a registry, run the pushed digest.

Needs both a Docker engine (with the local test base image and the fake registry of
tests/docker: docker_fixtures.py) and the real kube-apiserver (kube_fixtures.py). Each missing
one skips, or fails under DDPDEPLOY_REQUIRE_DOCKER=1 / DDPDEPLOY_REQUIRE_KUBE=1 (CI).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from actors import get_job, set_job_conditions
from cli_runner import run_cli
from fake_registry import FakeRegistry

pytestmark = pytest.mark.docker


@pytest.fixture
def registry(tmp_path: Path, engine: Any) -> Iterator[FakeRegistry]:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    with FakeRegistry(blobs) as reg:
        yield reg


def _docker_config(folder: Path, host: str) -> Path:
    """A docker config logged in to the fake registry (as `docker login` would leave it)."""
    folder.mkdir()
    auth = base64.b64encode(b"ci:secret").decode()
    (folder / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return folder


def test_up_build_runs_the_pushed_digest(
    control_plane: Any,
    admin: Any,
    namespace: str,
    registry: FakeRegistry,
    base_image: str,
    engine: Any,
    tmp_path: Path,
) -> None:
    repo = f"{registry.host}/ddpdeploy-test/upbuild-{os.getpid()}"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_text("print('built by up')\n")
    # A git workspace with an uncommitted change: the pods are told its commit and dirt.
    git = ["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for cmd in (["init", "-q"], ["add", "main.py"], ["commit", "-q", "-m", "one"]):
        subprocess.run([*git, *cmd], check=True, capture_output=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True)
    (ws / "notes.txt").write_text("not committed\n")
    env = {
        "KUBECONFIG": str(control_plane.kubeconfig),
        "XDG_CACHE_HOME": str(control_plane.workdir / "cache"),
        "DOCKER_CONFIG": str(_docker_config(tmp_path / "docker-config", registry.host)),
    }
    args = ["up", "--build", "--base-image", base_image, "--image", repo, "-n", namespace]
    try:
        # The workspace is the current folder, as for a user who runs `up --build` in it.
        dry = run_cli(*args, "--name", "j", "--dry-run", cwd=ws, env=env, timeout=600)
        assert dry.returncode == 0, dry.stderr
        assert "would apply PyTorchJob" in dry.stderr
        assert get_job(admin, namespace, "j") is None
        out = run_cli(*args, "--name", "j", "--no-wait", cwd=ws, env=env, timeout=600)
    finally:
        for image in engine.images.list(name=repo):
            for tag in image.tags:
                engine.images.remove(tag, force=True)
    assert out.returncode == 0, out.stderr
    assert f"pushed {repo}:" in out.stderr
    [manifest] = set(registry.manifests.values())
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    job = get_job(admin, namespace, "j")
    assert job is not None
    images = {
        c["image"]
        for replica in job["spec"]["pytorchReplicaSpecs"].values()
        for c in replica["template"]["spec"]["containers"]
    }
    assert images == {f"{repo}@{digest}"}
    saved = job["metadata"]["annotations"]["ddpdeploy.dev/spec"]
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = replica["template"]["spec"]["containers"]
        pod_env = {e["name"]: e.get("value") for e in container["env"]}
        assert pod_env["DDPDEPLOY_IMAGE"] == f"{repo}@{digest}"
        assert pod_env["DDPDEPLOY_IMAGE_DIGEST"] == digest
        assert pod_env["DDPDEPLOY_SPEC_SHA256"] == hashlib.sha256(saved.encode()).hexdigest()
        assert pod_env["DDPDEPLOY_GIT_COMMIT"] == commit.stdout.decode().strip()
        assert pod_env["DDPDEPLOY_GIT_DIRTY"] == "1"
    # Saved beside the spec, so that `resume` (and `scale`) tell the new pods the same.
    record = {k: pod_env[k] for k in ("DDPDEPLOY_IMAGE_DIGEST", "DDPDEPLOY_GIT_COMMIT")}
    record["DDPDEPLOY_GIT_DIRTY"] = "1"
    prefix = "record.ddpdeploy.dev/"
    annotations = job["metadata"]["annotations"]
    assert {k.removeprefix(prefix): v for k, v in annotations.items() if prefix in k} == record
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Failed", "boom"))
    out = run_cli("resume", "j", "-n", namespace, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    again = get_job(admin, namespace, "j")
    assert again is not None and again["metadata"]["uid"] != job["metadata"]["uid"]
    for replica in again["spec"]["pytorchReplicaSpecs"].values():
        (container,) = replica["template"]["spec"]["containers"]
        pod_env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: pod_env.get(k) for k in record} == record


def test_up_build_needs_a_repository(tmp_path: Path) -> None:
    # Refused before any engine or cluster is reached: one line, exit 2.
    out = run_cli("up", "--build", "--name", "j", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and "--build needs a repository" in out.stderr


def test_base_image_without_build_is_refused(tmp_path: Path) -> None:
    out = run_cli("up", "--image", "r.invalid/t:v1", "--base-image", "debian:12", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--base-image" in out.stderr and "--build" in out.stderr
