"""The smoke runner: one run loop for every smoke target (local processes now, compose next).

Adapter interface. A target subclasses `SmokeTarget` for one run of the job's nodes:

- `nodes`: the job's nodes in order, as `Node(name, rank)`: name is the pod hostname
  (`<job>-master-0`, `<job>-worker-0`, ...), rank the static node rank or None (c10d
  assigns it).
- `events(poll)`: the nodes' console lines as `Line(node, stream, text)`, raw, as the
  torchrun agent printed them; None every `poll` seconds so the runner can check exits.
- `exit_codes()`: {node name: its agent's exit code, None while it runs}.
- `tail(node)`: that node's last console lines (raw). `drain()`: lines left after exit.
- `kill_worker(node)`: SIGKILL one worker process of that node (chaos); returns a short
  description such as "local rank 1 (pid 4242)".
- `last_output_at(node)`: optional, {local rank: wall-clock time of that worker's last
  output} for the node's latest attempt; orders failures finer than torchrun's 1 s stamps.
  Return {} when the target cannot tell.
- `stop()`: tear everything down, idempotent, leaving no process, container, network or
  volume behind. `with target:` calls it on every path (success, failure, Ctrl-C).

Agents must run with `RANK_OUTPUT_ENV` in their env: torchrun then tees every worker line
to the console prefixed with its global rank (`[rank3]:...`), which is how the runner reads
rank 0's JSON events and shows a failed rank's own lines.

The runner does the rest, once for every target: progress from rank 0's JSON lines, the
final report (wall time, steps/s, weights_sha256), naming the root-cause rank of a
failure, the CPU budget check, and the `--kill-at` chaos run with its recovery time.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import typer

from ddpdeploy.errors import OperationError, UserError

# torchrun options, read from the agent's env: tee each worker's stdout/stderr to the
# console (and to files under PET_LOG_DIR), each line prefixed with the global rank.
RANK_OUTPUT_ENV = {"PET_TEE": "3", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
# torchrun's error summary, one block per failed worker ("rank : 3 (local_rank: 1)").
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_SUMMARY_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_ROOT_CAUSE = "Root Cause (first observed failure)"

# Workers (all nodes together) per CPU core before a smoke run is refused without --force:
# 4 lets the README's 2 x 2 job and a 2 x 4 run on two cores; beyond that gloo timeouts
# and a frozen machine are likelier than a useful answer.
MAX_WORKERS_PER_CORE = 4
SETTLE_S = 5.0  # after the first failure, how long the other nodes get to report theirs
TAIL_LINES = 12


@dataclass(frozen=True)
class Line:
    node: str
    stream: str  # "stdout" or "stderr"
    text: str


@dataclass(frozen=True)
class Node:
    name: str
    rank: int | None  # static node rank; None when the rendezvous assigns it


class SmokeTarget(ABC):
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
        out = []
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

    def __enter__(self) -> SmokeTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def split_rank(text: str) -> tuple[int | None, str]:
    """A console line as (global rank of the worker that wrote it or None, its text)."""
    match = _RANK_PREFIX.match(text)
    if match is None:
        return None, text
    return int(match[1]), text[match.end() :]


def parse_event(text: str) -> dict[str, Any] | None:
    """The trainer's JSON line as a dict, or None for any other line."""
    if not text.startswith("{"):
        return None
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def check_cpu_budget(nodes: int, procs: int, force: bool, cores: int | None = None) -> None:
    """Refuse a run that would start far more workers than this host has cores."""
    cores = cores or _usable_cores()
    workers = nodes * procs
    limit = MAX_WORKERS_PER_CORE * cores
    if workers > limit and not force:
        raise UserError(
            f"--nodes/--procs: {nodes} x {procs} = {workers} worker processes on {cores} CPU "
            f"core(s) is more than {limit} ({MAX_WORKERS_PER_CORE} per core) and would thrash "
            "this machine; use fewer nodes or procs, or pass --force"
        )


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (taskset, cgroups)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# ---- failure naming -------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerFailure:
    node: str
    rank: int
    local_rank: int
    code: int
    root: bool  # torchrun's own pick ("Root Cause"), from 1 s timestamps


def summary_failures(node: str, tail: list[str]) -> list[WorkerFailure]:
    """The failed workers listed in torchrun's error summary in ``tail`` (agent lines only)."""
    out: list[WorkerFailure] = []
    pending: tuple[int, int] | None = None
    root = False
    for text in tail:
        if _RANK_PREFIX.match(text):
            continue  # a worker's line, not the agent's summary
        if _ROOT_CAUSE in text:
            root = True
        elif match := _SUMMARY_RANK.match(text):
            pending = (int(match[1]), int(match[2]))
        elif pending and (match := _SUMMARY_CODE.match(text)):
            out.append(WorkerFailure(node, *pending, int(match[1]), root))
            pending = None
    return out


def root_cause(
    failures: list[WorkerFailure], last_output: dict[tuple[str, int], float]
) -> WorkerFailure:
    """The worker that failed first. Its peers fail only after it exited (gloo: "connection
    closed"), so their last output comes after its own; torchrun SIGTERMs the rest of a node
    and lists those too, so they count only when nothing else failed."""
    own = [f for f in failures if f.code != -signal.SIGTERM] or failures
    return min(
        own, key=lambda f: (last_output.get((f.node, f.local_rank), float("inf")), not f.root)
    )


def _code_text(code: int) -> str:
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


def _agent_lines(tail: list[str]) -> list[str]:
    """A node's console without torchrun's own traceback and summary, which follow the
    workers' lines and only repeat the rank."""
    cut = [
        i
        for i, t in enumerate(tail)
        if t.startswith("Traceback (most recent call")
        and any("ChildFailedError" in u for u in tail[i:])
    ]
    return tail[: cut[-1]] if cut else tail


def _where(node: Node, rank: int | None) -> str:
    parts = [] if node.rank is None else [f"node rank {node.rank}"]
    if rank is not None:
        parts.append(f"global rank {rank}")
    return f"node {node.name}" + (f" ({', '.join(parts)})" if parts else "")


# ---- one run --------------------------------------------------------------------------


@dataclass
class Kill:
    """The --kill-at chaos step: what was killed when, and when training came back."""

    step: int
    node: str = ""
    what: str = ""
    at: float = 0.0
    restarted: bool = False
    recovered_at: float | None = None
    recovered_step: int | None = None


@dataclass
class Outcome:
    done: dict[str, Any]
    wall: float
    train_time: float
    kill: Kill | None


@dataclass
class _Run:
    """One run of a target: consumes its lines, drives the progress bar, names failures."""

    target: SmokeTarget
    progress: Any  # rich.progress.Progress
    task: Any
    kill: Kill | None = None
    done: dict[str, Any] | None = None
    first_step_at: float | None = None
    rank_tails: dict[int, deque[str]] = field(default_factory=dict)
    rank0_node: str | None = None

    def loop(self, timeout: float) -> Outcome:
        started = time.monotonic()
        for line in self.target.events():
            if line is not None:
                self.take(line)
            failed = self.target.failed()
            if failed is not None:
                self.settle()
                raise OperationError(self.failure(failed))
            if self.target.finished():
                for rest in self.target.drain():
                    self.take(rest)
                break
            if time.monotonic() - started > timeout:
                raise OperationError(f"--timeout: the run did not finish within {timeout:g}s")
        if self.done is None:
            raise OperationError("the trainer ended without its final 'done' line")
        end = time.monotonic()
        return Outcome(self.done, end - started, end - (self.first_step_at or started), self.kill)

    def take(self, line: Line) -> None:
        rank, text = split_rank(line.text)
        if rank is not None:
            self.rank_tails.setdefault(rank, deque(maxlen=100)).append(text)
            if rank == 0:
                self.rank0_node = line.node
        event = parse_event(text) if line.stream == "stdout" and rank in (0, None) else None
        if event is not None:
            self.on_event(line.node, text, event)

    def on_event(self, node: str, text: str, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "step":
            self.first_step_at = self.first_step_at or time.monotonic()
            step = int(event["step"])
            loss = event.get("loss", float("nan"))
            self.progress.update(self.task, completed=step, info=f"loss {loss:.4f}")
            self.chaos(step)
        elif kind == "done":
            self.done = event
            # The kill can land after the last step (rank 0's lines arrive in batches): the
            # restarted workers resume at the end and only say "done". That is recovery too.
            self.chaos_recovered(int(event["step"]))
            self.progress.update(self.task, completed=event["step"], info="done")
        elif kind in ("start", "checkpoint"):
            if event.get("total_steps"):
                self.progress.update(self.task, total=event["total_steps"])
            if kind == "start" and self.kill is not None and self.kill.at:
                self.kill.restarted = True
            self.progress.console.print(f"[dim]{node}: {text}", soft_wrap=True)

    def chaos(self, step: int) -> None:
        """Kill one worker of a node without rank 0 at the chosen step; time the recovery."""
        kill = self.kill
        if kill is None:
            return
        if not kill.at and step >= kill.step:
            names = [n.name for n in self.target.nodes]
            others = [n for n in names if n != self.rank0_node] or names
            kill.node = others[-1]
            kill.what = self.target.kill_worker(kill.node)
            kill.at = time.monotonic()
            self.progress.console.print(f"kill-at: SIGKILL {kill.what} of {kill.node}, step {step}")
        else:
            self.chaos_recovered(step)

    def chaos_recovered(self, step: int) -> None:
        """The first step (or the end) the restarted workers report ends the recovery."""
        kill = self.kill
        if kill is not None and kill.restarted and kill.recovered_at is None:
            kill.recovered_at, kill.recovered_step = time.monotonic(), step

    def settle(self) -> None:
        """Let the other nodes end and report too (bounded), reading their lines."""
        deadline = time.monotonic() + SETTLE_S
        for line in self.target.events(poll=0.1):
            if line is not None:
                self.take(line)
            running = [c for c in self.target.exit_codes().values() if c is None]
            if not running or time.monotonic() > deadline:
                break
        for rest in self.target.drain(timeout=0.5):
            self.take(rest)

    def failure(self, first: str) -> str:
        """The root-cause worker: which node and rank, its exit code and its own last lines."""
        nodes = {n.name: n for n in self.target.nodes}
        failures = [f for n in nodes for f in summary_failures(n, self.target.tail(n))]
        if failures:
            times = {
                (n, local): at for n in nodes for local, at in self.target.last_output_at(n).items()
            }
            cause = root_cause(failures, times)
            lines = list(self.rank_tails.get(cause.rank, ()))
            node, rank, code = nodes[cause.node], cause.rank, cause.code
        else:  # the agent itself died (e.g. SIGKILL): no summary, no worker to name
            node, rank, lines = nodes[first], None, []
            code = self.target.exit_codes()[first] or 1
        lines = lines or _agent_lines(self.target.tail(node.name))
        shown = "\n".join(f"  {t}" for t in lines[-TAIL_LINES:])
        return f"{_where(node, rank)} exited with code {_code_text(code)}; its last lines:\n{shown}"


# ---- the command's entry point ----------------------------------------------------------


def run_once(
    start: Callable[[], SmokeTarget],
    console: Any,
    label: str,
    steps: int | None,
    timeout: float,
    kill_at: int | None = None,
) -> Outcome:
    """Start a target, follow it to the end with a progress bar, always tear it down."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    )
    task = progress.add_task("train", total=steps, info="rendezvous…")
    with progress, start() as target:
        run = _Run(target, progress, task, Kill(kill_at) if kill_at is not None else None)
        outcome = run.loop(timeout)
    if outcome.kill is not None and not outcome.kill.at:
        raise OperationError(
            f"--kill-at: the run ended at step {outcome.done['step']} before reaching step "
            f"{kill_at}; choose an earlier step"
        )
    return outcome


def smoke(
    start: Callable[[], SmokeTarget],
    *,
    steps: int | None,
    timeout: float,
    kill_at: int | None = None,
) -> None:
    """The smoke run, reported on stdout. With ``kill_at``: a clean run first, then the same
    job with one worker SIGKILLed at that step, which must end with the same weights."""
    from rich.console import Console

    console = Console(stderr=True)
    if steps is not None and kill_at is not None and kill_at >= steps:
        raise UserError(f"--kill-at: step {kill_at} is not before the last step ({steps})")
    clean = None
    if kill_at is not None:
        clean = run_once(start, console, "clean run", steps, timeout)
    label = "training" if kill_at is None else f"kill at {kill_at}"
    report(run_once(start, console, label, steps, timeout, kill_at), clean)


def report(outcome: Outcome, clean: Outcome | None = None) -> None:
    done = outcome.done
    rate = done["step"] / outcome.train_time if outcome.train_time > 0 else float("nan")
    typer.echo(f"wall time       {outcome.wall:.1f} s")
    typer.echo(f"steps           {done['step']}")
    typer.echo(f"steps/s         {rate:.1f}")
    typer.echo(f"weights_sha256  {done['weights_sha256']}")
    kill = outcome.kill
    if kill is None or clean is None:
        return
    typer.echo(f"killed          {kill.what} of {kill.node} at step {kill.step}")
    if kill.recovered_at is None:
        typer.echo("recovery        not observed (no step after a restart of the workers)")
    else:
        typer.echo(
            f"recovery        {kill.recovered_at - kill.at:.1f} s "
            f"(kill -> step {kill.recovered_step} after torchrun restarted the workers)"
        )
    same = clean.done["weights_sha256"] == done["weights_sha256"]
    typer.echo(f"clean run       {clean.done['weights_sha256']}{' (same)' if same else ''}")
    if not same:
        raise OperationError(
            "--kill-at: the weights differ from a clean run of the same job: the resume "
            "after the kill was not exact"
        )
