"""Where a collect lands (`--to`): checked before anything is read, locked against a
parallel collect, each file written atomically, nothing replaced unless asked (identical files
are kept), and on any failure put back as it was."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ddpdeploy import fs
from ddpdeploy.errors import UserError


class Destination:
    """The `--to` folder: checked before anything is read, created and locked by `lock`
    (or created when first written), and put back as it was (what this run created
    removed) on failure."""

    def __init__(self, path: Path, overwrite: bool) -> None:
        self.path, self.overwrite = path, overwrite
        self._made_dirs: list[Path] = []
        self._made_files: list[Path] = []
        self._lock: fs.FolderLock | None = None
        self._old: dict[Path, Path] = {}  # a file --overwrite replaced -> its old version

    def existing(self) -> Path:
        """`--to`, or its nearest folder above that exists (where it would be created)."""
        probe = Path(os.path.abspath(self.path))
        while not os.path.lexists(probe) and probe != probe.parent:
            probe = probe.parent
        return probe

    def check(self) -> None:
        """Refuse a `--to` that cannot be a folder we can write into; creates nothing."""
        path = Path(os.path.abspath(self.path))
        probe = self.existing()
        if not probe.is_dir():
            what = "is" if probe == path else f"is under {probe}, which is"
            raise UserError(f"--to: {self.path} {what} not a folder; name a folder to collect into")
        if not os.access(probe, os.W_OK | os.X_OK):
            what = "is not writable" if probe == path else f"cannot be created in {probe}"
            read_only = os.statvfs(probe).f_flag & os.ST_RDONLY
            why = "a read-only file system" if read_only else "permission denied"
            raise UserError(f"--to: {self.path} {what} ({why}); choose another folder")

    def check_free(self, name: str, sha256: str) -> None:
        """Refuse before copying when ``name`` exists in `--to` and is not the same file."""
        target = self.path / name
        if not os.path.lexists(target):
            return
        if not target.is_file() or target.is_symlink():
            raise UserError(f"--to: {target} exists and is not a regular file; remove it first")
        if self.overwrite or _file_sha256(target) == sha256:
            return
        raise UserError(
            f"--to: {target} already exists and differs; pass --overwrite to replace it, or "
            "collect into another folder"
        )

    def lock(self) -> None:
        """Create `--to` if need be and hold its lock until `finish`: a second collect into
        the same folder meanwhile is refused with one line (exit 2), so the folder never
        holds a mix of two runs' files."""
        self._ensure()
        try:
            self._lock = fs.FolderLock(self.path, "--to")
        except fs.FolderBusy:
            # Whichever of the two made the folders, they hold the other run's files now.
            self._made_dirs.clear()
            raise UserError(
                f"--to: another collect is writing {self.path}; wait for it to end, or "
                "collect into another folder"
            ) from None

    def finish(self) -> None:
        """After success or `rollback`: drop the old versions kept for a rollback, release
        the lock."""
        for old in self._old.values():
            with contextlib.suppress(OSError):
                old.unlink()
        self._old.clear()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def write(self, name: str, fill: bytes | Callable[[BinaryIO], None]) -> None:
        self._ensure()
        target = self.path / name
        old = self._keep_old(target) if self.overwrite else None
        try:
            created = _write_atomic(target, fill, overwrite=self.overwrite)
        except BaseException as exc:
            if old is not None:  # the file was not replaced: its second name goes
                with contextlib.suppress(OSError):
                    old.unlink()
            if isinstance(exc, OSError):
                raise UserError(f"--to: writing {target}: {exc.strerror or exc}") from None
            raise
        if created:
            self._made_files.append(target)
            if old is not None:
                self._old[target] = old

    def _keep_old(self, target: Path) -> Path | None:
        """A second name (a hard link: no space taken) for the file at ``target`` that
        --overwrite is about to replace, so that a rollback can put it back."""
        if not os.path.lexists(target):
            return None
        old = fs.temp_beside(target)
        try:
            os.link(target, old, follow_symlinks=False)
        except OSError as exc:
            raise fs.write_error(target, exc, "--to") from None
        return old

    def _ensure(self) -> None:
        missing: list[Path] = []
        probe = Path(os.path.abspath(self.path))
        while not os.path.lexists(probe):
            missing.append(probe)
            probe = probe.parent
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except OSError as exc:
                if isinstance(exc, FileExistsError) and folder.is_dir():
                    continue  # made meanwhile by a parallel collect: never ours to remove
                # No space or read-only is exit 1, as for a file; a path in the way exit 2.
                raise fs.write_error(folder, exc, "--to", verb="create") from None
            self._made_dirs.append(folder)

    def rollback(self) -> None:
        for path in reversed(self._made_files):
            with contextlib.suppress(OSError):
                if path in self._old:
                    os.replace(self._old.pop(path), path)  # the file --overwrite replaced
                else:
                    path.unlink()
        for folder in reversed(self._made_dirs):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: never what someone else put there


def _file_sha256(path: Path) -> str | None:
    try:
        return fs.sha256_file(path, follow_symlinks=False)
    except OSError:
        return None


def _write_atomic(
    path: Path, fill: bytes | Callable[[BinaryIO], None], *, overwrite: bool = False
) -> bool:
    """Write ``path`` whole or not at all through the project's one atomic writer; without
    ``overwrite`` a create-only commit (a hard link, which never replaces). False when an
    identical file was already there (kept)."""
    with fs.Staged(path, "--to") as out:
        if isinstance(fill, bytes):
            out.write(fill)
        else:
            fill(out)  # type: ignore[arg-type]  # Staged.write is all a fill calls
        try:
            out.commit(replace=overwrite)
        except FileExistsError:
            out.sync()
            if _file_sha256(path) == fs.sha256_file(out.temp) and not path.is_symlink():
                return False
            raise UserError(
                f"--to: {path} already exists and differs; pass --overwrite to replace it"
            ) from None
    return True
