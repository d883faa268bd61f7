"""The drawn Report (commands/console.py) shows what a job printed as plain text: escape
sequences, C1 controls and bidi overrides never reach the terminal, line breaks between a
note's lines stay (issue 24 §4)."""

from __future__ import annotations

import io

from rich.console import Console

from ddpdeploy.commands.console import ConsoleReport
from ddpdeploy.text import plain_lines

MARK = "\N{REPLACEMENT CHARACTER}"
HOSTILE = "a\x1b]0;title\x07b\x1b[2Jc\x9b31md\u202ee\u2066f"


def test_every_way_a_report_prints_is_plain():
    out = io.StringIO()
    report = ConsoleReport(Console(file=out, force_terminal=False, width=400))
    report.say(HOSTILE)
    report.warn(HOSTILE)
    with report.progress("job", 10, keep=True) as shown:
        shown.output(HOSTILE)
        shown.note(HOSTILE + "\n  second line")
        shown.step(HOSTILE)
        shown.update(completed=1, info=HOSTILE)
    text = out.getvalue()
    for bad in ("\x1b", "\x07", "\x9b", "\u202e", "\u2066"):
        assert bad not in text, (bad, text)
    assert f"a{MARK}b{MARK}c{MARK}d{MARK}e{MARK}f" in text
    assert "\n  second line" in text


def test_plain_lines_keeps_the_breaks_between_lines():
    assert plain_lines("one\x1b[2J\r\ntwo\rthree\n") == f"one{MARK}\ntwo three\n"
    assert plain_lines("no break \x07") == f"no break {MARK}"
