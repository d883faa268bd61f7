"""The file system for `render --out-dir`: update a GitOps folder in place, file by file.

The folder itself is never renamed, replaced or chmod-ed, so it never goes missing and keeps
its permissions, its `.git` and whatever else the user keeps there. What to write, remove
or refuse is decided by `ddpdeploy.render.output.plan_folder`; this module only reads the
folder's state and carries the plan out:

1. every new file (and both versions of the record) is written to a temp file in the folder
   and fsync-ed; a failure here (no space, read-only, no permission) leaves nothing behind;
2. the record is replaced by one that accepts old and new hashes, the files are renamed
   over the old ones (atomic each), the stale ones removed, and the final record renamed in;
   a crash at any point leaves each file matching a hash in the record, so the next render
   proceeds instead of calling its own leftovers "changed by hand".
"""

from __future__ import annotations

import contextlib
import stat
from pathlib import Path

from ddpdeploy import fs
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.render.output import NOT_A_FILE, RECORD, FolderPlan, parse_record, plan_folder

_RECORD_LIMIT = 1 << 20  # a record names a handful of files


def write_folder(out_dir: str, files: dict[str, str]) -> None:
    """Make ``out_dir`` hold ``files`` (plus the record); one line and nothing written on
    failure: exit 2 when the folder's content is the problem, 1 when the system refuses."""
    if not out_dir:
        raise UserError("--out-dir: empty; name a folder (e.g. --out-dir deploy)")
    folder = Path(out_dir)
    created = _ensure_folder(folder, out_dir)
    lock = None
    try:
        # Before the record is read: a second render meanwhile would leave a mix of both.
        lock = fs.FolderLock(folder, "--out-dir")
        recorded = _read_record(folder, out_dir)
        plan = plan_folder(out_dir, files, recorded, _disk_hashes(folder, [*files, *recorded]))
        _apply(folder, plan)
    except fs.FolderBusy:
        raise UserError(
            f"--out-dir: another render is writing {out_dir}; wait for it to end, or render "
            "into another folder"
        ) from None
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only succeeds while still empty
        raise
    finally:
        if lock is not None:
            lock.release()


def _ensure_folder(folder: Path, shown: str) -> bool:
    """True when this call created the folder."""
    try:
        if folder.is_dir():
            return False
        if folder.exists() or folder.is_symlink():
            raise UserError(f"--out-dir: {shown} exists and is not a folder")
        if not folder.absolute().parent.is_dir():
            raise UserError(f"--out-dir: {_missing_parent(folder.parent, shown)}")
        folder.mkdir()
        return True
    except OSError as exc:
        raise _system(shown, exc) from None


def _missing_parent(parent: Path, shown: str) -> str:
    """Why ``shown`` cannot be made in ``parent`` (as typed): the nearest thing above it that
    is there may be a file, not a folder (then "does not exist" would send the user looking
    for it)."""
    for above in (parent, *parent.parents):
        try:
            mode = above.stat().st_mode
        except OSError:
            continue  # missing, or below a file: look further up
        if not stat.S_ISDIR(mode):
            what = "a file" if stat.S_ISREG(mode) else fs.kind_of(mode)
            return f"{above} is {what}, not a folder, so {shown} cannot be made in it"
        break
    return f"the parent folder of {shown} does not exist"


def _read_record(folder: Path, shown: str) -> dict[str, set[str]]:
    try:
        with fs.open_regular(folder / RECORD, follow_symlinks=False) as fh:
            text = fs.read_at_most(fh, _RECORD_LIMIT)
    except FileNotFoundError:
        return {}
    except fs.NotRegularFile:
        raise UserError(
            f"--out-dir: {shown}/{RECORD} is not a regular file; ddpdeploy keeps the list of "
            "files it wrote there: move it away, then render again"
        ) from None
    except OSError as exc:
        raise _system(f"{shown}/{RECORD}", exc) from None
    try:
        if len(text) > _RECORD_LIMIT:
            raise ValueError("too long")
        return parse_record(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(
            f"--out-dir: {shown}/{RECORD} is not the list of files ddpdeploy wrote ({exc}); "
            "restore it (e.g. from git) or delete it, then render again"
        ) from None


def _disk_hashes(folder: Path, names: list[str]) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for name in dict.fromkeys(names):
        try:
            hashes[name] = fs.sha256_file(folder / name, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except fs.NotRegularFile:
            hashes[name] = NOT_A_FILE
        except OSError as exc:
            raise _system(str(folder / name), exc) from None
    return hashes


def _apply(folder: Path, plan: FolderPlan) -> None:
    with contextlib.ExitStack() as stack:  # leaving it removes what a failure left staged
        staged = []
        for name, data in [
            *((n, t.encode()) for n, t in plan.write.items()),
            (RECORD, plan.interim.encode()),
            (RECORD, plan.final.encode()),
        ]:
            out = stack.enter_context(fs.Staged(folder / name, "--out-dir"))
            out.write(data)
            out.sync()  # all on disk before the first rename: a full disk changes nothing
            staged.append(out)
        *written, interim, final = staged
        interim.commit()
        for out in written:
            out.commit()
        try:
            for name in plan.remove:
                (folder / name).unlink(missing_ok=True)
        except OSError as exc:
            raise _system(str(folder), exc) from None
        final.commit()


def _system(shown: str, exc: OSError) -> OperationError:
    return OperationError(f"--out-dir: cannot write {shown}: {exc.strerror or exc}")
