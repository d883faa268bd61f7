"""collect --debug: the diagnostics a run leaves beside its checkpoints, into `--to/debug/`:
ddpkit's hang stacks (`hang-rank<R>.txt`), torch's NCCL flight recorder dumps
(`nccl_trace_rank_<R>`) and ddpkit's NCCL debug logs (`ddpkit-nccl.<host>.<pid>.log`); only
names of those exact shapes, only regular files, each read at most `MAX_DEBUG` bytes (a longer
text file is cut with a note, a longer dump refused), read twice to see it stays put."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ddpdeploy.collect.destination import Destination
from ddpdeploy.collect.source import Mismatch, Source, Unreadable, read_chunks, shown
from ddpdeploy.errors import UserError

# collect --debug: the diagnostics files a run leaves beside its checkpoints, by exact name
# shape (train/ddpkit.py writes the first and third, torch's flight recorder the second).
DEBUG_DIR = "debug"
MAX_DEBUG = 32 << 20  # a hang stack is a few KiB, a flight recorder dump a few MiB
HANG_STACK, FLIGHT_DUMP, NCCL_LOG = "hang stack", "flight recorder dump", "NCCL debug log"
DEBUG_KINDS = (
    (HANG_STACK, re.compile(r"hang-rank\d{1,9}\.txt", re.ASCII)),
    (FLIGHT_DUMP, re.compile(r"nccl_trace_rank_\d{1,9}", re.ASCII)),
    (
        NCCL_LOG,
        re.compile(r"ddpkit-nccl\.[A-Za-z0-9][A-Za-z0-9._-]{0,252}\.\d{1,10}\.log", re.ASCII),
    ),
)


DEBUG_PATTERNS = "hang-rank*.txt, nccl_trace_rank_*, ddpkit-nccl.*.log"
_CUT_KINDS = (HANG_STACK, NCCL_LOG)  # text: its head is still worth reading; a dump is not


@dataclass
class DebugFile:
    """One diagnostics file `collect --debug` brought home."""

    name: str
    kind: str  # HANG_STACK, FLIGHT_DUMP or NCCL_LOG
    size: int  # bytes written (a cut file: MAX_DEBUG plus the note)
    cut: bool = False
    first_line: str = ""  # as read (decoded, not yet made plain): the caller shows it


def check_debug_folder(dest: Path) -> None:
    """`--to`'s `debug` must be a folder or not exist (made then): anything else of that
    name is refused before anything is read (a file there failed only at the first write)."""
    path = dest / DEBUG_DIR
    if os.path.islink(path) or (os.path.lexists(path) and not path.is_dir()):
        what = "a link" if os.path.islink(path) else "a file, not a folder"
        raise UserError(
            f"--to: {path} is {what}; collect --debug writes the diagnostics files into a "
            f"folder of that name: move it away, or collect into another folder"
        )


def debug_kind(name: str) -> str | None:
    """HANG_STACK, FLIGHT_DUMP or NCCL_LOG for a diagnostics file's name, else None."""
    return next((kind for kind, shape in DEBUG_KINDS if shape.fullmatch(name)), None)


def collect_debug(
    source: Source,
    names: list[str],
    out: Destination,
    warn: Callable[[str], None],
    progress: Callable[[int], None],
) -> list[DebugFile]:
    """The diagnostics files into ``out``: each read once to check it and ``out`` (nothing
    is written before every name is free), then copied, the copy matching the first read."""
    checked: dict[str, tuple[DebugFile, str]] = {}
    for name in names:
        kind = debug_kind(name)
        assert kind is not None  # the caller picked these names by their shape
        head = bytearray()  # the first line is shown: keep the start only

        def keep(chunk: bytes, head: bytearray = head) -> None:
            head.extend(chunk[: max(0, 4096 - len(head))])

        try:
            size, sha, cut = _bounded_copy(source, name, kind, keep)
        except Unreadable as exc:
            warn(f"skipping {shown(name)} in {source.where}: {exc}")
            continue
        if cut:
            mib = MAX_DEBUG >> 20
            warn(f"{shown(name)} in {source.where} is over {mib} MiB: cut there, with a note")
        first = bytes(head).split(b"\n", 1)[0]
        found = DebugFile(name, kind, size, cut, first.decode(errors="replace"))
        out.check_free(name, sha)
        checked[name] = (found, sha)
    copied: list[DebugFile] = []
    for name, (found, sha) in checked.items():
        try:
            out.write(name, _debug_fill(source, found, sha, progress))
        except (Unreadable, Mismatch) as exc:
            warn(f"skipping {shown(name)} in {source.where}: {exc}")
            continue
        copied.append(found)
    return copied


def _bounded_copy(
    source: Source, name: str, kind: str, sink: Callable[[bytes], object]
) -> tuple[int, str, bool]:
    """At most MAX_DEBUG bytes of ``name`` into ``sink``, plus a note where the file goes on
    (a dump that does is Unreadable): (bytes given, their sha256, whether cut)."""
    digest, got, cut = hashlib.sha256(), 0, False
    chunks = read_chunks(source, name, MAX_DEBUG + 1)
    try:
        for chunk in chunks:
            if len(chunk) > MAX_DEBUG - got:
                chunk, cut = chunk[: MAX_DEBUG - got], True
            digest.update(chunk)
            sink(chunk)
            got += len(chunk)
            if cut:
                break
    finally:
        chunks.close()  # closes the source's file: the rest is never read
    if cut:
        if kind not in _CUT_KINDS:
            raise Unreadable(f"is over {MAX_DEBUG >> 20} MiB: refused (a cut {kind} is unreadable)")
        note = f"\n# ddpdeploy collect: cut here at {MAX_DEBUG} bytes; the file was longer\n"
        digest.update(note.encode())
        sink(note.encode())
        got += len(note)
    return got, digest.hexdigest(), cut


def _debug_fill(
    source: Source, found: DebugFile, sha256: str, progress: Callable[[int], None]
) -> Callable[[BinaryIO], None]:
    """A writer's fill for a diagnostics file: Mismatch unless it reads as it did."""

    def fill(out: BinaryIO) -> None:
        def sink(chunk: bytes) -> None:
            out.write(chunk)
            progress(len(chunk))

        size, sha, _ = _bounded_copy(source, found.name, found.kind, sink)
        if (size, sha) != (found.size, sha256):
            raise Mismatch("changed between two reads (still being written?)")

    return fill
