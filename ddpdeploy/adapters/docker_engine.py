"""The docker engine, through the docker SDK: connect, send a build context, tag, push.

Thin on purpose: the context comes from ddpdeploy.image.context, the streams are
read by ddpdeploy.adapters.docker_streams. The SDK is imported inside the functions, so
importing this module (or running `ddpdeploy render`) never needs docker.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import IO, Any

from ddpdeploy.adapters.docker_streams import BuildProgress, PushProgress
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.image_layout import DOCKERFILE

CONNECT_TIMEOUT = 15.0  # seconds for the first answer; a live engine answers in milliseconds
_START = (
    "start it (e.g. `sudo systemctl start docker`, or `dockerd &`) or point DOCKER_HOST at "
    "a running one"
)


def _check_host(host: str) -> None:
    """A DOCKER_HOST the SDK cannot even parse is bad input, not an engine that is down."""
    import docker.errors
    from docker.constants import IS_WINDOWS_PLATFORM
    from docker.utils import parse_host

    try:
        parse_host(host, IS_WINDOWS_PLATFORM)
    except (docker.errors.DockerException, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise UserError(
            f"DOCKER_HOST={host!r} is not an engine address ({reason}); use e.g. "
            "unix:///var/run/docker.sock or tcp://HOST:2375, or unset it"
        ) from None


def connect(hint: str = "") -> Any:
    """The one client to the engine DOCKER_HOST (or the default socket) names, checked with
    a ping that gives up after CONNECT_TIMEOUT seconds (an address that accepts and never
    answers does not hang us). Every failure is the same one line, ending in ``hint``."""
    # One plain import: ruff would file `docker.*` as first-party (this repo has docker/).
    import docker
    import requests
    from docker.constants import DEFAULT_TIMEOUT_SECONDS

    host = os.environ.get("DOCKER_HOST")
    if host:
        _check_host(host)
    where = host or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=CONNECT_TIMEOUT)  # asks the engine's API version
        client.ping()
    except (docker.errors.DockerException, requests.RequestException, ValueError) as exc:
        reason = " ".join(str(exc).split())[:300]
        fix = _START
        if "Permission denied" in reason:
            fix = f"give your user access to its socket (e.g. the docker group), or {_START}"
        raise OperationError(
            f"cannot reach the Docker engine at {where} ({reason}); {fix}{hint}"
        ) from None
    client.api.timeout = DEFAULT_TIMEOUT_SECONDS  # what later calls (streams, pushes) allow
    return client


def build(
    client: Any,
    context: IO[bytes],
    build_args: dict[str, str],
    base_image: str,
    on_event: Callable[[BuildProgress], None],
    no_cache: bool = False,
    network: str | None = None,
    labels: dict[str, str] | None = None,
) -> BuildProgress:
    """Build without a tag (so a failure tags nothing); raise OperationError on failure.
    ``labels`` go on the image (the inputs' hash, which a later build checks)."""
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
            labels=labels,
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


def image_labels(client: Any, ref: str) -> tuple[str, dict[str, str]] | None:
    """(image ID, labels) of a local image, or None when the engine has no such image."""
    import docker.errors
    import requests

    try:
        found = client.api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return None
    except (docker.errors.DockerException, requests.RequestException) as exc:
        reason = " ".join(str(exc).split())
        raise OperationError(f"the engine could not inspect {ref} ({reason})") from None
    return str(found["Id"]), dict((found.get("Config") or {}).get("Labels") or {})


def tag(client: Any, image_id: str, repository: str, tag_name: str) -> bool:
    """Tag the image; True when the tag is new (so a failed push may take it back)."""
    import docker.errors
    import requests

    ref = f"{repository}:{tag_name}"
    try:
        try:
            existed = client.api.inspect_image(ref)["Id"] == image_id
        except docker.errors.ImageNotFound:
            existed = False
        client.api.tag(image_id, repository, tag_name)
    except (docker.errors.DockerException, requests.RequestException) as exc:
        reason = " ".join(str(exc).split())
        raise OperationError(
            f"the engine built {image_id} but could not tag it {ref} ({reason})"
        ) from None
    return not existed


def image_id(client: Any, ref: str) -> str | None:
    """The engine's ID (sha256:…) of the local image ``ref`` names; None when the engine
    has no such image (compose will pull it)."""
    import docker.errors
    import requests

    try:
        return str(client.api.inspect_image(ref)["Id"])
    except docker.errors.ImageNotFound:
        return None
    except (docker.errors.DockerException, requests.RequestException) as exc:
        reason = " ".join(str(exc).split())
        raise OperationError(f"the engine could not inspect the image {ref} ({reason})") from None


def untag(client: Any, repository: str, tag_name: str) -> None:
    import docker.errors
    import requests

    # noprune: the layers stay as build cache; only the name goes. Best effort: this runs
    # while another error is on its way to the user, which must not be replaced.
    with contextlib.suppress(docker.errors.DockerException, requests.RequestException):
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
