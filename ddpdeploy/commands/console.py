"""The Report operations receive, drawn with rich on stderr: lines of ours, and long work as a
bar on a terminal (one line per milestone in a log, where a redrawn bar is noise)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    ProgressColumn,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as Bar
from rich.text import Text

from ddpdeploy.text import plain, plain_lines


class _Shown:
    """One piece of work on its bar."""

    # A job's lines go out in batches: one print each cost ~0.4 ms beside a live bar (a
    # chatty rank was shown at ~6k lines/s, minutes behind), a batch ~0.04 ms a line.
    BATCH_LINES, BATCH_S = 256, 0.05

    def __init__(self, bar: Bar, task: TaskID, live: bool) -> None:
        self.bar, self.task, self.live = bar, task, live
        self.pending: list[str] = []
        self.flushed = time.monotonic()

    def update(
        self,
        *,
        completed: float | None = None,
        total: float | None = None,
        info: str | None = None,
    ) -> None:
        self.flush()
        fields: dict[str, Any] = {}
        if total is not None:
            fields["total"] = total
        if info is not None:
            fields["info"] = plain(info)
        if completed is not None:
            fields["completed"] = completed
        self.bar.update(self.task, **fields)
        current = self.bar.tasks[self.task]
        if completed is not None or (total is not None and current.completed):
            count = f"{int(current.completed)}/{int(current.total) if current.total else '?'}"
            self.bar.update(self.task, steps=count)

    def step(self, text: str) -> None:
        if not self.live:  # on a terminal the bar's info shows it in place
            self.output(text)
            self.flush()

    def output(self, text: str) -> None:
        # A line a job printed: no markup, no highlighting, and no escape sequence or control
        # character reaches the terminal (text.plain), as in `logs` and `status`.
        self.pending.append(plain_lines(text))
        if len(self.pending) >= self.BATCH_LINES or time.monotonic() - self.flushed >= self.BATCH_S:
            self.flush()

    def flush(self) -> None:
        self.flushed = time.monotonic()
        if self.pending:
            text, self.pending = "\n".join(self.pending), []
            self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        self.flush()
        self.bar.console.print(Text(plain_lines(text), style="dim"), soft_wrap=True)


class ConsoleReport:
    """A Report on stderr (or ``console``)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)

    def say(self, text: str) -> None:
        # Text as written (names and reasons from outside may hold `[`), one line however
        # long; escapes and control characters from outside made harmless (text.plain).
        self.console.print(plain_lines(text), markup=False, highlight=False, soft_wrap=True)

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}")

    @contextlib.contextmanager
    def progress(
        self, label: str, total: float | None = None, *, unit: str = "steps", keep: bool = False
    ) -> Iterator[_Shown]:
        """``keep``: the bar stays as the work's last line (a smoke run's); otherwise it goes
        when the work is done, and is not drawn at all where stderr is not a terminal."""
        live = self.console.is_terminal
        columns: list[str | ProgressColumn] = [TextColumn(f"[bold]{label}"), BarColumn()]
        if unit == "bytes":
            columns += [DownloadColumn(), TransferSpeedColumn()]
        else:
            columns.append(TextColumn("{task.fields[steps]}"))
        # Not markup: an instruction like CMD ["a"] must print as written.
        columns.append(TextColumn("{task.fields[info]}", markup=False))
        bar = Bar(*columns, console=self.console, transient=not keep, disable=not (keep or live))
        task = bar.add_task(label, total=total, info="starting…" if keep else "", steps="")
        with bar:
            shown = _Shown(bar, task, live)
            try:
                yield shown
            finally:
                shown.flush()
