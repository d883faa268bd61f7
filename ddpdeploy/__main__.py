"""`python -m ddpdeploy` and the `ddpdeploy` console script: SIGINT and SIGTERM are turned
into one line before anything heavy is imported (typer alone takes a while to import, and
Ctrl-C meanwhile was a traceback), then the CLI runs."""

from __future__ import annotations

import sys

from ddpdeploy.signals import aborted, catch_signals, finished


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
