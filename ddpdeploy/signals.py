"""The one interrupt mechanism: SIGINT and SIGTERM become `Interrupted` (a KeyboardInterrupt
that knows its signal), sections that must not stop half-way hold them off, and an
interrupted command ends with one line saying what was and was not done."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

from ddpdeploy.errors import OperationError

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; its exit code is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum


# The interrupt raised that no line has told of yet: typer turns a KeyboardInterrupt that
# escapes a command (one during its module's import, its flags' parsing) into a silent
# exit 130, SIGTERM's too; the entry point tells of it (``untold``).
_untold: list[Interrupted] = []


def _raise(signum: int, _frame: FrameType | None) -> None:
    # The teardown or take-back this starts must not itself be cut short by a second one.
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    exc = Interrupted(signum)
    _untold[:] = [exc]
    raise exc


def catch_signals() -> None:
    """SIGINT and SIGTERM both raise Interrupted, so a command can say what it did (without
    this SIGTERM kills the process mid-change with nothing said)."""
    for sig in _SIGNALS:
        signal.signal(sig, _raise)


def interrupted(exc: KeyboardInterrupt, what: str) -> OperationError:
    """The one line an interrupted command ends with: ``what`` was and was not done."""
    _untold.clear()
    name = getattr(exc, "name", "SIGINT")
    return OperationError(f"interrupted ({name}): {what}", getattr(exc, "exit_code", 130))


def untold() -> Interrupted | None:
    """The interrupt raised that no `interrupted` line has told of (None: none)."""
    return _untold[-1] if _untold else None


def aborted(exc: BaseException | None) -> tuple[str, int]:
    """The line and exit code of a command stopped before it did anything of its own (while
    Python imports it, while its flags are read): nothing more was done."""
    _untold.clear()
    name = getattr(exc, "name", None)
    line = f"aborted ({name}); nothing more was done" if name else "aborted"
    return line, getattr(exc, "exit_code", 130)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM off for a short section that must not stop half-way; one that
    came meanwhile is raised (as Interrupted) once the section is done."""
    pending: list[int] = []
    old = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    for sig in _SIGNALS:
        signal.signal(sig, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if pending:
        _raise(pending[0], None)
