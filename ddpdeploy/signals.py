"""The one interrupt mechanism: SIGINT, SIGTERM and SIGHUP become `Interrupted` (a KeyboardInterrupt
that knows its signal), sections that must not stop half-way hold them off, and an
interrupted command ends with one line saying what was and was not done."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from ddpdeploy.errors import OperationError

# SIGHUP too (the terminal closed, the ssh session dropped): by default it killed the
# command with nothing said and left a smoke run's agents, in their own session, training
# on. Not where it came ignored (`nohup`): that asks for the command to outlive the terminal.
_SIGNALS = (signal.SIGINT, signal.SIGTERM) + (
    (signal.SIGHUP,) if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else ()
)


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived; its exit code is the shell's 128 + signal number."""

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
    if sys.unraisablehook is not _swallowed:
        _default_unraisablehook[:] = [sys.unraisablehook]
        sys.unraisablehook = _swallowed
    if not _teardown:
        # Registered first, so run last: after the libraries' exit handlers and the join of
        # every thread, where the rest of Python's teardown (its signal module put back to
        # the default action) would let a signal kill the process with nothing said.
        atexit.register(_ignore_signals)
        _teardown.append(True)


_teardown: list[bool] = []


def _ignore_signals() -> None:
    for sig in _SIGNALS:
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(sig, signal.SIG_IGN)


_default_unraisablehook: list[Any] = []
# How long a swallowed interrupt waits before it is sent again: long enough to be out of
# the finalizer that swallowed it.
_REDELIVER_S = 0.05


def _swallowed(unraisable: Any) -> None:
    """An interrupt raised where Python ignores exceptions (a weakref callback, such as an
    import's module lock, a ``__del__``): Python printed a traceback and the command went on,
    deaf to Ctrl-C (``_raise`` ignores the next). Re-armed, and sent again to the main
    thread once out of there; any other exception goes to Python's own hook."""
    exc = unraisable.exc_value
    if not isinstance(exc, Interrupted):
        for hook in _default_unraisablehook or [sys.__unraisablehook__]:
            hook(unraisable)
        return
    if threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            signal.signal(sig, _raise)
    main = threading.main_thread().ident
    if main is not None:
        again = threading.Timer(_REDELIVER_S, signal.pthread_kill, (main, exc.signum))
        again.daemon = True
        again.start()


def finished(code: int) -> None:
    """The command has ended and said so: a signal from now on (Python's teardown takes a
    tenth of a second) ends the process at once with the command's code, instead of an
    Interrupted that Python's teardown turns into a silent death by the signal."""

    def leave(_signum: int, _frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    for sig in _SIGNALS:
        signal.signal(sig, leave)


def interrupted(exc: KeyboardInterrupt, what: str) -> OperationError:
    """The one line an interrupted command ends with: ``what`` was and was not done."""
    _untold.clear()
    name = getattr(exc, "name", "SIGINT")
    return OperationError(f"interrupted ({name}): {what}", getattr(exc, "exit_code", 130))


@contextlib.contextmanager
def nothing_changed_on_interrupt() -> Iterator[None]:
    """An interrupt before a command's first change (its reads, its preflight): nothing was
    changed, and its line says so. A change inside (cluster.apply) says what it left."""
    try:
        yield
    except KeyboardInterrupt as exc:
        raise interrupted(exc, "stopped before any change; nothing was changed") from None


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
