"""Standard output as an outside system: a full disk or a closed pipe is one line, exit 1."""

from __future__ import annotations

import contextlib
import os
import sys

from ddpdeploy.errors import OperationError


def write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        # What is still buffered would fail again when Python flushes at exit and print a
        # second, "Exception ignored" message: point fd 1 at /dev/null first.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        raise OperationError(f"cannot write to standard output: {exc.strerror or exc}") from None
