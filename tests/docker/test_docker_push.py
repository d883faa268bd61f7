"""`ddpdeploy build --push` against a local fake registry that requires basic auth."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_registry import FakeRegistry

pytestmark = pytest.mark.docker


@pytest.fixture
def registry(tmp_path: Path, engine: Any) -> Iterator[FakeRegistry]:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    with FakeRegistry(blobs) as reg:
        yield reg


def push(cli: Callable[..., Any], ws: Path, base: str, repo: str, config: Path) -> Any:
    # DOCKER_CONFIG: the SDK reads credentials from the user's docker config, here a temp one.
    return cli(
        "build",
        "-w",
        str(ws),
        "--image",
        repo,
        "--base-image",
        base,
        "--push",
        env={"DOCKER_CONFIG": str(config)},
    )


def test_push_prints_the_digest_reference(
    registry: FakeRegistry,
    base_image: str,
    cli: Callable[..., Any],
    engine: Any,
    tmp_path: Path,
    cleanup_images: list[str],
) -> None:
    repo = f"{registry.host}/ddpdeploy-test/pushed-{os.getpid()}"
    cleanup_images.append(repo)
    config = tmp_path / "docker-config"
    config.mkdir()
    auth = base64.b64encode(b"ci:secret").decode()
    (config / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_text("print('pushed')\n")

    result = push(cli, ws, base_image, repo, config)
    assert result.returncode == 0, result.stderr
    ref = result.stdout.strip()
    assert result.stdout.count("\n") == 1
    assert "layer " in result.stderr and ": Pushed" in result.stderr  # per-layer progress
    name, digest = ref.split("@")
    assert name == repo
    # The digest printed is the one of the manifest the registry stored.
    [manifest] = registry.manifests.values()
    assert digest == "sha256:" + hashlib.sha256(manifest).hexdigest()


def test_push_without_credentials_says_docker_login(
    registry: FakeRegistry,
    base_image: str,
    cli: Callable[..., Any],
    engine: Any,
    tmp_path: Path,
) -> None:
    config = tmp_path / "empty-config"
    config.mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    repo = f"{registry.host}/ddpdeploy-test/denied-{os.getpid()}"
    result = push(cli, ws, base_image, repo, config)
    assert result.returncode == 1
    assert result.stdout == ""
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "refused" in errors[0] and f"docker login {registry.host}" in errors[0]
    assert registry.manifests == {}
    assert engine.images.list(name=repo) == []  # the failed command tagged nothing


def test_push_needs_a_repository(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("build", "-w", str(tmp_path), "--push")
    assert result.returncode == 2
    assert "--push needs a repository" in result.stderr
