"""Collecting a run's checkpoint: the entry point (`collect`), and choosing and verifying a
ddpdeploy checkpoint. Nothing read from the folder is trusted.

Two formats. A ddpdeploy checkpoint at step N is its sidecar `ckpt-step-<N:09d>.json`
(step, sha256, file, host, rank, …) and the payload it names: `ckpt-step-<N:09d>.pt`, or
`ckpt-step-<N:09d>.<16 hex>.pt` for a step saved again. The sidecar's rename commits it, so
a payload no sidecar names is not a checkpoint. A folder without sidecars (any other script's)
is collected as plain files (collect.plain). With ``debug`` the run's diagnostics come too
(collect.debug). What lands in `--to` goes through collect.destination.

The rules that make a hostile folder harmless:
- the names read are derived from the step (or listed by the source); the one taken from a
  file's contents, the sidecar's `file`, must be a payload name of that step; the sidecar's
  own fields are validated and must agree with its name;
- only regular files directly in the folder are opened (collect.source);
- a candidate that vanishes or fails its check is skipped with one line, and the next newest
  is tried; `--to` is left as it was when nothing could be collected;
- nothing in `--to` is replaced unless asked (identical files are kept as they are).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddpdeploy.collect.debug import (
    DEBUG_DIR,
    DEBUG_KINDS,
    DEBUG_PATTERNS,
    DebugFile,
    check_debug_folder,
    collect_debug,
    debug_kind,
)
from ddpdeploy.collect.destination import Destination
from ddpdeploy.collect.plain import SUMS, collect_plain
from ddpdeploy.collect.source import (
    FILE,
    FOLDER,
    SPECIAL,
    SYMLINK,
    Mismatch,
    NoCheckpoint,
    Source,
    Unreadable,
    read_chunks,
    shown,
    verified_copy,
)
from ddpdeploy.errors import UserError
from ddpdeploy.report import Progress, Quiet, Report

MAX_SIDECAR = 1 << 20  # the trainer's are ~300 bytes; anything this big is not one


# The trainer's names: step zero-padded to 9 digits; 18 digits keeps int() cheap.
# \Z, not $: `$` also matches before a final newline ("ckpt-step-000000005.pt\n").
_SIDECAR = re.compile(r"^ckpt-step-(\d{9,18})\.json\Z", re.ASCII)
_PAYLOAD = re.compile(r"^ckpt-step-(\d{9,18})(?:\.[0-9a-f]{16})?\.pt\Z", re.ASCII)


def payload_name(step: int) -> str:
    """The payload's usual name; the sidecar's ``file`` says which one is committed."""
    return f"ckpt-step-{step:09d}.pt"


def is_payload_of(name: str, step: int) -> bool:
    """Whether ``name`` is a payload name of ``step`` (the usual one, or one with 16 hex)."""
    m = _PAYLOAD.match(name)
    return m is not None and m[1] == f"{step:09d}"


def sidecar_name(step: int) -> str:
    return f"ckpt-step-{step:09d}.json"


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


def collect(
    source: Source,
    dest: Path,
    step: int | None = None,
    report: Report | None = None,
    *,
    files: Sequence[str] = (),
    overwrite: bool = False,
    debug: bool = False,
) -> Collected:
    """Copy the newest intact checkpoint (or ``step``, or the plain ``files``) into ``dest``;
    with ``debug`` the diagnostics files too (only those when there is no checkpoint), into
    ``dest/debug``.

    A candidate that cannot be read, fails its checks or its sha256 is skipped with one
    line to ``report.warn`` (refused when ``step`` names it). On any failure ``dest`` is left as it
    was: files and folders this call created are removed.
    """
    report = report or Quiet()
    with report.progress("copying", unit="bytes") as bar:
        return _collect_into(
            source, dest, step, report.warn, _counter(bar), files, overwrite, debug
        )


def _counter(bar: Progress) -> Callable[[int], None]:
    """The bytes copied so far, as they come."""
    done = 0

    def progress(n: int) -> None:
        nonlocal done
        done += n
        bar.update(completed=done)

    return progress


def _collect_into(
    source: Source,
    dest: Path,
    step: int | None,
    warn: Callable[[str], None],
    progress: Callable[[int], None],
    files: Sequence[str],
    overwrite: bool,
    debug: bool,
) -> Collected:
    out = Destination(dest, overwrite)
    out.check()
    if debug:
        check_debug_folder(dest)
    regular, diagnostics, folders = _listing(source, files, debug, warn)
    if files and step is not None:
        raise UserError("--step and --file: pick one (--step is for ddpdeploy checkpoints)")
    debug_out = Destination(dest / DEBUG_DIR, overwrite)
    try:
        out.lock()  # before anything in --to is looked at: a parallel collect there is refused
        try:
            got = _collect_any(source, regular, folders, files, step, out, warn, progress)
        except NoCheckpoint as exc:
            if not debug:
                raise
            got = Collected(None, [], source.where, no_checkpoint=str(exc))
        if debug:
            got.debug = collect_debug(source, diagnostics, debug_out, warn, progress)
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
    folders: list[str],
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
                f"--step: {source.where} holds no ddpdeploy checkpoint (no sidecar such as "
                "ckpt-step-000000005.json); leave --step out to collect its plain files"
            )
        copied = collect_plain(source, regular, list(files), out, warn, progress, folders)
        return Collected(None, copied, source.where)
    return _collect_checkpoint(source, steps, step, out, warn, progress)


def _listing(
    source: Source, files: Sequence[str], debug: bool, warn: Callable[[str], None]
) -> tuple[list[str], list[str], list[str]]:
    """(the regular files to collect, the diagnostics files among them with ``debug``, the
    folders); a link or special file is never opened, only named to ``warn``."""
    entries = source.entries()
    regular = sorted(n for n, kind in entries.items() if kind == FILE)
    # A payload of a committed step is the checkpoint's to judge, in its own line.
    steps = set() if files else set(steps_newest_first(regular))
    payloads = {n for n in entries if (m := _PAYLOAD.match(n)) and int(m[1]) in steps}
    for name, kind in sorted(entries.items()):
        if kind in (SYMLINK, SPECIAL) and name not in payloads:
            warn(f"skipping {shown(name)} in {source.where}: a {kind}, not a regular file")
    # A diagnostics file named with --file is that plain file; the rest go to debug/.
    diagnostics = [n for n in regular if debug_kind(n) and n not in files] if debug else []
    if diagnostics:  # theirs is debug/, not the plain files' SHA256SUMS
        regular = [n for n in regular if n not in diagnostics]
    folders = sorted(n for n, kind in entries.items() if kind == FOLDER)
    return regular, diagnostics, folders


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
    failed: set[int] = set()
    relists = 0
    queue = list(steps)
    while queue:
        candidate = queue.pop(0)
        problem, payload = _try_checkpoint(source, candidate, out, progress)
        if problem is None:
            return Collected(candidate, [payload, sidecar_name(candidate)], source.where)
        failed.add(candidate)
        listed = _listed_steps(source) if step is None and relists < RELISTS else [candidate]
        if candidate not in listed:
            # Its sidecar is gone: a newer save's retention deleted the step while this
            # collect read it (a run saving with keep=1). The old listing holds only older
            # steps, also deleted by now; the folder's listing now holds the one that
            # replaced it.
            relists += 1
            queue = [s for s in listed if s not in failed]
            more = "; listing the folder again" if queue else ""
        else:
            more = "; trying the next newest" if queue else ""
        warn(f"checkpoint at step {candidate} in {source.where}: {problem}{more}")
    raise NoCheckpoint(f"no intact checkpoint in {source.where}")


# How often one collect lists the folder again after a candidate vanished: each time a save
# landed during the copy; a run saving faster than the copy is read is never caught up with.
RELISTS = 5


def _listed_steps(source: Source) -> list[int]:
    entries = source.entries()
    return steps_newest_first([n for n, kind in entries.items() if kind == FILE])


def _try_checkpoint(
    source: Source, step: int, out: Destination, progress: Callable[[int], None]
) -> tuple[str | None, str]:
    """Copy checkpoint ``step`` into ``out``, the payload under the name its sidecar gives:
    (None, that name) when done, else (why it was skipped, the name). A payload that
    vanished or changed while its sidecar was replaced (a re-save of the step commits a
    new pair and deletes the old payload) is read again through the new sidecar."""
    try:
        raw = _read_small(source, sidecar_name(step))
    except Unreadable as exc:
        return f"sidecar {exc}", payload_name(step)
    problem, payload, copying = _try_sidecar(source, step, raw, out, progress)
    if problem is not None and copying:
        try:
            again = _read_small(source, sidecar_name(step))
        except Unreadable:
            again = raw
        if again != raw:
            problem, payload, _ = _try_sidecar(source, step, again, out, progress)
    return problem, payload


def _try_sidecar(
    source: Source, step: int, raw: bytes, out: Destination, progress: Callable[[int], None]
) -> tuple[str | None, str, bool]:
    """``_try_checkpoint`` with the sidecar read: (why not or None, the payload's name,
    whether it came as far as copying the payload)."""
    payload = payload_name(step)
    try:
        meta = Sidecar.model_validate_json(raw)
    except ValidationError as exc:
        return f"sidecar is not valid: {_first_error(exc)}", payload, False
    if meta.step != step:
        return f"sidecar says step {meta.step}, its name step {step}", payload, False
    if "file" in meta.model_fields_set:  # absent: a sidecar from before `file` was written
        if meta.file is None or not is_payload_of(meta.file, step):
            named = "null" if meta.file is None else f"'{shown(meta.file)}'"
            return (
                (
                    f"sidecar names payload {named}, which is no payload name of step {step} "
                    f"({payload}, or with 16 hex digits before .pt)"
                ),
                payload,
                False,
            )
        payload = meta.file
    return _copy_checkpoint(source, step, payload, meta, raw, out, progress), payload, True


def _copy_checkpoint(
    source: Source,
    step: int,
    payload: str,
    meta: Sidecar,
    raw: bytes,
    out: Destination,
    progress: Callable[[int], None],
) -> str | None:
    """Copy the payload and its sidecar into ``out``; None when done, else why not."""
    record = run_record(meta, payload)
    out.check_free(payload, meta.sha256)
    out.check_free(sidecar_name(step), hashlib.sha256(raw).hexdigest())
    if record is not None:
        out.check_free(RUN_RECORD, hashlib.sha256(record).hexdigest())
    try:
        out.write(payload, verified_copy(source, payload, meta.sha256, progress))
    except Unreadable as exc:
        return f"payload {shown(payload)} {exc}"
    except Mismatch as exc:
        return f"payload {shown(payload)} {exc} (corrupt or still being written)"
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


def _read_small(source: Source, name: str) -> bytes:
    data = b""
    for chunk in read_chunks(source, name):
        data += chunk
        if len(data) > MAX_SIDECAR:
            raise Unreadable(f"is over {MAX_SIDECAR} bytes: not a sidecar")
    return data


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "contents"
    text = f"{where}: {err['msg']}"
    text = text if text.isprintable() else repr(text)[1:-1]
    return text if len(text) <= 160 else f"{text[:150]}…"
