"""What a local run wrote in the workspace, which the pod's read-only root would refuse.

`smoke --local` cannot make this host's file system read-only, so it compares a listing of
the workspace (path -> mtime and size, taken by the local adapter) before and after the
run and names the files that are new or changed. Pure: listings in, one line out.
"""

from __future__ import annotations

from collections.abc import Mapping

# Not the job's doing, or not in the pod's image: our own run folder (the local checkpoint
# folder is in it), Python's bytecode caches, and the repository's metadata.
IGNORED = frozenset({".ddpdeploy", "__pycache__", ".git"})

Listing = Mapping[str, tuple[int, int]]  # relative path -> (mtime in ns, size)


def written(before: Listing, after: Listing) -> list[str]:
    """Files that are new in ``after`` or whose mtime or size changed, sorted."""
    return sorted(p for p, stamp in after.items() if before.get(p) != stamp)


def warning(files: list[str]) -> str | None:
    """The one line `smoke --local` prints for ``files`` (None when there are none)."""
    if not files:
        return None
    more = f" and {len(files) - 1} more" if len(files) > 1 else ""
    return (
        f"warning: the run wrote {files[0]}{more} in the workspace, outside "
        "$DDPDEPLOY_CHECKPOINT_DIR; the pod's read-only root would refuse it: write under "
        "$DDPDEPLOY_CHECKPOINT_DIR (or /tmp), or pass --writable-rootfs"
    )
