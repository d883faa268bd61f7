"""SIGKILL one torchrun worker inside a container, as a crash would; run there by
`ComposeRun.kill_worker` as ``python3 -c <this file> LOCAL_RANK`` ("" = the highest).

Standard library only, and nothing of ddpdeploy: it runs with the image's python3 (every
training image has one; pkill may be missing). A worker has LOCAL_RANK in its env and its
parent (the torchrun agent) has not. Prints which worker it killed; exits non-zero naming
what it found when there is no such worker.
"""

from __future__ import annotations

import os
import signal
import sys


def _env(pid: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)


def _parent(pid: str) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[1]


def workers() -> dict[int, int]:
    """{local rank: pid} of the torchrun workers in this container."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            rank = _env(pid).get("LOCAL_RANK")
            if rank is not None and "LOCAL_RANK" not in _env(_parent(pid)):
                found[int(rank)] = int(pid)
        except (OSError, ValueError, IndexError):
            pass  # gone meanwhile, or not a process of ours
    return found


def main(want: str) -> None:
    found = workers()
    rank = int(want) if want else max(found, default=None)
    if rank is None or rank not in found:
        sys.exit(f"no worker with LOCAL_RANK={rank} (found {sorted(found)})")
    os.kill(found[rank], signal.SIGKILL)
    print(f"local rank {rank} (pid {found[rank]})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
