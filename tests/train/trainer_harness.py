"""Helpers for the trainer tests: real torchrun subprocesses on 127.0.0.1, nothing mocked.

Named distinctively (not conftest.py) so it cannot collide with tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "train" / "ddptrain.py"

# The launch contract's env for every torchrun agent (see train/README.md): with c10d and
# several agents, worker restarts need a fresh store per rendezvous round.
CONTRACT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # The start-up probe costs ~3 s a launch; tests/train/test_diagnostics.py turns it on.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DDPDEPLOY_PROBE="0")
    for k in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        "DDPDEPLOY_CHECKPOINT_DIR",
    ):
        env.pop(k, None)
    env.update(extra or {})
    return env


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first), read from /proc."""
    out: list[int] = []
    todo = [pid]
    while todo:
        cur = todo.pop()
        for task in Path(f"/proc/{cur}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                out += kids
                todo += kids
    return out


class Proc:
    """One torchrun agent (or plain python) in its own session, output in files."""

    def __init__(self, argv: list[str], cwd: Path, name: str, env: dict[str, str]) -> None:
        self.out_path = cwd / f"{name}.out"
        self.err_path = cwd / f"{name}.err"
        self._out = open(self.out_path, "wb")  # noqa: SIM115 - closed in wait/kill
        self._err = open(self.err_path, "wb")  # noqa: SIM115
        self.p = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=self._out,
            stderr=self._err,
            start_new_session=True,  # own process group: teardown kills agent and workers
        )

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        evs = []
        for line in self.stdout.splitlines():
            if line.startswith("{"):
                try:
                    evs.append(json.loads(line))
                except ValueError:
                    continue
        return evs

    def last_step(self) -> int:
        steps = [e["step"] for e in self.events() if e.get("event") == "step"]
        return max(steps, default=0)

    def wait_for(self, cond: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.p.poll() is not None and not cond():
                raise AssertionError(f"exited {self.p.returncode} first:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting:\n{self.tail()}")
            time.sleep(0.02)

    def wait(self, timeout: float = 120) -> int:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"timed out after {timeout}s:\n{self.tail()}") from None
        self._out.close()
        self._err.close()
        return rc

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the agent and every descendant.

        torchrun starts each worker in its own session, so killing the agent's process
        group alone would leave the workers running (and training on).
        """
        pids = [self.p.pid, *descendants(self.p.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)  # each worker leads its own group (its own children)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.p.wait(timeout=10)

    def workers(self) -> list[int]:
        """PIDs of the agent's direct children (the workers), lowest local rank first."""
        kids = Path(f"/proc/{self.p.pid}/task/{self.p.pid}/children").read_text().split()
        return sorted(int(k) for k in kids)

    def tail(self) -> str:
        return f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-4000:]}"


class Launcher:
    """Starts torchrun agents; on exit kills every process group it started."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.procs: list[Proc] = []

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            if p.p.poll() is None:
                p.p.wait(timeout=10)
            p._out.close()
            p._err.close()

    def torchrun(
        self,
        trainer_args: list[str],
        nproc: int = 2,
        torchrun_args: list[str] | None = None,
        name: str = "run",
        env: dict[str, str] | None = None,
        script: Path = TRAINER,
    ) -> Proc:
        """torchrun (this interpreter's) of ``script``, the trainer by default."""
        if torchrun_args is None:
            torchrun_args = ["--standalone"]
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            *torchrun_args,
            str(script),
            *trainer_args,
        ]
        p = Proc(argv, self.cwd, name, base_env({**CONTRACT_ENV, **(env or {})}))
        self.procs.append(p)
        return p

    def python(self, trainer_args: list[str], name: str = "py") -> Proc:
        p = Proc([sys.executable, str(TRAINER), *trainer_args], self.cwd, name, base_env())
        self.procs.append(p)
        return p

    def run_ok(self, trainer_args: list[str], timeout: float = 120, **kw: Any) -> Proc:
        p = self.torchrun(trainer_args, **kw)
        rc = p.wait(timeout)
        assert rc == 0, p.tail()
        return p


def done_hash(p: Proc) -> str:
    last = p.events()[-1]
    assert last["event"] == "done", p.tail()
    return str(last["weights_sha256"])


def start_event(p: Proc) -> dict[str, Any]:
    starts = [e for e in p.events() if e.get("event") == "start"]
    assert starts, p.tail()
    return starts[-1]
