"""Reading a compose run's checkpoint volume, for `collect --from compose`.

The volume's folder is copied out through the engine: a container that mounts the volume
read-only is created, never started, and removed afterwards; its archive API streams the folder
as tar. Only the regular files directly in the folder are written out (each to a new file,
never through a link); symlinks, devices, FIFOs and subfolders are reported back, not
extracted, so a hostile volume can neither crash the copy nor write outside the staging.

The files are staged beside `--to` (the same file system, so the final rename stays atomic; no
folder of ours made) and collected from there like any local folder; the staging goes on the
way out, on failure and Ctrl-C too."""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ddpdeploy.adapters.docker_engine import connect
from ddpdeploy.collect.debug import MAX_DEBUG, debug_kind
from ddpdeploy.collect.destination import Destination
from ddpdeploy.collect.source import FOLDER, LocalSource, shown
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.fs import chunk_reader, write_error

MOUNT = "/ddpdeploy-volume"


def _image_for(client: Any, volume: str, image: str | None) -> str:
    """``image``, else the image of a container that used the volume (the compose run's)."""
    if image:
        return image
    for container in client.containers.list(all=True, filters={"volume": volume}):
        tags = container.image.tags
        return str(tags[0] if tags else container.image.id)
    raise UserError(
        f"--image: no container uses volume {volume} any more; name a local image to read it with"
    )


def copy_out(
    volume: str,
    folder: str,
    dest: Path,
    image: str | None = None,
    limit_of: Callable[[str], int | None] = lambda name: None,
) -> dict[str, str]:
    """Copy the regular files of ``folder`` (a path inside the volume) into the existing,
    empty folder ``dest``, each at most ``limit_of(name)`` bytes where that is not None;
    return the other entries directly in it: name -> kind."""
    import docker

    client = connect()
    try:
        client.volumes.get(volume)
    except docker.errors.NotFound:
        raise UserError(f"--volume: no Docker volume named {volume}") from None
    reader = _image_for(client, volume, image)
    try:
        container = client.containers.create(
            reader, command=["true"], volumes={volume: {"bind": MOUNT, "mode": "ro"}}
        )
    except docker.errors.ImageNotFound:
        raise UserError(
            f"--image: no local image {reader}; name an image this engine has (`docker images`)"
        ) from None
    except docker.errors.DockerException as exc:
        raise OperationError(f"reading volume {volume}: {exc}") from None
    try:
        stream, _ = container.get_archive(f"{MOUNT}/{folder.strip('/')}/.")
        with tarfile.open(fileobj=chunk_reader(stream), mode="r|") as tar:
            return _extract_files(tar, dest, limit_of)
    except docker.errors.NotFound:
        raise OperationError(f"volume {volume} has no folder {folder!r}") from None
    except docker.errors.DockerException as exc:
        raise OperationError(f"reading volume {volume}: {exc}") from None
    except tarfile.TarError as exc:
        raise OperationError(f"reading volume {volume}: a broken archive ({exc})") from None
    finally:
        container.remove(force=True)


def _extract_files(
    tar: tarfile.TarFile, dest: Path, limit_of: Callable[[str], int | None]
) -> dict[str, str]:
    others: dict[str, str] = {}
    for member in tar:  # a stream: members in order, each read once
        name = member.name.removeprefix("./")
        if name in ("", ".") or "/" in name.rstrip("/"):
            continue  # the folder itself, or inside a subfolder: not part of the checkpoint
        name = name.rstrip("/")
        if not member.isreg():
            others[name] = (
                "symlink"
                if member.issym()
                else "hard link"
                if member.islnk()
                else "folder"
                if member.isdir()
                else "special file"
            )
            continue
        if name in (".", "..") or "\0" in name:
            continue
        src = tar.extractfile(member)
        assert src is not None  # a regular member always has data
        # O_EXCL|O_NOFOLLOW: a new file in our own fresh folder, never through a link.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        room = limit_of(name)
        try:
            with src, os.fdopen(os.open(dest / name, flags, 0o600), "wb") as out:
                while chunk := src.read(1 << 20 if room is None else min(1 << 20, room)):
                    out.write(chunk)
                    if room is not None:
                        room -= len(chunk)
                        if room <= 0:
                            break  # the stream skips the rest of this member unwritten
        except OSError as exc:  # the staging's disk (beside --to) is full, or read-only
            raise write_error(dest / name, exc, "--to", verb="stage") from None
    return others


@contextlib.contextmanager
def volume_source(
    volume: str, image: str | None, to: Path, debug: bool, warn: Callable[[str], None]
) -> Iterator[LocalSource]:
    """The volume's regular files staged, as a source (with ``debug``, a diagnostics file
    staged only as far as collect reads it); each other entry is one line to ``warn``.
    ``image``: a local image to mount the volume with."""

    def limit_of(entry: str) -> int | None:
        return MAX_DEBUG + 1 if debug and debug_kind(entry) else None

    with _staging(to) as folder:
        where = f"volume {volume}"
        others = copy_out(volume, ".", Path(folder), image, limit_of)
        for entry, kind in sorted(others.items()):
            if kind != "folder":  # a folder is the listing's to name, as in a local folder
                warn(f"skipping {shown(entry)} in {where}: a {kind}, not a regular file")
        yield _StagedVolume(Path(folder), where, [n for n, k in others.items() if k == "folder"])


class _StagedVolume(LocalSource):
    """The staged regular files, listed with the volume's subfolders (never staged), so a
    volume of only folders is told as a local folder of only folders is, not as empty."""

    def __init__(self, folder: Path, where: str, folders: list[str]) -> None:
        super().__init__(folder, where)
        self.folders = folders

    def entries(self) -> dict[str, str]:
        return {**dict.fromkeys(self.folders, FOLDER), **super().entries()}


def _staging(to: Path) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder beside --to (or where it would be created); inside --to only when
    its parent is not ours to write."""
    near = Destination(to, overwrite=False).existing()
    if near == Path(os.path.abspath(to)) and os.access(near.parent, os.W_OK | os.X_OK):
        near = near.parent
    try:
        return tempfile.TemporaryDirectory(prefix=".ddpdeploy-collect-", dir=near)
    except OSError as exc:
        # Same line as before; a full or read-only disk exits 1 like every write of collect.
        raise write_error(near, exc, "--to", verb="stage files in") from None
