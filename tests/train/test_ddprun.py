"""train/ddprun.py, how every target starts a user's script under torchrun: the script
sees exactly what `python SCRIPT` gives it, and the process skips only the interpreter's
teardown (where torch 2.13 with gloo aborts finished runs now and then)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from trainer_harness import ROOT

pytestmark = pytest.mark.slow  # starts interpreters

RUNNER = ROOT / "train" / "ddprun.py"

# Prints what a script can see of how it was started, then ends as argv[1] says.
PROBE = """
import multiprocessing, os, pickle, sys

class Point:
    def __init__(self, x): self.x = x

def twice(p): return p.x * 2

if __name__ == "__main__":
    print("name", __name__, "file", __file__, "argv", sys.argv, "path0", sys.path[0])
    print("main is me", sys.modules["__main__"].Point is Point, len(pickle.dumps(Point(1))))
    how = sys.argv[1]
    if how == "spawn":  # the child re-runs this file by __main__.__file__, unpickles Point
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            print("spawned", pool.map(twice, [Point(3)]))
    if how == "exit3":
        sys.exit(3)
    if how == "exit-text":
        sys.exit("the reason")
    if how == "exit-none":
        sys.exit()
    def inner():
        raise ValueError("what failed")
    if how == "raise":
        inner()
    if how == "interrupt":
        raise KeyboardInterrupt
"""


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture()
def probe(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "probe.py").write_text(PROBE)
    return tmp_path


@pytest.mark.parametrize(
    "how", ["ok", "spawn", "exit3", "exit-text", "exit-none", "raise", "interrupt"]
)
def test_a_script_sees_and_ends_as_under_python(probe: Path, how: str):
    plain = run(["sub/probe.py", how, "--flag"], probe)
    ours = run([str(RUNNER), "sub/probe.py", how, "--flag"], probe)
    assert (ours.returncode, ours.stdout, ours.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    assert f"file {probe}/sub/probe.py argv ['sub/probe.py', '{how}'" in ours.stdout
    expected = {"exit3": 3, "exit-text": 1, "raise": 1, "interrupt": -signal.SIGINT}
    assert ours.returncode == expected.get(how, 0)


def test_a_module_sees_and_ends_as_under_python_m(probe: Path):
    (probe / "sub" / "__init__.py").write_text("")
    plain = run(["-m", "sub.probe", "exit3"], probe)
    ours = run([str(RUNNER), "-m", "sub.probe", "exit3"], probe)
    assert (ours.returncode, ours.stdout, ours.stderr) == (3, plain.stdout, plain.stderr)
    assert f"path0 {probe}" in ours.stdout


def test_a_syntax_error_reads_as_under_python(tmp_path: Path):
    (tmp_path / "bad.py").write_text("def f(:\n")
    plain, ours = run(["bad.py"], tmp_path), run([str(RUNNER), "bad.py"], tmp_path)
    assert (ours.returncode, ours.stderr) == (1, plain.stderr)


def test_no_script_is_a_usage_line(tmp_path: Path):
    out = run([str(RUNNER)], tmp_path)
    assert (out.returncode, out.stderr.startswith("usage: ddprun.py SCRIPT")) == (2, True)


# A stand-in for torch's abort: an object whose destruction in the interpreter's teardown
# kills the process with SIGABRT, as freeing DDP's reducer and gloo group does now and then
# in torch 2.13. The real abort cannot be produced on demand; this one always happens.
ABORTS_IN_TEARDOWN = textwrap.dedent(
    """
    import atexit, os, signal, threading, time

    class Reducer:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGABRT)

    reducer = Reducer()
    log = open("log.txt", "w")           # never closed: the teardown would flush it
    log.write("last line\\n")
    def late():
        time.sleep(0.3)
        print("thread finished", flush=True)
    threading.Thread(target=late).start()  # a non-daemon thread outlives the script
    atexit.register(print, "atexit ran")
    print("trained")
    """
)


def test_the_teardown_that_aborts_is_skipped_and_nothing_else(tmp_path: Path):
    (tmp_path / "train.py").write_text(ABORTS_IN_TEARDOWN)
    plain = run(["train.py"], tmp_path)
    assert plain.returncode == -signal.SIGABRT  # the stand-in does abort under python
    ours = run([str(RUNNER), "train.py"], tmp_path)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.splitlines() == ["trained", "thread finished", "atexit ran"]
    assert (tmp_path / "log.txt").read_text() == "last line\n"


def test_the_end_reads_no_attribute_of_the_scripts_objects(tmp_path: Path):
    # Found by the fifth outside-scripts pass: looking for open files with isinstance read
    # every object's __class__, and torch.distributed.reduce_op's warns when read: every
    # rank ended with "FutureWarning: `torch.distributed.reduce_op` is deprecated".
    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """
            import warnings
            warnings.simplefilter("error")  # a warning at the end fails the run
            import torch.distributed
            log = open("log.txt", "w")
            log.write("flushed\\n")
            print("trained")
            """
        )
    )
    ours = run([str(RUNNER), "train.py"], tmp_path)
    assert (ours.returncode, ours.stderr) == (0, ""), ours.stderr
    assert (tmp_path / "log.txt").read_text() == "flushed\n"
