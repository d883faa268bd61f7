"""The one way an operation tells what it is doing: a `Report` it receives. Operations
(image builds, smoke runs, collects, the cluster verbs) say lines and show long work through
it; how it looks (rich bars on a terminal, one line per milestone in a log) is the views'
(ddpdeploy.commands.views.ConsoleReport). `Quiet` shows nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

Say = Callable[[str], None]  # a Report's `say`, for code that only ever says lines


class Progress(Protocol):
    """One piece of long work as it goes."""

    def update(
        self,
        *,
        completed: float | None = None,
        total: float | None = None,
        info: str | None = None,
    ) -> None:
        """How far (in the work's unit), how far it goes, and what it is at now."""

    def step(self, text: str) -> None:
        """A milestone (a build step, a layer pushed): shown in place on a terminal, as a
        line of its own in a log."""

    def output(self, text: str) -> None:
        """A line the work itself printed (a rank's output), as written; a view may hold
        it back briefly to show lines in batches."""

    def flush(self) -> None:
        """Show what ``output`` holds back (the work calls it when it is idle)."""

    def note(self, text: str) -> None:
        """Our own word during the work (an event, a kill)."""


class Report(Protocol):
    def say(self, text: str) -> None:
        """One line of ours."""

    def warn(self, text: str) -> None:
        """One line of ours about something skipped or suspicious; the work goes on."""

    def progress(
        self, label: str, total: float | None = None, *, unit: str = "steps", keep: bool = False
    ) -> AbstractContextManager[Progress]:
        """Long work; ``unit`` "bytes" shows sizes and speed; ``keep``: the work's state
        stays as its last line (a smoke run's), else it goes when the work is done."""


class _Nothing:
    def update(
        self,
        *,
        completed: float | None = None,
        total: float | None = None,
        info: str | None = None,
    ) -> None:
        pass

    def step(self, text: str) -> None:
        pass

    def output(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def note(self, text: str) -> None:
        pass


class Quiet:
    """A Report that shows nothing (library use, tests that only look at results)."""

    def say(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass

    @contextlib.contextmanager
    def progress(
        self, label: str, total: float | None = None, *, unit: str = "steps", keep: bool = False
    ) -> Iterator[Progress]:
        yield _Nothing()
