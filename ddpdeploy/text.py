"""Text from outside (the cluster's pod and job messages, reasons, names, log lines) as one
plain line a terminal shows as it is: no escape sequence can move the cursor, recolour, set
the title or hide text, and no line break can forge a line of ours.

Rich markup is the views' to escape (they pass this text as ``rich.text.Text``, which is
never parsed as markup); this module only knows characters.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# Written as a code point: compiling a named escape loads unicodedata, and Ctrl-C there
# surfaced as a SyntaxError of this file.
REPLACEMENT = "\ufffd"  # REPLACEMENT CHARACTER

# Whole escape sequences first (one mark for each, not a mark and the rest as text):
# CSI (ESC [ or C1 0x9B, parameters, intermediates, a final byte), OSC (ESC ] or C1 0x9D,
# up to BEL or ST, or to the end of the text), and any other ESC + one character.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\s\S]?"
)
# Characters a line must not hold: C0 and C1 controls but tab, DEL, the Unicode line and
# paragraph separators, lone surrogates (no terminal encoding can write them), and the
# format characters (Cf): bidirectional overrides reorder what is shown, zero-width spaces
# and the BOM hide text between what is shown. Zero-width (non-)joiners stay: emoji
# sequences and scripts such as Persian need them, and they join, not hide.
_JOINERS = "\u200c\u200d"
_BREAKS = "\r\n"


def _safe(ch: str) -> str:
    if ch == "\t":
        return ch
    if ch in _BREAKS:
        return " "
    category = unicodedata.category(ch)
    if category in ("Cc", "Cs", "Zl", "Zp") or (category == "Cf" and ch not in _JOINERS):
        return REPLACEMENT
    return ch


def plain(text: object) -> str:
    """``text`` as one line of plain characters: escape sequences and control characters
    (tab aside) become U+FFFD, line breaks a space."""
    value = text if isinstance(text, str) else str(text)
    if value.isprintable():  # the common case: nothing to replace
        return value
    value = _SEQUENCE.sub(REPLACEMENT, value)
    return "".join(_safe(ch) for ch in value)


def plain_lines(text: object) -> str:
    """``text`` as plain lines: each line made ``plain``, the line breaks between them kept
    (a failure summary, a note of several lines); a lone carriage return is a break too."""
    value = text if isinstance(text, str) else str(text)
    if value.isprintable() or "\n" not in value:
        return plain(value)
    return "\n".join(plain(line) for line in value.replace("\r\n", "\n").split("\n"))


# A kept line of a job's output (the last lines a failure shows) is at most this long: a rank
# printing lines of 50 MB made a summary of 600 MB and a process of 4.5 GB.
KEPT_LINE = 2000


def first_of(items: list[str], limit: int) -> str:
    """The first ``limit`` of ``items``, comma-separated, and a count of the rest ("a, b and
    3 more"): one readable line however many there are."""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def clip(text: str, limit: int = KEPT_LINE) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def show(value: Any) -> str:
    """repr for one-line messages, cut short: a value can be a megabyte long."""
    try:
        text = repr(value)
    except ValueError:  # an int with more digits than Python will print
        return "a number too long to print"
    return text if len(text) <= 80 else f"{text[:60]}…({len(text)} characters)"


def reads_as_zero(text: str, number: float) -> bool:
    """A number written with a non-zero digit that float() rounds to 0 (1e-400): it would
    turn off what 0 turns off, the hang watchdog among them."""
    return number == 0 and re.search(r"[1-9]", re.split(r"[eE]", text)[0]) is not None
