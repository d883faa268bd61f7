"""Reading a compose run's checkpoint volume, for `collect --from compose`: its regular files
are staged beside `--to` (the same file system, so the final rename stays atomic; no folder
of ours made) and collected from there like any local folder; the staging goes on the way
out, on failure and Ctrl-C too."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ddpdeploy.checkpoints import MAX_DEBUG, Destination, LocalSource, debug_kind, shown
from ddpdeploy.fs import write_error


@contextlib.contextmanager
def volume_source(
    volume: str, image: str | None, to: Path, debug: bool, warn: Callable[[str], None]
) -> Iterator[LocalSource]:
    """The volume's regular files staged, as a source (with ``debug``, a diagnostics file
    staged only as far as collect reads it); each other entry but a folder is one line to
    ``warn``. ``image``: a local image to mount the volume with."""
    from ddpdeploy.adapters.docker_volume import copy_out

    def limit_of(entry: str) -> int | None:
        return MAX_DEBUG + 1 if debug and debug_kind(entry) else None

    with _staging(to) as folder:
        where = f"volume {volume}"
        for entry, kind in sorted(copy_out(volume, ".", Path(folder), image, limit_of).items()):
            if kind != "folder":
                warn(f"skipping {shown(entry)} in {where}: a {kind}, not a regular file")
        yield LocalSource(Path(folder), where)


def _staging(to: Path) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder beside --to (or where it would be created); inside --to only when
    its parent is not ours to write."""
    near = Destination(to, overwrite=False).existing()
    if near == Path(os.path.abspath(to)) and os.access(near.parent, os.W_OK | os.X_OK):
        near = near.parent
    try:
        return tempfile.TemporaryDirectory(prefix=".ddpdeploy-collect-", dir=near)
    except OSError as exc:
        # Same line as before; a full or read-only disk exits 1 like every write of collect.
        raise write_error(near, exc, "--to", verb="stage files in") from None
