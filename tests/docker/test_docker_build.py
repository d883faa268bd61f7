"""`ddpdeploy build` against a real engine, with the locally built torch image as base.

One workspace is built once per module; the tests then run the image, rebuild it after a
code-only change, and break the build in the ways users do.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpdeploy.contract import TRAINER_IN_IMAGE
from ddpdeploy.image_layout import TRAINER_DIR_IN_IMAGE, WORKSPACE_IN_IMAGE

pytestmark = pytest.mark.docker

# Per process: two test sessions on one engine (two clones, CI and a developer) must not
# untag each other's images. Layers are shared through the cache all the same.
REPO = f"ddpdeploy-test/build-it-{os.getpid()}"
FAIL_REPO = f"ddpdeploy-test/build-fail-{os.getpid()}"
GIT_REPO = f"ddpdeploy-test/build-git-{os.getpid()}"


def run_in(engine: Any, ref: str, command: list[str], timeout: int = 180) -> tuple[int, str]:
    """Run ``command`` in a container of ``ref``; exit code and output."""
    container = engine.containers.create(ref, command)
    try:
        container.start()
        code = container.wait(timeout=timeout)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def build(cli: Callable[..., Any], ws: Path, base: str, repo: str = REPO) -> tuple[Any, float]:
    start = time.monotonic()
    # --network none: RUN steps cannot reach the internet here anyway; fail fast, not slow.
    result = cli("build", "-w", str(ws), "--image", repo, "--base-image", base, "--network", "none")
    return result, time.monotonic() - start


def layers(engine: Any, ref: str) -> list[str]:
    return engine.images.get(ref).attrs["RootFS"]["Layers"]


@pytest.fixture(scope="module")
def built(
    torch_image: str,
    cleanup_images: list[str],
    tmp_path_factory: pytest.TempPathFactory,
    cli: Callable[..., Any],
) -> dict[str, Any]:
    cleanup_images += [REPO, FAIL_REPO]
    ws = tmp_path_factory.mktemp("ws")
    (ws / "data").mkdir()
    (ws / "train_user.py").write_text("print('user code v1')\n")
    (ws / "data" / "huge.bin").write_bytes(b"0" * 1024)
    (ws / "local.secret").write_text("TOKEN=do-not-ship\n")
    (ws / ".dockerignore").write_text("data/\n*.secret\n")
    result, seconds = build(cli, ws, torch_image)
    assert result.returncode == 0, result.stderr
    return {"ws": ws, "ref": result.stdout.strip(), "result": result, "seconds": seconds}


def test_build_prints_only_the_reference(built: dict[str, Any], engine: Any) -> None:
    out = built["result"].stdout
    assert out.count("\n") == 1
    ref = out.strip()
    assert ref.startswith(f"{REPO}:ctx-")  # the workspace is not in git: a context hash
    assert engine.images.get(ref)
    assert "step " in built["result"].stderr  # progress goes to stderr


def test_image_layout_user_and_labels(built: dict[str, Any], engine: Any) -> None:
    script = (
        f"id -u; pwd; ls -A {WORKSPACE_IN_IMAGE}; ls {TRAINER_DIR_IN_IMAGE}; "
        'test -f "$DDPDEPLOY_TRAINER"; echo $PYTHONUNBUFFERED'
    )
    code, logs = run_in(engine, built["ref"], ["sh", "-c", script])
    assert code == 0, logs
    lines = logs.split()
    assert lines[0] != "0"  # non-root
    assert lines[1] == WORKSPACE_IN_IMAGE
    assert "train_user.py" in lines and "ddptrain.py" in lines
    # .dockerignore honoured: neither the data folder nor the secret reached the image.
    assert "data" not in lines and "local.secret" not in lines
    assert lines[-1] == "1"
    attrs = engine.images.get(built["ref"]).attrs
    assert attrs["Config"]["User"] not in ("", "root", "0")
    assert "org.opencontainers.image.revision" in attrs["Config"]["Labels"]
    # The default command (`docker run IMAGE`) runs the trainer where the manifests do.
    assert f"DDPDEPLOY_TRAINER={TRAINER_IN_IMAGE}" in attrs["Config"]["Env"]
    assert "$DDPDEPLOY_TRAINER" in attrs["Config"]["Cmd"][-1]


def test_code_only_change_reuses_dependency_layers(
    built: dict[str, Any], engine: Any, torch_image: str, cli: Callable[..., Any]
) -> None:
    again, _ = build(cli, built["ws"], torch_image)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == built["ref"]  # same content, same tag
    # The tagged image carries the same inputs' hash and base image ID: no build at all.
    assert f"up to date: {built['ref']}" in again.stderr and "step " not in again.stderr
    labels = engine.images.get(built["ref"]).attrs["Config"]["Labels"]
    assert labels["io.ddpdeploy.base-image-id"] == engine.images.get(torch_image).id

    # A tag that lies (another image under it, without our labels) is built over.
    repo, tag = built["ref"].rsplit(":", 1)
    engine.images.get(torch_image).tag(repo, tag)
    rebuilt, _ = build(cli, built["ws"], torch_image)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert rebuilt.stdout.strip() == built["ref"] and "step " in rebuilt.stderr
    assert engine.images.get(built["ref"]).attrs["Config"]["Labels"] == labels

    (built["ws"] / "train_user.py").write_text("print('user code v2')\n")
    changed, seconds = build(cli, built["ws"], torch_image)
    assert changed.returncode == 0, changed.stderr
    new_ref = changed.stdout.strip()
    assert new_ref != built["ref"]
    old, new = layers(engine, built["ref"]), layers(engine, new_ref)
    # Every layer below the user's code is shared; only the workspace layer is new.
    assert len(old) == len(new)
    assert new[:-1] == old[:-1]
    assert new[-1] != old[-1]
    print(f"code-only rebuild: {seconds:.1f}s (first build {built['seconds']:.1f}s)")


def test_failing_step_is_one_line_and_tags_nothing(
    torch_image: str, engine: Any, cli: Callable[..., Any], tmp_path: Path
) -> None:
    # --no-index: pip's retries against the index --network none cuts off take seconds;
    # without an index it fails at once, with the same error.
    (tmp_path / "requirements.txt").write_text("--no-index\nddpdeploy-no-such-package==0.0.0\n")
    result, _ = build(cli, tmp_path, torch_image, repo=FAIL_REPO)
    assert result.returncode == 1
    assert result.stdout == ""
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "pip install" in errors[0] and "failed (exit code 1)" in errors[0]
    assert "ddpdeploy-no-such-package" in errors[0]  # the step's last output lines
    log = Path(errors[0].rsplit("(full log: ", 1)[1].rstrip(")"))
    assert "Step 1/" in log.read_text()  # the whole build log, kept for the post-mortem
    log.unlink()
    assert engine.images.list(name=FAIL_REPO) == []


def test_absent_base_image_is_named(engine: Any, cli: Callable[..., Any], tmp_path: Path) -> None:
    base = "ddpdeploy-test/absent-base:nope"
    result, _ = build(cli, tmp_path, base, repo=FAIL_REPO)
    assert result.returncode == 1
    assert f"error: base image {base} is not available locally" in result.stderr
    assert "--base-image" in result.stderr
    assert engine.images.list(name=FAIL_REPO) == []


def test_unreachable_engine_is_one_line(cli: Callable[..., Any], tmp_path: Path) -> None:
    dead = f"unix://{tmp_path}/dead.sock"
    result = cli("build", "-w", str(tmp_path), "--base-image", "x:1", env={"DOCKER_HOST": dead})
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot reach the Docker engine at {dead}")
    assert "DOCKER_HOST" in lines[0]


def test_git_workspace_tag_and_labels(
    base_image: str,
    engine: Any,
    cli: Callable[..., Any],
    tmp_path: Path,
    cleanup_images: list[str],
) -> None:
    cleanup_images.append(GIT_REPO)

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("remote", "add", "origin", "https://user:token@git.example.com/team/proj.git")
    (tmp_path / "main.py").write_text("print('x')\n")
    git("add", "main.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    rev = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result, _ = build(cli, tmp_path, base_image, repo=GIT_REPO)
    assert result.returncode == 0, result.stderr
    ref = result.stdout.strip()
    assert ref.startswith(f"{GIT_REPO}:git-{rev[:12]}-")
    labels = engine.images.get(ref).attrs["Config"]["Labels"]
    assert labels["org.opencontainers.image.revision"] == rev
    # The origin URL without the credentials in it: nothing secret reaches the image.
    assert labels["org.opencontainers.image.source"] == "https://git.example.com/team/proj.git"
    assert labels["dev.ddpdeploy.git.dirty"] == "false"  # committed, nothing else
    engine.images.remove(ref)

    # An uncommitted change: same revision, new tag.
    (tmp_path / "main.py").write_text("print('y')\n")
    dirty, _ = build(cli, tmp_path, base_image, repo=GIT_REPO)
    assert dirty.returncode == 0, dirty.stderr
    assert dirty.stdout.strip().startswith(f"{GIT_REPO}:git-{rev[:12]}-")
    assert dirty.stdout.strip() != ref
    labels = engine.images.get(dirty.stdout.strip()).attrs["Config"]["Labels"]
    assert labels["dev.ddpdeploy.git.dirty"] == "true"
    engine.images.remove(dirty.stdout.strip())
