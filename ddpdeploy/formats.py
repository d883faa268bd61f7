"""Human time and size, both ways: how long, how long ago, how old, how big (for views and
lines), and a duration flag ("90s", "15m", "2h") read back into seconds."""

from __future__ import annotations

import re
from datetime import datetime

from ddpdeploy.errors import UserError


def duration(seconds: float) -> str:
    """``42s``, ``3m07s``, ``2h05m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


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


def size(n: int) -> str:
    """``512 bytes``, ``3.5 KiB``, ``12.0 MiB``."""
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def parse_duration(text: str, flag: str = "--timeout") -> float:
    """ "90", "90s", "15m", "2h" -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text, re.ASCII)
    if not match:
        raise UserError(f"{flag}: {text!r} is not a duration; use e.g. 90s, 15m or 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]
