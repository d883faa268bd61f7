"""The Docker engine's fixtures: a reachable engine and the locally built base images, for
every test that needs them (tests/docker, tests/kube/test_up_build.py, tests/collect's volume
tests); a plugin that tests/conftest.py registers, so each fixture is set up once a session.

Without an engine the engine tests skip, saying why, unless DDPDEPLOY_REQUIRE_DOCKER=1 (CI),
where a missing engine is a failure: CI must not go green by skipping.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import base_images
import pytest
from cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _require() -> bool:
    return os.environ.get("DDPDEPLOY_REQUIRE_DOCKER") == "1"


@pytest.fixture(scope="session")
def engine() -> Any:
    """A docker SDK client to a live engine, or a skip (a failure under CI's flag)."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        reason = f"no Docker engine at {where} ({exc}); run .ci/docker-setup.sh"
        if _require():
            pytest.fail(f"DDPDEPLOY_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return client


@pytest.fixture(scope="session")
def test_images(engine: Any, request: pytest.FixtureRequest) -> dict[str, str]:
    """The local images, built once per machine: "base" (Debian + python3) and "torch"."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    # Show the few-minute cold build's progress instead of a silent pause.
    with capture.global_and_fixture_disabled():
        return base_images.ensure_images(engine)


@pytest.fixture(scope="session")
def torch_image(test_images: dict[str, str]) -> str:
    """The local stand-in for the pytorch runtime image."""
    return test_images["torch"]


@pytest.fixture(scope="session")
def base_image(test_images: dict[str, str]) -> str:
    """Debian with python3 only: enough to build (not train), and quick to push."""
    return test_images["base"]


@pytest.fixture(scope="session")
def cli() -> Any:
    """`python -m ddpdeploy ARGS` from the source root, with room for a cold build."""
    return functools.partial(run_cli, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def cleanup_images(engine: Any) -> Iterator[list[str]]:
    """Repositories a test module tags; removed at its end, with the untagged layers only
    they used, so runs on a long-lived machine do not pile up images. Layers shared with the
    base images stay."""
    repos: list[str] = []
    yield repos
    for repo in repos:
        for image in engine.images.list(name=repo):
            for tag in image.tags:
                engine.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def trainer_image(
    request: pytest.FixtureRequest,
    torch_image: str,
    cleanup_images: list[str],
    tmp_path_factory: pytest.TempPathFactory,
    cli: Any,
) -> str:
    """`ddpdeploy build` of a workspace with no code of its own (the built-in trainer runs),
    on the local torch image; one repository per test module, removed at its end."""
    repo = f"ddpdeploy-test/{request.module.__name__.rsplit('.', 1)[-1]}-{os.getpid()}"
    cleanup_images.append(repo)
    ws = tmp_path_factory.mktemp("ws")
    (ws / "README.md").write_text("built-in trainer only\n")
    # --network none: no RUN step needs the internet, and none is reachable here anyway.
    res = cli(
        "build", "-w", str(ws), "--image", repo, "--base-image", torch_image, "--network", "none"
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()
