"""The build context on disk: find the files the workspace's .dockerignore keeps, then write
them into one tar while hashing its bytes.

Memory stays bounded whatever the workspace holds: ignored paths are never opened (ignored
folders are not even walked), kept files are streamed in small chunks, and the tar spills
to a temporary file past a few MB. The hash is taken over the very bytes the engine gets,
in the same single read of each file.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ddpdeploy import fs
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.image.plan import (
    DEFAULT_IGNORES,
    REQUIREMENTS,
    ContextEntry,
    LocalFile,
    dockerignore_patterns,
)
from ddpdeploy.image_layout import CONTEXT_WORKSPACE
from ddpdeploy.text import plain

if TYPE_CHECKING:
    from docker.utils.build import PatternMatcher

# A fixed mtime (1980-01-01, the earliest a zip can hold) so identical files give identical
# tar entries whatever their checkout time; the image content does not depend on when.
FIXED_MTIME = 315532800
SPOOL_MAX = 8 << 20  # a code-only context stays in memory; a larger one goes to disk
SMALL_FILE_MAX = 1 << 20  # .dockerignore and requirements.txt are read whole: bound them
_FIX = "fix its permissions or list it in .dockerignore"


def _read_small(path: Path) -> bytes:
    """A small regular file's bytes (following a symlink), or a one-line refusal: a FIFO
    would block and /dev/zero would never end."""
    try:
        return fs.read_regular(path, limit=SMALL_FILE_MAX, hint=_FIX)
    except FileNotFoundError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror}); {_FIX}") from None


def ignore_patterns(workspace: Path) -> list[str]:
    """The default ignores, then the workspace's .dockerignore patterns."""
    ignore = workspace / ".dockerignore"
    if not os.path.lexists(ignore):
        return list(DEFAULT_IGNORES)
    try:
        text = _read_small(ignore).decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{ignore} is not UTF-8 text; save it as UTF-8") from None
    return [*DEFAULT_IGNORES, *dockerignore_patterns(text)]


def _utf8(name: str, what: str) -> str:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(
            f"{what} {name!r} in the build workspace is not valid UTF-8; rename it or list it "
            "in .dockerignore"
        ) from None
    return name


def _local_files(root: Path, rels: Iterable[str]) -> list[LocalFile]:
    """Regular files and symlinks among ``rels`` (from lstat: nothing is opened, no link is
    followed); folders are implied by their files, FIFOs, sockets and devices are skipped."""
    files = []
    for rel in sorted(rels):
        path = root / rel
        try:
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                target = _utf8(os.readlink(path), "the symlink target of")
                files.append(LocalFile(_utf8(rel, "the file name"), path, link_target=target))
            elif stat.S_ISREG(mode):
                files.append(LocalFile(_utf8(rel, "the file name"), path, bool(mode & 0o111)))
        except OSError as exc:
            raise UserError(f"cannot read {path} ({exc.strerror or exc}); {_FIX}") from None
    return files


def _matcher(workspace: Path) -> PatternMatcher:
    """The docker SDK's matcher of the default ignores and the workspace's .dockerignore, as
    its exclude_paths builds it (the same rules as `docker build`)."""
    from docker.utils.build import PatternMatcher

    # exclude_paths re-includes a file named like its dockerfile argument; name one the
    # workspace cannot hold so an ignored Dockerfile of the user's stays ignored.
    return PatternMatcher([*ignore_patterns(workspace), "!\0ddpdeploy-none"])


@contextmanager
def _scan_errors(workspace: Path) -> Iterator[None]:
    """The matcher's and the walk's failures as one line each."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or workspace
        raise UserError(f"cannot list {where} ({exc.strerror or exc}); {_FIX}") from None
    except re.error as exc:  # a pattern is compiled as it is first matched
        raise UserError(f"{workspace / '.dockerignore'}: a pattern is invalid ({exc})") from None
    except RecursionError:
        # The SDK's walk recurses once per folder level.
        raise UserError(
            f"{workspace} has folders nested too deeply to walk; list the deep folder in "
            ".dockerignore"
        ) from None


def scan_workspace(workspace: Path) -> list[LocalFile]:
    """The workspace's files that the default ignores and its .dockerignore keep, matched by
    the docker SDK itself (its exclude_paths' walk)."""
    with _scan_errors(workspace):
        kept = set(_matcher(workspace).walk(str(workspace)))
    return _local_files(workspace, kept)


def kept_in_context(workspace: Path, rel: str) -> bool:
    """Whether scan_workspace keeps ``rel`` (a path below real folders of ``workspace``),
    without walking the whole workspace: the SDK's walk along that one path, which skips a
    matched folder unless an exception pattern ("!dir/file") starts with it."""
    from docker.utils.build import normalize_slashes

    with _scan_errors(workspace):
        matcher = _matcher(workspace)
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            reopened = any(
                p.exclusion and p.cleaned_pattern.startswith(normalize_slashes(folder))
                for p in matcher.patterns
            )
            if matcher.matches(folder) and not reopened:
                return False
        return not matcher.matches(rel)


def check_script(workspace: Path, script: str | None) -> None:
    """Refuse in one line a command.script that the image of ``workspace`` would not hold:
    smoke --local and the image builds check it alike."""
    try:
        why = None if script is None else script_in_image(workspace, script)
    except OSError as exc:  # a folder on its way that we may not search
        why = f"cannot be looked up ({exc.strerror or exc}); fix the permissions on its way"
    if why is not None:
        raise UserError(f"command.script: {script} {why}")


def script_in_image(workspace: Path, script: str) -> str | None:
    """Why the image of ``workspace`` would not hold ``script`` (command.script, relative to
    it) as the file a local run starts, or None when it would. One rule for every target: a
    local run follows links on the host, but the image holds only what the scan keeps, and a
    link as its target text (never followed), so each link on the way must stay in the
    workspace by a relative target, and every path on the way be kept."""
    root = workspace.resolve()
    path = root / script
    if not path.is_file():
        return (
            f"is not a file in this workspace ({workspace}); give its path relative to this folder"
        )
    real = path.resolve()
    if not real.is_relative_to(root):
        return (
            f"is a link to a file outside this workspace ({plain(str(real))}), so the image "
            "would not contain it; copy the file into the workspace"
        )
    links = list(_links_on(root, script))
    for rel, target in links:
        if os.path.isabs(target):
            what = "is" if rel == os.path.normpath(script) else f"goes through {plain(rel)},"
            return (
                f"{what} a link by an absolute path ({plain(target)}), which the image's copy "
                "of the workspace cannot follow; make the link relative"
            )
    own = str(real.relative_to(root))
    for rel in [*(rel for rel, _ in links), own]:
        if kept_in_context(root, rel):
            continue
        if rel == os.path.normpath(script):
            what = "is"
        elif rel == own:
            what = f"is a link to {plain(rel)}, which is"
        else:
            what = f"goes through the link {plain(rel)}, which is"
        return (
            f"{what} excluded by .dockerignore, so the image would not contain it; take it "
            f"out of .dockerignore (or add a line !{plain(rel)})"
        )
    return None


def _links_on(root: Path, rel: str) -> Iterator[tuple[str, str]]:
    """Each link that resolving ``rel`` below ``root`` goes through, in order: (its path
    relative to ``root``, its target text); it stops at an absolute target."""
    todo, done = rel.split("/"), list[str]()  # done: real folders below root
    for _ in range(64):  # the kernel's own bound on links in a path is 40
        while todo and not os.path.islink(root.joinpath(*done, todo[0])):
            part = todo.pop(0)
            if part == "..":
                done = done[:-1]
            elif part not in ("", "."):
                done.append(part)
        if not todo:
            return
        here = "/".join([*done, todo.pop(0)])
        target = os.readlink(root / here)
        yield here, target
        if os.path.isabs(target):
            return
        todo = target.split("/") + todo


def scan_trainer(trainer_dir: Path) -> list[LocalFile]:
    """The trainer's files, without caches."""
    rels = (
        str(p.relative_to(trainer_dir))
        for p in trainer_dir.rglob("*")
        if "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    return _local_files(trainer_dir, rels)


def dockerfile(docker_dir: Path) -> str:
    """The Dockerfile ddpdeploy ships (docker/ of the source tree or the installed package)."""
    path = docker_dir / "Dockerfile"
    try:
        return fs.read_regular(path, limit=SMALL_FILE_MAX).decode("utf-8")
    except (OSError, UserError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise UserError(
            f"the Dockerfile ddpdeploy ships is missing at {path} ({why}); reinstall ddpdeploy"
        ) from None


def requirements(workspace: Path, kept: Iterable[LocalFile]) -> bytes:
    """The workspace's requirements.txt if the .dockerignore keeps it, else nothing."""
    if not any(f.rel == REQUIREMENTS for f in kept):
        return b""
    path = workspace / REQUIREMENTS
    # Its bytes go into the image (a layer pushed to a registry): a link may point within the
    # workspace (requirements/cpu.txt), never out of it (~/.netrc, another project's file).
    real = path.resolve()
    if not real.is_relative_to(workspace.resolve()):
        raise UserError(
            f"{path} is a link to {real}, outside the workspace, whose bytes would go into "
            "the image; copy the file into the workspace, or point the link at one inside it"
        )
    return _read_small(path)


class _WriteFailed(Exception):
    """Writing the context failed (a full disk), as opposed to reading a workspace file."""


class _HashingWriter:
    """A write-only file that hashes what passes through to ``raw``."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        try:
            return self.raw.write(data)
        except OSError as exc:
            raise _WriteFailed(str(exc)) from None

    def tell(self) -> int:
        return self.raw.tell()


def _add_file(tar: tarfile.TarFile, info: tarfile.TarInfo, source: Path) -> None:
    try:
        # A file swapped for a FIFO, a device or a link since the scan is refused, not read.
        fh = fs.open_regular(source, follow_symlinks=False)
    except fs.NotRegularFile as exc:
        raise UserError(f"{exc}; {_FIX}") from None
    except OSError as exc:
        raise UserError(f"cannot read {source} ({exc.strerror or exc}); {_FIX}") from None
    with fh:
        info.size = os.fstat(fh.fileno()).st_size
        try:
            tar.addfile(info, fh)  # copied in chunks: never whole in memory
        except OSError as exc:
            raise UserError(f"cannot read {source} ({exc.strerror or exc}); {_FIX}") from None


def write_context(entries: list[ContextEntry], fileobj: IO[bytes]) -> str:
    """The context tar, with normalised owners and mtimes so equal files make equal entries
    (the classic builder's COPY cache compares them); returns the tar's sha256."""
    out = _HashingWriter(fileobj)
    with tarfile.open(fileobj=out, mode="w") as tar:  # type: ignore[call-overload]
        # An empty workspace still needs its folder for the Dockerfile's COPY of it.
        folder = tarfile.TarInfo(CONTEXT_WORKSPACE)
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, FIXED_MTIME
        tar.addfile(folder)
        for entry in entries:
            info = tarfile.TarInfo(entry.arcname)
            info.mtime, info.mode = FIXED_MTIME, entry.mode
            if entry.link_target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link_target
                tar.addfile(info)
            elif entry.source is not None:
                _add_file(tar, info, Path(entry.source))
            else:
                body = entry.data or b""
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    fileobj.seek(0)
    return out.sha256.hexdigest()


@contextmanager
def context_file(entries: list[ContextEntry]) -> Iterator[tuple[IO[bytes], str]]:
    """The context tar, ready to send, and its sha256."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX) as fileobj:
        try:
            digest = write_context(entries, fileobj)
        except _WriteFailed as exc:
            raise OperationError(
                f"cannot write the build context to a temporary file ({exc}); free space "
                f"in {tempfile.gettempdir()} or point TMPDIR elsewhere"
            ) from None
        yield fileobj, digest
