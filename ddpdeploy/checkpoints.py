"""Collecting the trainer's rank-0 checkpoints: pick the newest complete one, copy it with
its sha256 checked, and land it in the target folder atomically.

A checkpoint at step N is `ckpt-step-<N:09d>.pt` plus its sidecar `ckpt-step-<N:09d>.json`
(step, host, rank, …, `sha256` and `file` of the payload); the trainer writes the sidecar
last, so a payload without one is not a checkpoint. Sources (a local folder today) only list
names and open files; everything else is here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

from ddpdeploy.adapters import files
from ddpdeploy.errors import OperationError, UserError

_SIDECAR = re.compile(r"^ckpt-step-(\d+)\.json$")
CHUNK = files.CHUNK
_SIDECAR_LIMIT = 1 << 16  # a sidecar is a dozen fields


class Source(Protocol):
    where: str

    def names(self) -> list[str]: ...

    def open(self, name: str) -> contextlib.AbstractContextManager[BinaryIO]: ...


class LocalSource:
    """A checkpoint folder on this machine (`smoke --local` writes .ddpdeploy/checkpoints/NAME)."""

    def __init__(self, folder: Path) -> None:
        if not folder.is_dir():
            raise UserError(f"--from local: no checkpoint folder at {folder}")
        self.folder = folder
        self.where = str(folder)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir() if p.is_file())

    def open(self, name: str) -> contextlib.AbstractContextManager[BinaryIO]:
        # Never through a symlink: a link swapped in for a payload is refused, not copied.
        return files.open_regular(self.folder / name, follow_symlinks=False)  # type: ignore[return-value]


def steps_newest_first(names: list[str]) -> list[int]:
    """Steps that have a sidecar, newest first (the payload is checked when copied)."""
    steps = [int(m[1]) for n in names if (m := _SIDECAR.match(n))]
    return sorted(set(steps), reverse=True)


def _copy_verified(
    source: Source, step: int, sha256: str, dest: Path, progress: Callable[[int], None]
) -> bool:
    """Copy the payload at ``step`` into ``dest`` if its sha256 matches; False when not (or
    when it cannot be read: vanished, a symlink, …). A write error in ``dest`` is raised."""
    name = payload_name(step)
    with files.Staged(dest / name, "--to") as out:
        try:
            with source.open(name) as src:

                def sink(chunk: bytes) -> None:
                    out.write(chunk)
                    progress(len(chunk))

                digest = files.sha256_stream(src, sink, CHUNK)
        except OSError:
            return False
        if digest != sha256:
            return False
        _land(out, lambda: files.sha256_file(out.path, follow_symlinks=False) != sha256)
    return True


def _land(out: files.Staged, differs: Callable[[], bool]) -> None:
    """Commit ``out`` without replacing anything in ``--to``: the same file already there
    is fine, any other is refused by name."""
    try:
        out.commit(replace=False)
    except FileExistsError:
        try:
            other = differs()
        except OSError:  # a symlink, a folder, unreadable: not our checkpoint
            other = True
        if other:
            raise _taken(out.path) from None


def _taken(path: Path) -> UserError:
    return UserError(
        f"--to: {path} already exists and is not this checkpoint; collect into an empty "
        "folder, or move it away"
    )


def _differs(path: Path, data: bytes) -> bool:
    try:
        return files.read_regular(path, limit=len(data), follow_symlinks=False) != data
    except FileNotFoundError:
        return False
    except UserError:  # not a regular file, or larger than ours
        return True


def payload_name(step: int) -> str:
    """Names come from the step, never from a file's contents (a sidecar's ``file``)."""
    return f"ckpt-step-{step:09d}.pt"


def _sidecar(source: Source, step: int) -> dict | None:
    try:
        with source.open(f"ckpt-step-{step:09d}.json") as fh:
            text = files.read_at_most(fh, _SIDECAR_LIMIT)
        if len(text) > _SIDECAR_LIMIT:
            return None
        meta = json.loads(text)
    except (OSError, ValueError, RecursionError):  # RecursionError: nested 50,000 deep
        return None
    ok = isinstance(meta, dict) and isinstance(meta.get("sha256"), str) and meta.get("file")
    return meta if ok else None


def collect(
    source: Source,
    dest: Path,
    step: int | None,
    warn: Callable[[str], None],
    progress: Callable[[int], None] = lambda n: None,
) -> int:
    """Copy the newest complete checkpoint (or ``step``) into ``dest``; return its step.

    A checkpoint whose sidecar is unreadable or whose payload fails its sha256 (or cannot
    be read) is skipped with a warning (or refused, when ``step`` names it). Payload first,
    then the sidecar, each landed whole: ``dest`` never holds half a checkpoint, and
    nothing already in ``dest`` is replaced (the same checkpoint again is fine).
    """
    steps = steps_newest_first(source.names())
    if step is not None:
        if step not in steps:
            have = ", ".join(map(str, steps)) or "none"
            raise UserError(
                f"--step: no checkpoint at step {step} in {source.where} (have: {have})"
            )
        steps = [step]
    if not steps:
        raise OperationError(f"no checkpoint in {source.where}")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise files.write_error(dest, exc, "--to") from None
    for candidate in steps:
        meta = _sidecar(source, candidate)
        if meta is not None:
            meta["file"] = payload_name(candidate)
            sidecar = json.dumps(meta).encode()
            sidecar_path = dest / f"ckpt-step-{candidate:09d}.json"
            if _differs(sidecar_path, sidecar):  # refused before a byte is copied
                raise _taken(sidecar_path)
        if meta is None or not _copy_verified(source, candidate, meta["sha256"], dest, progress):
            warn(f"checkpoint at step {candidate} in {source.where} is incomplete or corrupt")
            continue
        with files.Staged(sidecar_path, "--to") as out:
            out.write(sidecar)
            _land(out, functools.partial(_differs, sidecar_path, sidecar))
        return candidate
    raise OperationError(f"no intact checkpoint in {source.where}")
