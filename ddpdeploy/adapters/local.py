"""Local processes: start one torchrun agent per node, stream their lines, stop them all.

Each agent runs in its own session (process group), so stopping a node also stops the
worker processes torchrun forked, and nothing is left behind on failure or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ddpdeploy.render.local import LocalNode


@dataclass
class Agent:
    node: LocalNode
    proc: subprocess.Popen[str]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=300))


@dataclass(frozen=True)
class Line:
    hostname: str
    stream: str  # "stdout" or "stderr"
    text: str


class LocalRun:
    """The agents of one local run; use as a context manager so they always stop."""

    def __init__(self, nodes: list[LocalNode], cwd: Path) -> None:
        self.lines: queue.Queue[Line | None] = queue.Queue()
        self.agents: list[Agent] = []
        self._readers: list[threading.Thread] = []
        for node in nodes:
            proc = subprocess.Popen(
                node.argv,
                cwd=cwd,
                env={**os.environ, **node.env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
            agent = Agent(node, proc)
            self.agents.append(agent)
            for stream in ("stdout", "stderr"):
                reader = threading.Thread(target=self._read, args=(agent, stream), daemon=True)
                reader.start()
                self._readers.append(reader)

    def _read(self, agent: Agent, stream: str) -> None:
        pipe = getattr(agent.proc, stream)
        for raw in pipe:
            text = raw.rstrip("\n")
            agent.tail.append(text)
            self.lines.put(Line(agent.node.hostname, stream, text))
        self.lines.put(None)

    def events(self, poll: float = 0.2) -> Iterator[Line | None]:
        """Lines as they come; None now and then so the caller can check exits."""
        while True:
            try:
                yield self.lines.get(timeout=poll)
            except queue.Empty:
                yield None

    def failed(self) -> Agent | None:
        return next((a for a in self.agents if a.proc.poll() not in (None, 0)), None)

    def finished(self) -> bool:
        return all(a.proc.poll() == 0 for a in self.agents)

    def drain(self, timeout: float = 2.0) -> list[Line]:
        """Lines still in the pipes after the processes ended."""
        for reader in self._readers:
            reader.join(timeout)
        out = []
        while True:
            try:
                item = self.lines.get_nowait()
            except queue.Empty:
                return out
            if item is not None:
                out.append(item)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every agent's process group, then SIGKILL what is left."""
        live = [a for a in self.agents if a.proc.poll() is None]
        for agent in live:
            _signal_group(agent.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for agent in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.proc.wait(max(0.0, deadline - time.monotonic()))
        for agent in self.agents:
            # Workers can outlive their agent; the group kill reaches them too.
            _signal_group(agent.proc, signal.SIGKILL)
            agent.proc.wait()

    def __enter__(self) -> LocalRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
