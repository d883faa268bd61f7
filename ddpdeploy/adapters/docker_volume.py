"""A Docker named volume's folder, copied out through the engine (for `collect --from
compose`): a container that mounts the volume read-only is created, never started, and
removed afterwards; its archive API streams the folder as tar."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.streams import ChunkReader

MOUNT = "/ddpdeploy-volume"


def _client() -> Any:
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise OperationError(f"no Docker engine answers ({exc}); start it and try again") from None
    return client


def _image_for(client: Any, volume: str, image: str | None) -> str:
    """``image``, else the image of a container that used the volume (the compose run's)."""
    if image:
        return image
    for container in client.containers.list(all=True, filters={"volume": volume}):
        tags = container.image.tags
        return tags[0] if tags else container.image.id
    raise UserError(
        f"--image: no container uses volume {volume} any more; name a local image to read it with"
    )


def copy_out(volume: str, folder: str, dest: Path, image: str | None = None) -> None:
    """Copy ``folder`` (a path inside the volume) into the existing folder ``dest``."""
    import docker

    client = _client()
    try:
        client.volumes.get(volume)
    except docker.errors.NotFound:
        raise UserError(f"--volume: no Docker volume named {volume}") from None
    container = client.containers.create(
        _image_for(client, volume, image),
        command=["true"],
        volumes={volume: {"bind": MOUNT, "mode": "ro"}},
    )
    try:
        stream, _ = container.get_archive(f"{MOUNT}/{folder.strip('/')}/.")
        reader = io.BufferedReader(ChunkReader(stream), buffer_size=1 << 20)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            tar.extractall(dest, filter="data")
    except docker.errors.NotFound:
        raise OperationError(f"volume {volume} has no folder {folder!r}") from None
    except docker.errors.DockerException as exc:
        raise OperationError(f"reading volume {volume}: {exc}") from None
    finally:
        container.remove(force=True)
