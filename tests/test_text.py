"""ddpdeploy.text.plain: any text from the cluster becomes one line a terminal shows as is."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from ddpdeploy.text import REPLACEMENT, plain

ESC = "\x1b"
# Text that leans on what spoofs a terminal: escapes, C1 controls, markup, line breaks.
hostile = st.text(
    alphabet=st.one_of(
        st.characters(),
        st.sampled_from([ESC, "\x9b", "\x9d", "\x07", "\r", "\n", "\x85", "\u2028", "[", "]", "/"]),
    )
)


def test_plain_text_stays_as_it_is():
    for text in ("containers with unready status: [pytorch]", "ok\ttab", "Ünïcödé ✓", ""):
        assert plain(text) == text


def test_escape_sequences_and_controls_are_replaced():
    assert plain(f"{ESC}[31mred{ESC}[0m") == f"{REPLACEMENT}red{REPLACEMENT}"
    assert plain(f"{ESC}]0;pwned{ESC}\\title") == f"{REPLACEMENT}title"  # OSC, ST-terminated
    assert plain(f"{ESC}]0;pwned\x07x") == f"{REPLACEMENT}x"  # OSC, BEL-terminated
    assert plain("\x9b2J") == REPLACEMENT  # C1 CSI
    assert plain("a\nb\r\nc") == "a b  c"
    assert plain("back\bspace\x00") == f"back{REPLACEMENT}space{REPLACEMENT}"
    assert plain("\u202egnp.exe") == f"{REPLACEMENT}gnp.exe"  # a bidi override


def test_characters_that_hide_text_are_shown():
    # Found by the second hostile pass: a zero-width space and a BOM reached the terminal,
    # so "rank\u200b0" read as "rank0" and a BOM hid where a line began.
    assert plain("rank\u200b0") == f"rank{REPLACEMENT}0"
    assert plain("\ufeffstep 5") == f"{REPLACEMENT}step 5"
    assert plain("a\u2060b\U000e0041") == f"a{REPLACEMENT}b{REPLACEMENT}"  # word joiner, tag
    # The joiners that build emoji and scripts (Persian) are kept.
    assert plain("\U0001f469\u200d\U0001f4bb \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645") == (
        "\U0001f469\u200d\U0001f4bb \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"
    )


@given(hostile)
def test_any_text_is_one_plain_line(text):
    out = plain(text)
    assert len(out.splitlines()) <= 1
    hidden = ("Cc", "Cs", "Cf", "Zl", "Zp")
    assert all(ch in "\t\u200c\u200d" or unicodedata.category(ch) not in hidden for ch in out)
    assert plain(out) == out  # already plain: nothing more to do
    # Through rich as a Text (how the views pass it): no markup error, no escape out.
    console = Console(width=80, color_system=None, force_terminal=False)
    with console.capture() as got:
        console.print(Text(out), end="")
    shown = got.get()
    assert ESC not in shown and "\x9b" not in shown
