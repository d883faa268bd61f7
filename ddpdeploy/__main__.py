"""`python -m ddpdeploy` and the `ddpdeploy` console script: SIGINT, SIGTERM and SIGHUP are
turned into one line before anything heavy is imported (typer alone takes a while to import, and
Ctrl-C meanwhile was a traceback), then the CLI runs."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _early(signum: int, _frame: FrameType | None) -> None:
    # Until catch_signals is in place (importing ddpdeploy.signals is an interruptible
    # moment too): one line and the signal's code, with nothing of ours begun.
    name = signal.Signals(signum).name
    sys.stderr.write(f"aborted ({name}); nothing more was done\n")
    sys.stderr.flush()
    os._exit(128 + signum)


for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    if _sig != signal.SIGHUP or signal.getsignal(_sig) != signal.SIG_IGN:  # nohup's stays
        signal.signal(_sig, _early)

from ddpdeploy.signals import aborted, catch_signals, finished  # noqa: E402


def run() -> None:
    catch_signals()
    try:
        from ddpdeploy.cli import main
    except KeyboardInterrupt as exc:
        line, code = aborted(exc)
        print(line, file=sys.stderr, flush=True)
        sys.exit(code)
    try:
        main()
    except SystemExit as exc:
        # Said and done: a signal during Python's teardown ends it with this code at once,
        # rather than killing the process by the signal with nothing said.
        finished(exc.code if isinstance(exc.code, int) else (1 if exc.code else 0))
        raise


if __name__ == "__main__":
    run()
