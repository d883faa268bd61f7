"""What a local run wrote in the workspace: files the pod's read-only root would refuse,
and files a later run must not start from.

`smoke --local` cannot make this host's file system read-only, so it compares a listing of
the workspace (path -> mtime and size, taken by the local backend) before and after a run
and names the files that are new or changed. A pod starts from its image, so a run must not
find what an earlier run wrote (a tutorial's `snapshot.pt` in the working folder would be
resumed from): the files a run created, while unchanged, are set aside before the next run.
Only created ones: a file that was there before the run may have changed beside it (the
user's editor, a shell's `2> log` being written), and is never moved. Pure: listings in,
names and lines out; the local backend moves the files.
"""

from __future__ import annotations

from collections.abc import Mapping

# Not the job's doing, or not in the pod's image: our own run folder (the local checkpoint
# folder is in it), Python's bytecode caches, and the repository's metadata.
IGNORED = frozenset({".ddpdeploy", "__pycache__", ".git"})

Listing = Mapping[str, tuple[int, int]]  # relative path -> (mtime in ns, size)

# Under the workspace: what the last runs wrote (path -> stamp, JSON), and where those files
# go when a new run starts (a folder of their own below it, named by the time).
RECORD = ".ddpdeploy/smoke/written.json"
ASIDE = ".ddpdeploy/smoke/previous"


def written(before: Listing, after: Listing) -> list[str]:
    """Files that are new in ``after`` or whose mtime or size changed, sorted."""
    return sorted(p for p, stamp in after.items() if before.get(p) != stamp)


def created(before: Listing, after: Listing, known: Listing) -> list[str]:
    """Files a run made its own: new in ``after``, or changed ones ``known`` already held
    (an earlier run's, rewritten by a --resume run), sorted."""
    return sorted(
        p for p, stamp in after.items() if p not in before or (p in known and before[p] != stamp)
    )


def warning(files: list[str], volume: bool = True) -> str | None:
    """The one line `smoke --local` prints for ``files`` (None when there are none): what
    the write does in a pod, and where to save instead (``volume``: the job has a
    checkpoint volume; without one $DDPDEPLOY_CHECKPOINT_DIR is unset)."""
    if not files:
        return None
    more = f" and {len(files) - 1} more" if len(files) > 1 else ""
    where = "save it under $DDPDEPLOY_CHECKPOINT_DIR (ddpkit.checkpoint_dir())"
    fix = where if volume else f"add `checkpoint: {{size: 10Gi}}` to the spec and {where}"
    return (
        f"warning: the run wrote {files[0]}{more} in the workspace; on the cluster that "
        "write fails (the pod's root file system is read-only, and a file there would be "
        f"lost with the pod anyway): {fix}; scratch files go to /tmp"
    )


def unchanged(recorded: Listing, now: Listing) -> list[str]:
    """Recorded files still there as they were written (a file the user changed since is
    theirs again), sorted."""
    return sorted(p for p, stamp in recorded.items() if now.get(p) == tuple(stamp))


def set_aside_note(files: list[str], into: str) -> str | None:
    """The line for ``files`` set aside into the folder ``into`` (relative to the
    workspace; a new one under ASIDE each time, so nothing set aside before is replaced)."""
    if not files:
        return None
    more = f" and {len(files) - 1} more" if len(files) > 1 else ""
    return (
        f"set aside {files[0]}{more}, written in the workspace by an earlier run, into "
        f"{into}/: a run starts fresh, as a pod does (--resume keeps them)"
    )


def inside(rel: str) -> bool:
    """A recorded path is a plain relative path inside the workspace (the record is a file
    in the workspace, and anything may have been written into it)."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts
