"""A folder without ddpdeploy checkpoints (any other script's files), collected as plain
files: each regular file read twice to see it is complete, with a `SHA256SUMS` beside them;
names a writer uses while a file is incomplete are left out."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence

from ddpdeploy.collect.destination import Destination
from ddpdeploy.collect.source import (
    Mismatch,
    NoCheckpoint,
    Source,
    Unreadable,
    plain_name,
    read_digest,
    shown,
    verified_copy,
)
from ddpdeploy.errors import OperationError, UserError

SUMS = "SHA256SUMS"


# Names a writer uses while a file is incomplete: never collected as plain files.
_TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", ".lock", "~")


def collect_plain(
    source: Source,
    regular: list[str],
    named: list[str],
    out: Destination,
    warn: Callable[[str], None],
    progress: Callable[[int], None],
    folders: Sequence[str] = (),
) -> list[str]:
    """Every regular file (or the ``named`` ones), each read twice, plus SHA256SUMS; the
    ``folders`` in it are not copied, and said so."""
    _check_named(source, regular, named)
    if not named:
        for folder in folders:
            where = f"{shown(folder)}/ in {source.where}"
            warn(f"skipping {where}: a folder (collect copies the files directly in the folder)")
    names = _collectable(source, regular, named, warn, folders)
    first = _first_reads(source, names, bool(named), out, warn)
    copied = _copy_plain(source, first, bool(named), out, warn, progress)
    sums = "".join(f"{first[n][1]}  {n}\n" for n in copied).encode()
    out.check_free(SUMS, hashlib.sha256(sums).hexdigest())
    out.write(SUMS, sums)
    return copied


def _check_named(source: Source, regular: list[str], named: list[str]) -> None:
    """Each --file must be a regular file directly in the folder."""
    for name in named:
        if not plain_name(name) or name not in regular:
            have = ", ".join(shown(n) for n in regular[:10]) or "none"
            raise UserError(
                f"--file: {shown(name)} is not a regular file in {source.where} (have: {have})"
            )


def _collectable(
    source: Source,
    regular: list[str],
    named: list[str],
    warn: Callable[[str], None],
    folders: Sequence[str] = (),
) -> list[str]:
    """The names to copy: a name collect must not take is refused when named, else skipped."""
    names = []
    for name in named or regular:
        why = _not_collectable(name)
        if why and not named:
            warn(f"skipping {shown(name)} in {source.where}: {why}")
        elif why:
            raise UserError(f"--file: {shown(name)}: {why}")
        else:
            names.append(name)
    if not names:
        listed = ", ".join(f"{shown(f)}/" for f in folders[:5]) + (
            ", …" if len(folders) > 5 else ""
        )
        what = "holds no file to collect"
        if not regular:
            what = f"holds only folders ({listed})" if folders else "is empty"
        raise NoCheckpoint(
            f"no checkpoint in {source.where}: the folder {what} (a ddpdeploy checkpoint is "
            "ckpt-step-000000005.pt and its .json; any other script's files are collected as "
            "they are)"
        )
    return names


def _first_reads(
    source: Source, names: list[str], named: bool, out: Destination, warn: Callable[[str], None]
) -> dict[str, tuple[int, str]]:
    """The first read of each file: name -> (size, sha256), its place in `--to` checked
    free before anything is written."""
    first: dict[str, tuple[int, str]] = {}
    for name in names:
        try:
            first[name] = read_digest(source, name)
        except Unreadable as exc:
            _skip(f"{shown(name)} in {source.where}: {exc}", named, warn)
            continue
        out.check_free(name, first[name][1])
    return first


def _copy_plain(
    source: Source,
    first: dict[str, tuple[int, str]],
    named: bool,
    out: Destination,
    warn: Callable[[str], None],
    progress: Callable[[int], None],
) -> list[str]:
    """The second read, written into `--to` only when it matches the first."""
    copied: list[str] = []
    for name, (size, sha) in first.items():
        try:
            out.write(name, verified_copy(source, name, sha, progress, size))
        except (Unreadable, Mismatch) as exc:
            text = f"{shown(name)} in {source.where}: {exc}"
            if isinstance(exc, Mismatch):
                text += " between two reads (still being written?)"
            _skip(text, named, warn)
            continue
        copied.append(name)
    if not copied:
        raise NoCheckpoint(f"no complete file in {source.where}")
    return copied


def _skip(text: str, named: bool, warn: Callable[[str], None]) -> None:
    """A plain file that cannot be copied: refused when --file named it, else one line."""
    if named:
        raise OperationError(f"--file: {text}") from None
    warn(f"skipping {text}")


# ddpkit's lock on the folder (train/ddpkit.py's LOCK_NAME) and its retention's marker of a
# step being deleted (train/ddpkit.py's _DELETING): no data of the run.
_DDPKIT_LOCK = ".ddpkit.lock"
_DDPKIT_DELETING = re.compile(r"^\.ddpkit-deleting-ckpt-step-\d{9,18}\.json\Z", re.ASCII)


def _not_collectable(name: str) -> str | None:
    if name == _DDPKIT_LOCK:
        return "ddpkit's lock file of the folder, not data of the run"
    if _DDPKIT_DELETING.match(name):
        return "ddpkit's marker of a checkpoint its retention is deleting, not data of the run"
    if name.startswith(".") or name.endswith(_TEMP_SUFFIXES):
        return "a temp-file name (a writer may not be done with it)"
    if name == SUMS:
        return f"collect writes its own {SUMS}"
    if "\\" in name or not name.isprintable():
        return f"its name has a backslash or control character, which {SUMS} cannot list plainly"
    return None
