"""The file system, once: the one atomic writer, the one safe reader of a regular file, the
one sha256 of a stream, and the one reader of a chunk iterator as a file.

Every file ddpdeploy writes goes through `Staged` (or `write_atomic`, its one-call form):
a temp file with a random name beside the target (created O_EXCL|O_NOFOLLOW, so nothing
planted at that name is followed or reused), written, fsync-ed, renamed over the target and
the folder fsync-ed; on any failure, Ctrl-C included, the temp file goes and the old file
stays. Only a regular file is ever replaced: a symlink, a device node, a FIFO or a folder in
the target's place is refused by name. System errors become one line naming the path.
`FolderLock` keeps two writers out of one folder at once (a lock on the folder itself).
(The trainer in train/ keeps its own writer: it never imports the CLI.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ddpdeploy.errors import DdpdeployError, OperationError, UserError
from ddpdeploy.streams import ChunkReader

CHUNK = 1 << 20
TEMP_SUFFIX = ".ddpdeploy-tmp"
# Errors the user fixes by naming another path (exit 2); the rest are the system's (exit 1).
_USER_ERRNOS = {
    errno.EISDIR,
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EEXIST,
    errno.ENAMETOOLONG,
    errno.ELOOP,
}
_KINDS = {
    stat.S_IFLNK: "a symlink",
    stat.S_IFDIR: "a folder",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


def not_regular(path: Path | str, kind: str, label: str = "") -> str:
    return f"{_prefix(label)}{path} is not a regular file ({kind})"


def _prefix(label: str) -> str:
    return f"{label}: " if label else ""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words ("a symlink", "a device", …)."""
    return _KINDS.get(stat.S_IFMT(mode), "an unknown kind of file")


def write_error(
    path: Path | str, exc: OSError, label: str = "", verb: str = "write"
) -> DdpdeployError:
    """One line naming ``path``: exit 2 where another path fixes it, 1 where the system
    refused (no space, read-only, no permission)."""
    text = f"{_prefix(label)}cannot {verb} {path}: {exc.strerror or exc}"
    if exc.errno in _USER_ERRNOS:
        return UserError(text)
    return OperationError(text)


def _refuse_unless_regular(path: Path, label: str, replace_link: bool = False) -> int | None:
    """The mode of the regular file at ``path`` (None when there is none); anything else
    in its place is refused, never replaced (a symlink only where ``replace_link``: the
    rename replaces the link itself, never what it points to)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise write_error(path, exc, label) from None
    if stat.S_ISLNK(mode) and replace_link:
        return None
    if not stat.S_ISREG(mode):
        raise UserError(
            f"{not_regular(path, kind_of(mode), label)}; ddpdeploy replaces only regular "
            "files: name another path or move it away"
        )
    return stat.S_IMODE(mode)


def temp_beside(path: Path) -> Path:
    """A fresh temp name beside ``path``: ``.NAME.<random>.ddpdeploy-tmp``, NAME cut to 200
    bytes so that a name near the file system's 255 still leaves room for the rest."""
    name = os.fsdecode(os.fsencode(path.name)[:200])
    return path.with_name(f".{name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")


class Staged:
    """A new version of ``path``, written to a temp file beside it until `commit` renames it
    over the target; leaving the ``with`` block without `commit` removes the temp file.

    The new file keeps the mode of the one it replaces, else gets the umask's (as an editor
    would give it). ``replace_link``: a symlink at ``path`` is replaced too (by the new
    file; its target is never touched), for a caller the user told to overwrite."""

    def __init__(self, path: Path | str, label: str = "", replace_link: bool = False) -> None:
        self.path = Path(path)
        self.label = label
        self.replace_link = replace_link
        self.committed = self.discarded = False
        self._fd: int | None = None
        mode = _refuse_unless_regular(self.path, label, replace_link)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(8):  # a taken name (planted or a parallel run's) only costs a retry
            self.temp = temp_beside(self.path)
            try:
                self._fd = os.open(self.temp, flags, 0o666)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise write_error(self.path, exc, label) from None
        else:
            raise OperationError(f"{_prefix(label)}cannot write {self.path}: no free temp name")
        try:
            if mode is not None:
                os.fchmod(self._fd, mode)
        except BaseException:
            self.discard()
            raise

    def write(self, data: bytes) -> None:
        if self._fd is None:
            raise ValueError("write after commit or discard")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            raise write_error(self.path, exc, self.label) from None

    def sync(self) -> None:
        """The content on disk (fsync), ready to be renamed in; no more writes."""
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise write_error(self.path, exc, self.label) from None
        os.close(self._fd)
        self._fd = None

    def commit(self, replace: bool = True) -> None:
        """`sync`, rename over the target (only if still a regular file or absent), fsync
        the folder. ``replace=False``: only where nothing is at the target yet (a hard link,
        which never replaces); FileExistsError, unconverted, when something is."""
        if self.committed or self.discarded:
            raise ValueError("commit after commit or discard")
        self.sync()
        try:
            if replace:
                # Something else may have been put there since the temp file was made.
                _refuse_unless_regular(self.path, self.label, self.replace_link)
                os.replace(self.temp, self.path)
            else:
                os.link(self.temp, self.path, follow_symlinks=False)
                self.committed = True
                with contextlib.suppress(OSError):
                    os.unlink(self.temp)  # the file lives on under its name
            self.committed = True
            fsync_folder(self.path.parent)
        except OSError as exc:
            if isinstance(exc, FileExistsError) and not replace:
                raise  # the caller decides what a file already there means
            raise write_error(self.path, exc, self.label) from None

    def discard(self) -> None:
        self.discarded = not self.committed
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if not self.committed:
            with contextlib.suppress(OSError):
                os.unlink(self.temp)

    def __enter__(self) -> Staged:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.discard()


def write_atomic(
    path: Path | str, data: bytes, label: str = "", replace_link: bool = False
) -> None:
    """Replace (or create) the regular file ``path`` with ``data``, whole or not at all."""
    with Staged(path, label, replace_link) as out:
        out.write(data)
        out.commit()


OWN_GITIGNORE = b"*\n"


def linked_below(root: Path, rel: Path) -> None:
    """Refuse (UserError) when a part of ``rel`` below ``root`` is a symlink: ddpdeploy
    empties and writes folders in its own place, never through a link to another one."""
    path = root
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            shown = path.relative_to(root) if root != Path() else path
            raise UserError(
                f"{shown} is a symlink (to {os.readlink(path)}); ddpdeploy empties and writes "
                "folders there, so it must be a folder of its own: remove the link"
            )


def own_folder(folder: Path) -> Path:
    """ddpdeploy's own folder in the user's workspace (paths.OWN_DIR), made when missing,
    with a ``.gitignore`` of ``*`` inside, so that the user's `git status` never shows it
    (nor the .gitignore itself): written atomically, and again if it went missing. The one
    way the folder is made; returns ``folder``. A symlink in its place is refused: smoke
    empties folders below it and moves files into it, which must not happen elsewhere."""
    linked_below(folder.parent, Path(folder.name))
    try:
        folder.mkdir(exist_ok=True)
        ignore = folder / ".gitignore"
        if not os.path.lexists(ignore):
            write_atomic(ignore, OWN_GITIGNORE)
    except OSError as exc:
        raise write_error(folder, exc, verb="create") from None
    return folder


def fsync_folder(folder: Path | str) -> None:
    """Make a rename in ``folder`` survive a power cut."""
    fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # some file systems cannot sync a folder: fine
            raise
    finally:
        os.close(fd)


# flock errors that mean "this file system cannot lock" (some network mounts), not "busy".
_NO_LOCK_ERRNOS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF}


class FolderBusy(Exception):
    """Another writer (another process, or another lock taken here) holds the folder's lock."""


class FolderLock:
    """An exclusive lock on the existing folder ``path`` itself (flock on the folder's own
    fd), held until `release`, for a writer that must not share the folder with another at
    once. No lock file, so nothing is left behind; the kernel drops the lock when its process
    ends however it ends (SIGKILL included), so no stale lock outlives its writer. Never
    waited for: FolderBusy at once. A file system that cannot lock gives no lock (writes go
    on as they would without one)."""

    def __init__(self, path: Path | str, label: str = "") -> None:
        self.path = Path(path)
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise write_error(path, exc, label, verb="lock") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise FolderBusy(str(path)) from None
        except OSError as exc:
            if exc.errno not in _NO_LOCK_ERRNOS:
                self.release()
                raise write_error(path, exc, label, verb="lock") from None
        except BaseException:
            self.release()
            raise
        if not self._still_at_path():
            # Removed or replaced between our open and our lock (its last holder's rollback):
            # a lock on a folder nobody can reach any more keeps nobody out.
            self.release()
            raise FolderBusy(str(path))

    def _still_at_path(self) -> bool:
        assert self._fd is not None
        try:
            now = os.stat(self.path)
        except OSError:
            return False
        held = os.fstat(self._fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Drop the lock (closing the folder's fd is what drops it); idempotent."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class NotRegularFile(UserError, OSError):
    """Something other than a regular file where one is to be read: one line for the user,
    and an OSError for a caller that treats it like any other unreadable file."""


def open_regular(path: Path | str, label: str = "", follow_symlinks: bool = True) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file (checked with fstat after the
    open, so a file swapped in between is caught too); a FIFO never blocks the open.

    Raises FileNotFoundError (the caller knows what a missing file means), NotRegularFile,
    or OSError for the rest."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise NotRegularFile(not_regular(path, "a symlink", label)) from None
        if exc.errno == errno.ENXIO:  # a socket
            raise NotRegularFile(not_regular(path, "a socket", label)) from None
        if isinstance(exc, FileNotFoundError) and os.path.islink(path):
            raise NotRegularFile(f"{_prefix(label)}{path} is a symlink to a missing file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(not_regular(path, kind_of(mode), label))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_at_most(source: IO[bytes], limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``source`` (so the caller sees it is too long), however
    short each read is (a raw stream, a pipe)."""
    parts: list[bytes] = []
    got = 0
    while got <= limit and (block := source.read(limit + 1 - got)):
        parts.append(block)
        got += len(block)
    return b"".join(parts)


def starts_with(path: Path | str, head: bytes, label: str = "") -> bool | None:
    """Whether the regular file ``path`` begins with ``head``; None when nothing is there.
    Anything else at ``path`` (a symlink too) is NotRegularFile, one line ending in what to
    do (the writer would not replace it either); OSError for the rest."""
    try:
        with open_regular(path, label, follow_symlinks=False) as fh:
            return read_at_most(fh, len(head)).startswith(head)
    except FileNotFoundError:
        return None
    except NotRegularFile as exc:
        raise NotRegularFile(
            f"{exc}; ddpdeploy replaces only regular files: name another path or move it away"
        ) from None


def read_regular(
    path: Path | str,
    label: str = "",
    limit: int = CHUNK,
    follow_symlinks: bool = True,
    hint: str = "",
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; every refusal is
    one UserError line, ending in ``hint`` when given (FileNotFoundError is left to the
    caller, who knows what a missing file means)."""
    end = f"; {hint}" if hint else ""
    try:
        with open_regular(path, label, follow_symlinks) as fh:
            data = read_at_most(fh, limit)
    except FileNotFoundError:
        raise
    except NotRegularFile as exc:
        raise NotRegularFile(f"{exc}{end}") from None
    except OSError as exc:
        raise UserError(f"{_prefix(label)}cannot read {path}: {exc.strerror or exc}{end}") from None
    if len(data) > limit:
        end = end or "; is it the right file?"
        raise UserError(f"{_prefix(label)}{path} is larger than {limit >> 10} KiB{end}")
    return data


def sha256_stream(
    source: IO[bytes], sink: Callable[[bytes], Any] | None = None, chunk: int = CHUNK
) -> str:
    """The sha256 of what ``source`` holds, read in chunks (each handed to ``sink`` too)."""
    digest = hashlib.sha256()
    while block := source.read(chunk):
        digest.update(block)
        if sink is not None:
            sink(block)
    return digest.hexdigest()


def sha256_file(path: Path | str, follow_symlinks: bool = True) -> str:
    """The sha256 of the regular file ``path`` (see `open_regular` for what it raises)."""
    with open_regular(path, follow_symlinks=follow_symlinks) as fh:
        return sha256_stream(fh)


def chunk_reader(chunks: Iterable[bytes], buffer_size: int = CHUNK) -> io.BufferedReader:
    """An iterator of byte chunks (the engine's archive, an exec's output) as a binary file,
    buffered for tarfile's small reads."""
    return io.BufferedReader(ChunkReader(chunks), buffer_size=buffer_size)


def file_path(text: str, label: str, example: str) -> Path:
    """``text`` as the path of a file to write; UserError when it names a folder by its
    spelling (`out/`, `out/.`: Path drops the slash, and a file `out` was written)."""
    if text == "":
        raise UserError(f"{label}: empty; name a file, e.g. {example}")
    if text.endswith(("/", "/.", "/..")) or text in (".", ".."):
        raise UserError(f"{label}: {text!r} names a folder; give a file path, e.g. {example}")
    return Path(text)
