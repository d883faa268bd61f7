"""The docker engine, through the docker SDK: connect, send a build context, tag, push.

Thin on purpose: what goes into the context, the tag and how the streams read live in
ddpdeploy.render.image. The SDK is imported inside the functions, so importing this module
(or running `ddpdeploy render`) never needs docker.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ddpdeploy.errors import OperationError
from ddpdeploy.render.image import (
    DEFAULT_IGNORES,
    DOCKERFILE,
    FIXED_MTIME,
    WORKSPACE_DIR,
    BuildProgress,
    ContextEntry,
    PushProgress,
    dockerignore_patterns,
)


def connect() -> Any:
    """A client for the engine DOCKER_HOST (or the default socket) names, checked with a ping."""
    # One plain import: ruff would file `docker.*` as first-party (this repo has docker/).
    import docker

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        reason = " ".join(str(exc).split())
        raise OperationError(
            f"cannot reach the Docker engine at {where} ({reason}); start it (e.g. `sudo "
            "systemctl start docker`, or `dockerd &`) or point DOCKER_HOST at a running one"
        ) from None
    return client


def workspace_files(workspace: Path) -> set[str]:
    """Paths of ``workspace`` that its .dockerignore keeps, matched by the docker SDK itself."""
    from docker.utils.build import exclude_paths

    ignore = workspace / ".dockerignore"
    patterns = list(DEFAULT_IGNORES)
    if ignore.is_file():
        patterns += dockerignore_patterns(ignore.read_text())
    # exclude_paths re-includes a file named like its dockerfile argument; name one that the
    # workspace cannot hold so an ignored Dockerfile of the user's stays ignored.
    return set(exclude_paths(str(workspace), patterns, dockerfile="\0ddpdeploy-none"))


def git_revision(workspace: Path) -> str | None:
    """HEAD's commit of the repository holding ``workspace``, or None outside git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(workspace), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def git_source(workspace: Path) -> str:
    """The origin URL for the OCI source label, without credentials someone put in it."""
    try:
        out = subprocess.run(
            ["git", "-C", str(workspace), "remote", "get-url", "origin"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    url = out.stdout.strip()
    if "://" in url and "@" in url.split("://", 1)[1].split("/", 1)[0]:
        scheme, rest = url.split("://", 1)
        url = f"{scheme}://{rest.split('@', 1)[1]}"
    return url


def write_context(entries: list[ContextEntry], fileobj: IO[bytes]) -> None:
    """The context tar, with normalised owners and mtimes so equal files make equal entries
    (the classic builder's COPY cache compares them)."""
    with tarfile.open(fileobj=fileobj, mode="w") as tar:
        # An empty workspace still needs its folder for `COPY workspace/ /workspace/`.
        folder = tarfile.TarInfo(WORKSPACE_DIR)
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, FIXED_MTIME
        tar.addfile(folder)
        for entry in entries:
            info = tarfile.TarInfo(entry.arcname)
            info.mtime, info.mode = FIXED_MTIME, entry.mode
            if entry.link_target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link_target
                tar.addfile(info)
                continue
            if entry.source is not None:
                # Streamed from disk: a large file never sits in memory whole.
                with entry.source.open("rb") as fh:
                    info.size = os.fstat(fh.fileno()).st_size
                    tar.addfile(info, fh)
                continue
            body = entry.content()
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    fileobj.seek(0)


@contextmanager
def context_file(entries: list[ContextEntry]) -> Iterator[IO[bytes]]:
    # Spooled: small contexts stay in memory, large ones go to disk, not all in RAM.
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as fileobj:
        write_context(entries, fileobj)
        yield fileobj


def build(
    client: Any,
    context: IO[bytes],
    build_args: dict[str, str],
    base_image: str,
    on_event: Callable[[BuildProgress], None],
    no_cache: bool = False,
    network: str | None = None,
) -> BuildProgress:
    """Build without a tag (so a failure tags nothing); raise OperationError on failure."""
    import docker.errors
    import requests

    progress = BuildProgress()
    try:
        stream = client.api.build(
            fileobj=context,
            custom_context=True,
            dockerfile=DOCKERFILE,
            buildargs=build_args,
            rm=True,
            forcerm=True,
            decode=True,
            nocache=no_cache,
            network_mode=network,
        )
        for event in stream:
            progress.feed(event)
            on_event(progress)
    # requests' errors: the engine went away mid-stream.
    except (docker.errors.DockerException, requests.RequestException) as exc:
        progress.error = str(exc)
    progress.finish()
    if progress.error or not progress.image_id:
        # The one-line error carries the failing step's tail; the whole log goes to a file.
        with tempfile.NamedTemporaryFile(
            "w", prefix="ddpdeploy-build-", suffix=".log", delete=False
        ) as fh:
            fh.write("\n".join(progress.log) + "\n")
        raise OperationError(f"{progress.failure_message(base_image)} (full log: {fh.name})")
    return progress


def tag(client: Any, image_id: str, repository: str, tag_name: str) -> bool:
    """Tag the image; True when the tag is new (so a failed push may take it back)."""
    import docker.errors

    try:
        existed = client.api.inspect_image(f"{repository}:{tag_name}")["Id"] == image_id
    except docker.errors.ImageNotFound:
        existed = False
    client.api.tag(image_id, repository, tag_name)
    return not existed


def untag(client: Any, repository: str, tag_name: str) -> None:
    # noprune: the layers stay as build cache; only the name goes.
    client.api.remove_image(f"{repository}:{tag_name}", noprune=True)


def push(
    client: Any, repository: str, tag_name: str, on_event: Callable[[PushProgress], None]
) -> str:
    """Push with the credentials of the user's docker config; return the manifest digest."""
    import docker.errors
    import requests

    progress = PushProgress()
    try:
        # The SDK reads ~/.docker/config.json (and credential helpers) for the registry.
        for event in client.api.push(repository, tag=tag_name, stream=True, decode=True):
            progress.feed(event)
            on_event(progress)
    except (docker.errors.DockerException, requests.RequestException) as exc:
        progress.error = " ".join(str(exc).split())
    ref = f"{repository}:{tag_name}"
    if progress.auth_failure:
        first = repository.split("/", 1)[0]
        # No host part (me/train): Docker Hub, where plain `docker login` logs in.
        is_host = "/" in repository and ("." in first or ":" in first or first == "localhost")
        login = f"docker login {first}" if is_host else "docker login"
        raise OperationError(
            f"the registry refused to push {ref}: {progress.error}; log in with "
            f"`{login}` (credentials are read from your docker config)"
        )
    if progress.error:
        raise OperationError(f"pushing {ref} failed: {progress.error}")
    if not progress.digest:
        raise OperationError(f"pushing {ref} finished without reporting a digest")
    return progress.digest
