"""The interface every smoke target implements: one run of the job's nodes somewhere.

A target subclasses `RunBackend`:

- `nodes`: the job's nodes in order, as `Node(name, rank)`: name is the pod hostname
  (`<job>-master-0`, `<job>-worker-0`, ...), rank the static node rank or None (c10d
  assigns it). Targets take them from the run plan, never from their own output.
- `events(poll)`: the nodes' console lines as `Line(node, stream, text)`, raw, as the
  torchrun agent printed them; None every `poll` seconds so the runner can check exits.
- `exit_codes()`: {node name: its agent's exit code, None while it runs}.
- `tail(node)`: that node's last console lines (raw). `drain()`: lines left after exit.
- `kill_worker(node)`: SIGKILL one worker process of that node (chaos); returns a short
  description such as "local rank 1 (pid 4242)"; raises `NoWorker` when it has none.
- `last_output_at(node)`: optional, {local rank: wall-clock time of that worker's last
  output} for the node's latest attempt; orders failures finer than torchrun's 1 s stamps.
  Return {} when the target cannot tell.
- `stop()`: tear everything down, idempotent, leaving no process, container, network or
  volume behind. `with target:` calls it on every path (success, failure, Ctrl-C).

Agents run with `contract.RANK_OUTPUT_ENV` in their env (the launch contract's base env,
on every target): torchrun then tees every worker line to the console prefixed with its
global rank.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ddpdeploy.errors import DdpdeployError, OperationError


class NoWorker(OperationError):
    """`kill_worker`: the node has no worker process (yet, or any more)."""


@dataclass(frozen=True)
class Line:
    node: str
    stream: str  # "stdout" or "stderr"
    text: str


@dataclass(frozen=True)
class Node:
    name: str
    rank: int | None  # static node rank; None when the rendezvous assigns it


class RunBackend(ABC):
    """One run of the job's nodes on some target; see the module docstring.

    The line queue is shared: an adapter starts one reader per node stream with
    `_read_in_background`, whose function hands each line to `_feed`; `events` and `drain`
    are the same for every target."""

    nodes: list[Node]

    def __init__(self) -> None:
        self._lines: queue.Queue[Line | None] = queue.Queue()
        self._readers: list[threading.Thread] = []

    def _read_in_background(self, read: Callable[..., None], *args: Any) -> None:
        def pump() -> None:
            try:
                read(*args)
            finally:
                self._lines.put(None)  # wakes events() so the runner checks exits

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        self._readers.append(reader)

    def _feed(self, line: Line) -> None:
        self._lines.put(line)

    def events(self, poll: float = 0.2) -> Iterator[Line | None]:
        """Lines as they come; None now and then so the caller can check exits."""
        while True:
            try:
                yield self._lines.get(timeout=poll)
            except queue.Empty:
                yield None

    def drain(self, timeout: float = 2.0) -> list[Line]:
        """Lines still on their way after the nodes ended (an orphaned worker may hold a
        pipe open, hence the bound)."""
        deadline = time.monotonic() + timeout
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        out: list[Line] = []
        while True:
            try:
                item = self._lines.get_nowait()
            except queue.Empty:
                return out
            if item is not None:
                out.append(item)

    @abstractmethod
    def exit_codes(self) -> dict[str, int | None]: ...

    @abstractmethod
    def tail(self, node: str) -> list[str]: ...

    @abstractmethod
    def kill_worker(self, node: str) -> str: ...

    @abstractmethod
    def stop(self) -> None: ...

    def last_output_at(self, node: str) -> dict[int, float]:
        return {}

    def failed(self) -> str | None:
        """The first node (in node order) whose agent exited non-zero."""
        return next((n for n, c in self.exit_codes().items() if c not in (None, 0)), None)

    def finished(self) -> bool:
        return all(c == 0 for c in self.exit_codes().values())

    def __enter__(self) -> RunBackend:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        try:
            self.stop()
        except DdpdeployError as left:
            if exc is None:
                raise
            # The run's own end stays the reason; what teardown could not remove follows it.
            name = getattr(exc, "name", None)
            first = f"interrupted ({name})" if isinstance(exc, KeyboardInterrupt) else str(exc)
            code = getattr(exc, "exit_code", 1)
            raise OperationError(f"{first}; and {left}", code) from exc
