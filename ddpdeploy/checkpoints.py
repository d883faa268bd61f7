"""Collecting a run's checkpoint: pick the newest intact one, copy it with its sha256 checked,
and land it in the target folder atomically. Nothing read from the folder is trusted.

Two formats. A ddpdeploy checkpoint at step N is `ckpt-step-<N:09d>.pt` plus its sidecar
`ckpt-step-<N:09d>.json` (step, sha256, host, rank, …); the trainer writes the sidecar last,
so a payload without one is not a checkpoint. A folder without sidecars (any other script's)
is collected as plain files, each read twice to see that it is complete, with a
`SHA256SUMS` beside them.

The rules that make a hostile folder harmless:
- the names read are derived from the step (or listed by the source), never taken from a
  file's contents; the sidecar's own fields are validated and must agree with its name;
- only regular files directly in the folder are opened, by a reader that refuses anything
  else at open time (a symlink swapped in after the listing included);
- a candidate that vanishes or fails its check is skipped with one line, and the next newest
  is tried; `--to` is left as it was when nothing could be collected;
- nothing in `--to` is replaced unless asked (identical files are kept as they are).

With ``debug`` (`collect --debug`) the diagnostics a run leaves in the same folder come too,
into `--to/debug/`: ddpkit's hang stacks (`hang-rank<R>.txt`), torch's NCCL flight recorder
dumps (`nccl_trace_rank_<R>`) and ddpkit's NCCL debug logs (`ddpkit-nccl.<host>.<pid>.log`);
only names of those exact shapes, only regular files, each read at most `MAX_DEBUG` bytes
(a longer text file is cut with a note, a longer dump refused), read twice to see it stays put.

Sources (a local folder, a pod, a staged compose volume) only list entries and open files;
everything else is here.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddpdeploy import fs
from ddpdeploy.errors import OperationError, UserError

CHUNK = 1 << 20
MAX_SIDECAR = 1 << 20  # the trainer's are ~300 bytes; anything this big is not one
SUMS = "SHA256SUMS"
# The trainer's names: step zero-padded to 9 digits; 18 digits keeps int() cheap.
_SIDECAR = re.compile(r"^ckpt-step-(\d{9,18})\.json$")
# Names a writer uses while a file is incomplete: never collected as plain files.
_TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", ".lock", "~")

# collect --debug: the diagnostics files a run leaves beside its checkpoints, by exact name
# shape (train/ddpkit.py writes the first and third, torch's flight recorder the second).
DEBUG_DIR = "debug"
MAX_DEBUG = 32 << 20  # a hang stack is a few KiB, a flight recorder dump a few MiB
HANG_STACK, FLIGHT_DUMP, NCCL_LOG = "hang stack", "flight recorder dump", "NCCL debug log"
DEBUG_KINDS = (
    (HANG_STACK, re.compile(r"hang-rank\d{1,9}\.txt")),
    (FLIGHT_DUMP, re.compile(r"nccl_trace_rank_\d{1,9}")),
    (NCCL_LOG, re.compile(r"ddpkit-nccl\.[A-Za-z0-9][A-Za-z0-9._-]{0,252}\.\d{1,10}\.log")),
)
DEBUG_PATTERNS = "hang-rank*.txt, nccl_trace_rank_*, ddpkit-nccl.*.log"
_CUT_KINDS = (HANG_STACK, NCCL_LOG)  # text: its head is still worth reading; a dump is not

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


def payload_name(step: int) -> str:
    return f"ckpt-step-{step:09d}.pt"


def sidecar_name(step: int) -> str:
    return f"ckpt-step-{step:09d}.json"


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


class Sidecar(BaseModel):
    """A checkpoint's sidecar as the trainer writes it; other fields are kept, not read."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    step: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    file: str | None = None
    world_size: int | None = Field(default=None, ge=1)
    rank: int | None = Field(default=None, ge=0)
    restart_count: int | None = Field(default=None, ge=0)
    host: str | None = Field(default=None, max_length=253)
    time: float | None = None


def steps_newest_first(names: Sequence[str]) -> list[int]:
    """Steps that have a sidecar, newest first (the payload is checked when copied)."""
    steps = [int(m[1]) for n in names if (m := _SIDECAR.match(n)) and n == sidecar_name(int(m[1]))]
    return sorted(set(steps), reverse=True)


@dataclass
class DebugFile:
    """One diagnostics file `collect --debug` brought home."""

    name: str
    kind: str  # HANG_STACK, FLIGHT_DUMP or NCCL_LOG
    size: int  # bytes written (a cut file: MAX_DEBUG plus the note)
    cut: bool = False
    first_line: str = ""  # as read (decoded, not yet made plain): the caller shows it


@dataclass
class Collected:
    """What `collect` copied: one checkpoint (step set), plain files, or (with ``debug``
    and no checkpoint) neither; ``debug`` the diagnostics files when asked for."""

    step: int | None
    files: list[str] = field(default_factory=list)
    where: str = ""
    debug: list[DebugFile] | None = None
    no_checkpoint: str = ""  # why there was none (debug only)

    def describe(self) -> str:
        """What was found and in which format, e.g. `3 plain files (with SHA256SUMS)`."""
        if self.step is not None:
            what = f"ddpdeploy checkpoint step {self.step}"
        elif not self.files:
            what = "no checkpoint"
        else:
            n = len(self.files)
            what = f"{n} plain file{'' if n == 1 else 's'} (with {SUMS})"
        return f"{what} from {self.where}" if self.where else what

    def debug_summary(self) -> str:
        """``3 hang stacks, 0 flight recorder dumps, 1 NCCL debug log``."""
        got = self.debug or []
        parts = []
        for kind, _ in DEBUG_KINDS:
            n = sum(f.kind == kind for f in got)
            parts.append(f"{n} {kind}{'' if n == 1 else 's'}")
        return ", ".join(parts)


class NoCheckpoint(OperationError):
    """The folder holds no checkpoint to collect (with ``debug``: not an error by itself)."""


def collect(
    source: Source,
    dest: Path,
    step: int | None = None,
    warn: Callable[[str], None] = lambda text: None,
    progress: Callable[[int], None] = lambda n: None,
    *,
    files: Sequence[str] = (),
    overwrite: bool = False,
    debug: bool = False,
) -> Collected:
    """Copy the newest intact checkpoint (or ``step``, or the plain ``files``) into ``dest``;
    with ``debug`` the diagnostics files too (only those when there is no checkpoint), into
    ``dest/debug``.

    A candidate that cannot be read, fails its checks or its sha256 is skipped with one
    line to ``warn`` (refused when ``step`` names it). On any failure ``dest`` is left as it
    was: files and folders this call created are removed.
    """
    out = Destination(dest, overwrite)
    out.check()
    regular, diagnostics = _listing(source, files, debug, warn)
    if files and step is not None:
        raise UserError("--step and --file: pick one (--step is for ddpdeploy checkpoints)")
    debug_out = Destination(dest / DEBUG_DIR, overwrite)
    try:
        out.lock()  # before anything in --to is looked at: a parallel collect there is refused
        try:
            got = _collect_any(source, regular, files, step, out, warn, progress)
        except NoCheckpoint as exc:
            if not debug:
                raise
            got = Collected(None, [], source.where, no_checkpoint=str(exc))
        if debug:
            got.debug = _collect_debug(source, diagnostics, debug_out, warn, progress)
            if got.no_checkpoint and not got.debug:
                raise NoCheckpoint(
                    f"nothing to collect in {source.where}: no checkpoint and no diagnostics "
                    f"files ({DEBUG_PATTERNS})"
                )
        return got
    except BaseException:
        debug_out.rollback()
        out.rollback()
        raise
    finally:
        debug_out.finish()
        out.finish()  # after any rollback: the next collect finds this one's end state


def _collect_any(
    source: Source,
    regular: list[str],
    files: Sequence[str],
    step: int | None,
    out: Destination,
    warn: Callable[[str], None],
    progress: Callable[[int], None],
) -> Collected:
    steps = steps_newest_first(regular)
    if files or not steps:
        if step is not None:
            raise UserError(
                f"--step: {source.where} holds no ddpdeploy checkpoint (no "
                "ckpt-step-N.json sidecar); leave --step out to collect its plain files"
            )
        return _collect_plain(source, regular, list(files), out, warn, progress)
    return _collect_checkpoint(source, steps, step, out, warn, progress)


def _listing(
    source: Source, files: Sequence[str], debug: bool, warn: Callable[[str], None]
) -> tuple[list[str], list[str]]:
    """(the regular files to collect, the diagnostics files among them with ``debug``); a
    link or special file is never opened, only named to ``warn``."""
    entries = source.entries()
    for name, kind in sorted(entries.items()):
        if kind in (SYMLINK, SPECIAL):
            warn(f"skipping {shown(name)} in {source.where}: a {kind}, not a regular file")
    regular = sorted(n for n, kind in entries.items() if kind == FILE)
    # A diagnostics file named with --file is that plain file; the rest go to debug/.
    diagnostics = [n for n in regular if debug_kind(n) and n not in files] if debug else []
    if diagnostics:  # theirs is debug/, not the plain files' SHA256SUMS
        regular = [n for n in regular if n not in diagnostics]
    return regular, diagnostics


def _collect_checkpoint(
    source: Source,
    steps: list[int],
    step: int | None,
    out: Destination,
    warn: Callable[[str], None],
    progress: Callable[[int], None],
) -> Collected:
    if step is not None:
        if step not in steps:
            have = ", ".join(map(str, steps)) or "none"
            raise UserError(
                f"--step: no checkpoint at step {step} in {source.where} (have: {have})"
            )
        steps = [step]
    for candidate in steps:
        problem = _try_checkpoint(source, candidate, out, progress)
        if problem is None:
            return Collected(
                candidate, [payload_name(candidate), sidecar_name(candidate)], source.where
            )
        more = "; trying the next newest" if candidate != steps[-1] else ""
        warn(f"checkpoint at step {candidate} in {source.where}: {problem}{more}")
    raise NoCheckpoint(f"no intact checkpoint in {source.where}")


def _try_checkpoint(
    source: Source, step: int, out: Destination, progress: Callable[[int], None]
) -> str | None:
    """Copy checkpoint ``step`` into ``out``; None when done, else why it was skipped."""
    payload = payload_name(step)
    try:
        raw = _read_small(source, sidecar_name(step))
    except Unreadable as exc:
        return f"sidecar {exc}"
    try:
        meta = Sidecar.model_validate_json(raw)
    except ValidationError as exc:
        return f"sidecar is not valid: {_first_error(exc)}"
    if meta.step != step:
        return f"sidecar says step {meta.step}, its name step {step}"
    if meta.file is not None and meta.file != payload:
        return f"sidecar names payload '{shown(meta.file)}', not {payload}"
    record = run_record(meta, payload)
    out.check_free(payload, meta.sha256)
    out.check_free(sidecar_name(step), hashlib.sha256(raw).hexdigest())
    if record is not None:
        out.check_free(RUN_RECORD, hashlib.sha256(record).hexdigest())
    try:
        out.write(payload, _verified_copy(source, payload, meta.sha256, progress))
    except Unreadable as exc:
        return f"payload {payload} {exc}"
    except _Mismatch as exc:
        return f"payload {payload} {exc} (corrupt or still being written)"
    out.write(sidecar_name(step), raw)
    if record is not None:
        out.write(RUN_RECORD, record)
    return None


RUN_RECORD = "RUN.json"


def run_record(meta: Sidecar, payload: str) -> bytes | None:
    """RUN.json for a collected checkpoint: the sidecar's ``run`` object (what ran: spec
    sha256, image and digest, commit, versions, world size, seed, command line; see
    docs/events.md) with the checkpoint it belongs to; None for a sidecar without one."""
    run = (meta.model_extra or {}).get("run")
    if not isinstance(run, dict):
        return None
    record = {**run, "checkpoint": payload, "step": meta.step, "checkpoint_sha256": meta.sha256}
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()


def _collect_plain(
    source: Source,
    regular: list[str],
    named: list[str],
    out: Destination,
    warn: Callable[[str], None],
    progress: Callable[[int], None],
) -> Collected:
    """Every regular file (or the ``named`` ones), each read twice, plus SHA256SUMS."""
    _check_named(source, regular, named)
    names = _collectable(source, regular, named, warn)
    first = _first_reads(source, names, bool(named), out, warn)
    copied = _copy_plain(source, first, bool(named), out, warn, progress)
    sums = "".join(f"{first[n][1]}  {n}\n" for n in copied).encode()
    out.check_free(SUMS, hashlib.sha256(sums).hexdigest())
    out.write(SUMS, sums)
    return Collected(None, copied, source.where)


def _check_named(source: Source, regular: list[str], named: list[str]) -> None:
    """Each --file must be a regular file directly in the folder."""
    for name in named:
        if not plain_name(name) or name not in regular:
            have = ", ".join(shown(n) for n in regular[:10]) or "none"
            raise UserError(
                f"--file: {shown(name)} is not a regular file in {source.where} (have: {have})"
            )


def _collectable(
    source: Source, regular: list[str], named: list[str], warn: Callable[[str], None]
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
        what = "is empty" if not regular else "holds no file to collect"
        raise NoCheckpoint(
            f"no checkpoint in {source.where}: the folder {what} (a ddpdeploy checkpoint "
            "is ckpt-step-N.pt + .json; any other script's files are collected as they are)"
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
            first[name] = _digest(source, name)
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
            out.write(name, _verified_copy(source, name, sha, progress, size))
        except (Unreadable, _Mismatch) as exc:
            text = f"{shown(name)} in {source.where}: {exc}"
            if isinstance(exc, _Mismatch):
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


def _not_collectable(name: str) -> str | None:
    if name.startswith(".") or name.endswith(_TEMP_SUFFIXES):
        return "a temp-file name (a writer may not be done with it)"
    if name == SUMS:
        return f"collect writes its own {SUMS}"
    if "\\" in name or not name.isprintable():
        return f"its name has a backslash or control character, which {SUMS} cannot list plainly"
    return None


def debug_kind(name: str) -> str | None:
    """HANG_STACK, FLIGHT_DUMP or NCCL_LOG for a diagnostics file's name, else None."""
    return next((kind for kind, shape in DEBUG_KINDS if shape.fullmatch(name)), None)


def _collect_debug(
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
        except (Unreadable, _Mismatch) as exc:
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
    chunks = _chunks(source, name, MAX_DEBUG + 1)
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
    """A writer's fill for a diagnostics file: _Mismatch unless it reads as it did."""

    def fill(out: BinaryIO) -> None:
        def sink(chunk: bytes) -> None:
            out.write(chunk)
            progress(len(chunk))

        size, sha, _ = _bounded_copy(source, found.name, found.kind, sink)
        if (size, sha) != (found.size, sha256):
            raise _Mismatch("changed between two reads (still being written?)")

    return fill


class _Mismatch(Exception):
    """A copy whose sha256 (or size) is not the one expected."""


def _chunks(source: Source, name: str, limit: int | None = None) -> Iterator[bytes]:
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


def _read_small(source: Source, name: str) -> bytes:
    data = b""
    for chunk in _chunks(source, name):
        data += chunk
        if len(data) > MAX_SIDECAR:
            raise Unreadable(f"is over {MAX_SIDECAR} bytes: not a sidecar")
    return data


def _digest(source: Source, name: str) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    for chunk in _chunks(source, name):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _verified_copy(
    source: Source,
    name: str,
    sha256: str,
    progress: Callable[[int], None],
    size: int | None = None,
) -> Callable[[BinaryIO], None]:
    """A writer's fill: copies ``name``, raising _Mismatch (the writer then drops its temp
    file) unless the bytes have ``sha256`` (and ``size``)."""

    def fill(out: BinaryIO) -> None:
        digest, got = hashlib.sha256(), 0
        for chunk in _chunks(source, name):
            digest.update(chunk)
            out.write(chunk)
            got += len(chunk)
            progress(len(chunk))
        if size is not None and got != size:
            raise _Mismatch(f"changed size ({size} then {got} bytes)")
        if digest.hexdigest() != sha256:
            raise _Mismatch("fails its sha256 check" if size is None else "changed content")

    return fill


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
        old = target.with_name(f".{target.name}.{secrets.token_hex(8)}{fs.TEMP_SUFFIX}")
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


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "contents"
    text = f"{where}: {err['msg']}"
    text = text if text.isprintable() else repr(text)[1:-1]
    return text if len(text) <= 160 else f"{text[:150]}…"


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
