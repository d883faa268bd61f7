"""Where a collect reads from: a `Source` lists the entries directly in one folder and opens
its regular files (a local folder here; a pod and a staged compose volume in collect.pod and
collect.volume), and the verified reads every part of collect shares. Only regular files are
opened, by a reader that refuses anything else at open time (a symlink swapped in after the
listing included)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import BinaryIO, Protocol

from ddpdeploy import fs
from ddpdeploy.errors import OperationError, UserError

CHUNK = 1 << 20


# Kinds of folder entries (Source.entries).
FILE, SYMLINK, FOLDER, SPECIAL = "regular file", "symlink", "folder", "special file"


class Unreadable(Exception):
    """A source file that is gone, or not a regular file, when opened or while read."""


class Source(Protocol):
    where: str

    def entries(self) -> dict[str, str]:
        """Every entry directly in the folder: name -> kind (FILE, SYMLINK, FOLDER, SPECIAL),
        without following symlinks."""
        ...

    def open(
        self, name: str, limit: int | None = None
    ) -> contextlib.AbstractContextManager[BinaryIO]:
        """The regular file ``name`` (a plain name); Unreadable when it is gone or anything
        but a regular file at the moment it is opened, or when reading it fails. ``limit``:
        the caller reads no more than that many bytes, so a source may send no more."""
        ...


def shown(name: str) -> str:
    """A file name as it may appear in one line of text: control characters escaped."""
    text = name if name.isprintable() else repr(name)[1:-1]
    return text if len(text) <= 80 else f"{text[:60]}…({len(text)} characters)"


def plain_name(name: str) -> bool:
    """A name of a file directly in a folder: no separator, not `.` or `..`."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


class LocalSource:
    """A checkpoint folder on this machine (`smoke --local` writes .ddpdeploy/checkpoints/NAME)."""

    def __init__(self, folder: Path, where: str | None = None) -> None:
        if not folder.is_dir():
            raise UserError(f"--from local: no checkpoint folder at {folder}")
        self.folder = folder
        self.where = where or str(folder)

    def entries(self) -> dict[str, str]:
        out: dict[str, str] = {}
        try:
            with os.scandir(self.folder) as it:
                for entry in it:
                    if entry.is_symlink():
                        out[entry.name] = SYMLINK
                    elif entry.is_file(follow_symlinks=False):
                        out[entry.name] = FILE
                    elif entry.is_dir(follow_symlinks=False):
                        out[entry.name] = FOLDER
                    else:
                        out[entry.name] = SPECIAL
        except OSError as exc:
            raise OperationError(f"cannot list {self.where}: {exc.strerror or exc}") from None
        return out

    def open(
        self, name: str, limit: int | None = None
    ) -> contextlib.AbstractContextManager[BinaryIO]:
        del limit  # a local file is read only as far as the caller reads it
        if not plain_name(name):
            raise Unreadable(f"{shown(name)} is not a plain file name")
        # Through the one safe reader, never following a link: a symlink swapped in after
        # the listing is refused at the open, a FIFO does not hang it.
        try:
            return fs.open_regular(self.folder / name, follow_symlinks=False)  # type: ignore[return-value]
        except fs.NotRegularFile:
            link = os.path.islink(self.folder / name)
            raise Unreadable(
                _open_reason(OSError(errno.ELOOP, "")) if link else "not a regular file"
            ) from None
        except OSError as exc:
            raise Unreadable(_open_reason(exc)) from None


def _open_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink, not a regular file"
    if exc.errno == errno.ENOENT:
        return "vanished (no such file)"
    return exc.strerror or str(exc)


class NoCheckpoint(OperationError):
    """The folder holds no checkpoint to collect (with ``debug``: not an error by itself)."""


class Mismatch(Exception):
    """A copy whose sha256 (or size) is not the one expected."""


def read_chunks(
    source: Source, name: str, limit: int | None = None
) -> Generator[bytes, None, None]:
    """The file's bytes; a read error is the file's problem (Unreadable), not ours."""
    with source.open(name, limit) if limit is not None else source.open(name) as src:
        while True:
            try:
                chunk = src.read(CHUNK)
            except OSError as exc:
                raise Unreadable(exc.strerror or str(exc)) from None
            if not chunk:
                return
            yield chunk


def read_digest(source: Source, name: str) -> tuple[int, str]:
    """(size, sha256) of a plain file; Unreadable when it is a zip archive (torch.save's
    format) cut short: a script saving in place that is mid-write, or died mid-write, gives
    the same bytes on both reads, which alone cannot tell."""
    digest, size, head, tail = hashlib.sha256(), 0, b"", b""
    for chunk in read_chunks(source, name):
        digest.update(chunk)
        size += len(chunk)
        head = head or chunk[: len(_ZIP_START)]
        tail = (tail + chunk[-_ZIP_END_MAX:])[-_ZIP_END_MAX:]
    if head == _ZIP_START and not _zip_ends(tail):
        raise Unreadable(
            "a zip archive (torch.save's format) without its end record: cut short, or still "
            "being written (save to a temp name and os.replace it into place)"
        )
    return size, digest.hexdigest()


_ZIP_START = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"  # the end-of-central-directory record: 22 bytes + its comment
_ZIP_END_MAX = 22 + 0xFFFF


def _zip_ends(tail: bytes) -> bool:
    """Whether ``tail``, a file's last bytes, ends with a zip end record (and its comment)."""
    at = tail.rfind(_ZIP_END)
    while at >= 0:
        if len(tail) - at >= 22 and at + 22 + int.from_bytes(
            tail[at + 20 : at + 22], "little"
        ) == len(tail):
            return True
        at = tail.rfind(_ZIP_END, 0, at)
    return False


def verified_copy(
    source: Source,
    name: str,
    sha256: str,
    progress: Callable[[int], None],
    size: int | None = None,
) -> Callable[[BinaryIO], None]:
    """A writer's fill: copies ``name``, raising Mismatch (the writer then drops its temp
    file) unless the bytes have ``sha256`` (and ``size``)."""

    def fill(out: BinaryIO) -> None:
        digest, got = hashlib.sha256(), 0
        for chunk in read_chunks(source, name):
            digest.update(chunk)
            out.write(chunk)
            got += len(chunk)
            progress(len(chunk))
        if size is not None and got != size:
            raise Mismatch(f"changed size ({size} then {got} bytes)")
        if digest.hexdigest() != sha256:
            raise Mismatch("fails its sha256 check" if size is None else "changed content")

    return fill
