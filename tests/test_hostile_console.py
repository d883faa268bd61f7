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


def test_a_jobs_lines_go_out_in_batches_in_order():
    # Found by the third hostile pass: one print per line beside the bar showed a chatty
    # rank at ~6k lines/s, minutes behind the job. Lines are now printed in batches; a
    # note, an update and the end show what is held back first, in order.
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=400)
    prints = []
    real = console.print
    console.print = lambda *a, **k: (prints.append(a), real(*a, **k))  # type: ignore[method-assign]
    report = ConsoleReport(console)
    with report.progress("job", 10, keep=True) as shown:
        for i in range(1000):
            shown.output(f"line {i}")
        shown.note("a note")
        shown.output("after the note")
        shown.update(completed=1)
        shown.output("last")
    lines = [
        x for x in out.getvalue().splitlines() if x.startswith(("line", "a note", "after", "last"))
    ]
    assert lines == [f"line {i}" for i in range(1000)] + ["a note", "after the note", "last"]
    assert len(prints) < 20, len(prints)
