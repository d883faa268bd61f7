"""ddprun: how ddpdeploy starts a user's script (or ``-m`` module) under torchrun.

    torchrun [...] ddprun.py SCRIPT [ARGS...]
    torchrun [...] ddprun.py -m MODULE [ARGS...]

The script runs exactly as ``python SCRIPT ARGS`` would run it (``__name__ == "__main__"``,
``sys.argv``, the script's folder first on ``sys.path``, the same exit code and traceback),
with one difference, at its very end: the process leaves with ``os._exit`` once the script's
own threads have ended, its atexit handlers have run and its open files are flushed, and
skips the interpreter's teardown. In that teardown torch 2.13 with gloo frees DDP's reducer
and its process group and now and then aborts a run that trained to the end ("terminate
called without an active exception", SIGABRT), which torchrun and the operator then treat
as a failed worker. Standard library only: it must not change what the script imports.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import gc
import importlib.machinery
import io
import os
import runpy
import signal
import sys
import threading
import types
import zipfile
from types import TracebackType
from typing import Any, NoReturn

_KEEP: list[object] = []
USAGE = "usage: ddprun.py SCRIPT [ARGS...] | ddprun.py -m MODULE [ARGS...]"


def _run(argv: list[str]) -> dict[str, Any]:
    """Run the script or module in ``argv`` as ``__main__``; its globals (kept alive by the
    caller, so nothing of the script is freed before the process ends)."""
    if argv[0] == "-m":
        sys.argv = [argv[0], *argv[2:]]  # runpy sets argv[0] to the module's file
        sys.path[0] = os.getcwd()  # as `python -m` does
        return runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    sys.argv = list(argv)
    path = os.path.abspath(argv[0])
    if not os.path.isfile(path) or zipfile.is_zipfile(path):
        del sys.path[0]  # a folder or zip with __main__.py: runpy puts it first, as python
        return runpy.run_path(argv[0], run_name="__main__")
    # A plain file, as python runs it: __file__ absolute, argv[0] as given, the script's
    # folder first on sys.path, and the script itself in sys.modules as __main__ (pickle
    # and multiprocessing's spawn look its classes and file up there).
    with open(path, "rb") as file:
        code = compile(file.read(), path, "exec")
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
    )
    _KEEP.append(sys.modules["__main__"])  # this module, no longer reachable by name
    sys.modules["__main__"] = main
    exec(code, main.__dict__)
    return main.__dict__


def _exit_code(exc: SystemExit) -> int:
    """What ``sys.exit(value)`` makes the interpreter exit with."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _own_frames_cut(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on: ours and runpy's say nothing."""
    ours = (__file__, runpy.__file__, "<frozen runpy>")
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


def _wait_for_threads() -> None:
    """Join the script's non-daemon threads, as the interpreter does before atexit."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()


def _flush_open_files() -> None:
    """Flush every file the script left open: the teardown would have, by closing them."""
    # type(), not isinstance(): that reads each object's __class__, and some warn when read
    # (torch.distributed.reduce_op printed a FutureWarning at every rank's end).
    kinds = (io.TextIOBase, io.BufferedIOBase)
    files = [o for o in gc.get_objects() if issubclass(type(o), kinds)]
    for file in [*files, sys.stdout, sys.stderr]:  # the script may have replaced the streams
        with contextlib.suppress(Exception):  # closed, detached, broken: the exit must come
            if not file.closed and file.writable():
                file.flush()


def _leave(code: int, kept: object, interrupted: bool = False) -> NoReturn:
    """Exit with ``code``, or by SIGINT as the interpreter does after an uncaught Ctrl-C
    (torchrun and shells read that as an interrupt); ``kept`` (what the script left) stays
    referenced until then."""
    _wait_for_threads()
    atexit._run_exitfuncs()  # prints, not raises, what a handler raised
    _flush_open_files()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def main(argv: list[str]) -> NoReturn:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    # The script's globals or its exception, held in this frame until os._exit: freeing
    # them (DDP's reducer, the group) is the very teardown this skips.
    kept: object = None
    try:
        kept = _run(argv)
        code = 0
    except SystemExit as exc:
        kept, code = exc, _exit_code(exc)
    except BaseException as exc:  # what the interpreter would print, then exit 1 (or SIGINT)
        kept, code = exc, 1
        tb = _own_frames_cut(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    _leave(code, kept, interrupted=isinstance(kept, KeyboardInterrupt))


if __name__ == "__main__":
    main(sys.argv[1:])
