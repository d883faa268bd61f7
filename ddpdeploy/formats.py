"""Human time and size, both ways: how long, how long ago, how old, how big (for views and
lines), and a duration flag ("90s", "15m", "2h") read back into seconds."""

from __future__ import annotations

import re
from datetime import datetime

from ddpdeploy.errors import UserError


def duration(seconds: float) -> str:
    """``42s``, ``3m07s``, ``2h05m``, ``3d04h`` (the units the duration flags read)."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def ago(seconds: float) -> str:
    return f"{duration(max(0.0, seconds))} ago"


def age(created: str | None, now: datetime) -> str:
    """An object's age from its creationTimestamp, in kubectl's one-unit form (``5m``)."""
    if not created:
        return "?"
    then = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    seconds = int((now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def counted(n: int, noun: str) -> str:
    """``1 node``, ``2 nodes``, ``0 pods``: a count with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def size(n: int) -> str:
    """``512 bytes``, ``3.5 KiB``, ``12.0 MiB``."""
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def parse_duration(text: str, flag: str = "--timeout") -> float:
    """ "90", "90s", "15m", "2h", "3d" -> seconds. Days too: `list` shows ages in them, and
    the value is sent on in seconds, never as a Go duration (which has no unit d)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text, re.ASCII)
    if not match:
        raise UserError(f"{flag}: {text!r} is not a duration; use e.g. 90s, 15m, 2h or 3d")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
