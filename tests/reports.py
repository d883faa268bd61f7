"""A Report (ddpdeploy.report) that keeps what an operation told it: its lines, its warnings,
and how far its long work went, for tests that look at those rather than at a terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class Recorded:
    def __init__(self, on_progress: Callable[[float], None] | None = None) -> None:
        self.said: list[str] = []
        self.warnings: list[str] = []
        self.on_progress = on_progress  # called with each new `completed`

    def say(self, text: str) -> None:
        self.said.append(text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    @contextlib.contextmanager
    def progress(
        self, label: str, total: float | None = None, *, unit: str = "steps", keep: bool = False
    ) -> Iterator[_Work]:
        yield _Work(self)


class _Work:
    def __init__(self, report: Recorded) -> None:
        self.report = report

    def update(
        self,
        *,
        completed: float | None = None,
        total: float | None = None,
        info: str | None = None,
    ) -> None:
        if completed is not None and self.report.on_progress is not None:
            self.report.on_progress(completed)

    def step(self, text: str) -> None:
        self.report.said.append(text)

    def output(self, text: str) -> None:
        self.report.said.append(text)

    def flush(self) -> None:
        pass

    def note(self, text: str) -> None:
        self.report.said.append(text)
