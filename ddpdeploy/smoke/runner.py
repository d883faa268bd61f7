"""The smoke runner: one run loop for every smoke target (local processes, compose).

The verdict is torchrun's: a run succeeds when every node's agent exits 0, whatever the
command; it fails naming the root-cause rank with its own last lines. The job's optional
event lines (see `ddpdeploy.events`) add progress, steps/s and the final weights'
checksum; the `--kill-at` chaos run kills one worker and times the recovery.

The runner shows nothing itself: it reports to a `Report` the command passes in (progress,
the job's own output lines, notes), and returns an `Outcome` the command prints.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from math import inf
from pathlib import Path

from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.events import (
    Event,
    agent_lines,
    code_text,
    describe,
    needs_gpu,
    number,
    parse_event,
    port_taken,
    read_only_write,
    root_cause,
    split_ranks,
    summary_failures,
    teardown_abort,
)
from ddpdeploy.report import Progress, Report
from ddpdeploy.smoke.backend import Line, Node, NoWorker, RunBackend
from ddpdeploy.text import clip, plain, plain_lines

SETTLE_S = 5.0  # after the first failure, how long the other nodes get to report theirs
# torch's own record of what a process used (PYTORCH_API_USAGE_STDERR=1, a smoke run's env):
# one line per first use, e.g. "PYTORCH_API_USAGE c10d.process_group" when a rank joins a
# process group, "torch.save"/"torch.load". Read as facts about the run, never shown.
API_USAGE = "PYTORCH_API_USAGE "
JOINED = "c10d.process_group"
SAVED, LOADED = "torch.save", "torch.load"
FATAL = "ddpkit: error: "  # ddpkit's own reason for ending a run (the probe's floor, …)
TAIL_LINES = 12
TICK_S = 1.0  # how often the progress line's clock moves when the job prints no steps


# ---- which ranks' output to show ---------------------------------------------------------


@dataclass(frozen=True)
class Ranks:
    """The global ranks whose output is shown live: a set, or every rank (None)."""

    only: frozenset[int] | None = frozenset({0})

    @classmethod
    def parse(cls, text: str) -> Ranks:
        """``all`` or a comma-separated list of global ranks (``0,3``)."""
        text = text.strip()
        if text == "all":
            return cls(None)
        if not re.fullmatch(r"\d+(\s*,\s*\d+)*", text, re.ASCII):
            raise UserError(f"--ranks: {text!r} is not `all` or a list of ranks such as 0,3")
        return cls(frozenset(int(r) for r in text.split(",")))

    def check(self, world_size: int) -> None:
        """Refuse a rank this run does not have: its output would never show."""
        beyond = sorted(r for r in self.only or () if r >= world_size)
        if beyond:
            raise UserError(
                f"--ranks: this run has ranks 0 to {world_size - 1} (world size {world_size}), "
                f"not {beyond[0]}; pick ranks below {world_size}, or all"
            )

    def shows(self, rank: int) -> bool:
        return self.only is None or rank in self.only

    def prefixed(self, world_size: int) -> bool:
        """Prefix each line with its rank when more than one rank is shown."""
        return world_size > 1 if self.only is None else len(self.only) > 1


# ---- the --kill-at chaos step -------------------------------------------------------------


@dataclass(frozen=True)
class KillAt:
    """When to kill: at a step event, after some seconds of the run, or after the first
    checkpoint (a `checkpoint` event or a new file in the checkpoint folder)."""

    step: int | None = None
    seconds: float | None = None
    checkpoint: bool = False

    @classmethod
    def parse(cls, text: str) -> KillAt:
        text = text.strip()
        if text == "checkpoint":
            return cls(checkpoint=True)
        number = re.fullmatch(r"(\d+(?:\.\d+)?)(s?)", text, re.ASCII)
        if number is None or (not number[2] and "." in number[1]):
            raise UserError(f"--kill-at: {text!r} is not a step (8), a time (20s) or `checkpoint`")
        what = "a time" if number[2] else "a step"
        whole = number[1].split(".")[0].lstrip("0")
        if len(whole) > 9:  # int() of thousands of digits raised; float() gave `inf s`
            raise UserError(f"--kill-at: {what} of at most 9 digits, not {len(whole)}")
        if float(number[1]) <= 0:
            raise UserError(f"--kill-at: {text!r}: {what} must be more than 0")
        return cls(seconds=float(number[1])) if number[2] else cls(step=int(number[1]))

    def check(self, timeout: float) -> None:
        """A time at or past ``timeout`` is refused before any run: the run ends first."""
        if self.seconds is not None and self.seconds >= timeout:
            raise UserError(
                f"--kill-at: {self} is not before --timeout ({timeout:g} s), which ends the run "
                "first; choose an earlier time or raise --timeout"
            )

    def __str__(self) -> str:
        if self.step is not None:
            return f"step {self.step}"
        if self.seconds is not None:
            return f"{self.seconds:g} s"
        return "the first checkpoint"


@dataclass
class Kill:
    """What was killed when, and when training came back."""

    at_: KillAt
    node: str = ""
    what: str = ""
    at: float = 0.0
    when: str = ""  # "step 8", "12 s", "checkpoint step 5"
    restarted: bool = False
    restarted_at: float | None = None
    loaded: bool = False  # a restarted worker called torch.load (it resumed from a file)
    saved_before: bool = False  # some rank had called torch.save when the kill struck
    # ddpkit prints `checkpoint` once a save is complete: a job that prints them lost
    # progress only if one came from the workers before the restart (a save still in
    # flight at the kill, such as the built-in trainer's asynchronous one, left nothing).
    announces: bool = False  # the job printed a `checkpoint` event
    committed: bool = False  # ... before the restart
    resumed_step: int | None = None  # the step its `start` event says it resumed from
    recovered_at: float | None = None
    recovered_step: int | None = None
    missed: tuple[str, str] | None = None  # (when, node): a kill was due, no worker was left

    @property
    def lost_progress(self) -> bool:
        """The restarted workers started over although a save was complete before them."""
        started_over = self.restarted_at is not None and not self.loaded
        if not started_over or self.resumed_step is not None or not self.saved_before:
            return False
        return self.committed or not self.announces


@dataclass
class Outcome:
    """A run that succeeded: every agent exited 0."""

    wall: float
    exit_codes: dict[str, int | None]
    done: dict[str, object] | None = None  # the `done` event, when the job printed one
    last_step: int | None = None
    diagnostics: dict[str, str] = field(default_factory=dict)  # probe/ranks: the last line
    train_time: float = 0.0  # from the first step event to the end
    kill: Kill | None = None
    warnings: list[str] = field(default_factory=list)  # what the run did that it should not
    resumed_from: int | None = None  # the checkpoint's step a --resume run started from
    saw_checkpoint: bool = False  # a `checkpoint` event, or a new file in the folder watched

    @property
    def steps(self) -> int | None:
        step = Event("done", dict(self.done or {})).step
        return step if step is not None else self.last_step

    @property
    def weights_sha256(self) -> str | None:
        value = (self.done or {}).get("weights_sha256")
        return value if isinstance(value, str) else None

    @property
    def steps_per_s(self) -> float | None:
        if self.steps is None or self.train_time <= 0:
            return None
        return (self.steps - (self.resumed_from or 0)) / self.train_time  # this run's steps


@dataclass
class _Run:
    """One run of a target: consumes its lines, feeds the view, names failures."""

    target: RunBackend
    view: Progress
    ranks: Ranks
    world_size: int
    kill: Kill | None = None
    checkpoint_dir: Path | None = None
    own_code: str | None = None  # RunOptions.own_code
    done: Event | None = None
    last_step: int | None = None
    first_step_at: float | None = None
    resumed_from: int | None = None  # the step the run's first `start` resumed from
    resumed_total: int | None = None  # ...and the last step it said it would train to
    started_once: bool = False
    started: float = field(default_factory=time.monotonic)
    ticked: float = 0.0
    rank_tails: dict[int, deque[tuple[str, str]]] = field(default_factory=dict)  # stream, text
    rank_seen: dict[int, float] = field(default_factory=dict)  # wall clock of a rank's last line
    rank0_node: str | None = None
    known_files: frozenset[str] = frozenset()
    diagnostics: dict[str, str] = field(default_factory=dict)  # kind -> its last line
    usage: dict[int, set[str]] = field(default_factory=dict)  # rank -> torch's API usage
    saved_on: dict[int, str] = field(default_factory=dict)  # rank -> node, torch.save callers
    usage_works: bool = False  # an agent said its torch import: the usage lines come
    fatal: str | None = None  # ddpkit's own error line, the reason before any exit code
    hang: Event | None = None  # the hang watchdog's finding: each rank's stacks
    saw_checkpoint: bool = False

    def loop(self, timeout: float) -> Outcome:
        self.known_files = self._checkpoint_files()
        for line in self.target.events():
            if line is not None:
                self.take(line)
            else:  # quiet for a poll: the lines held back for a batch are shown now
                self.view.flush()
            self.tick()
            failed = self.target.failed()
            if failed is not None:
                self.settle()
                raise OperationError(self.failure(failed))
            if self.target.finished():
                for rest in self.target.drain():
                    self.take(rest)
                break
            if time.monotonic() - self.started > timeout:
                raise OperationError(f"--timeout: the job did not finish within {timeout:g}s")
        end = time.monotonic()
        self.require_a_process_group()
        self.require_a_step()
        if self.done is None and self.last_step is None:
            self.view.update(info=f"finished, {end - self.started:.0f} s")
        return Outcome(
            wall=end - self.started,
            exit_codes=self.target.exit_codes(),
            done=self.done.fields if self.done else None,
            last_step=self.last_step,
            train_time=end - (self.first_step_at or self.started),
            resumed_from=self.resumed_from,
            kill=self.kill,
            diagnostics=dict(self.diagnostics),
            warnings=self.saving_nodes(),
            saw_checkpoint=self.saw_checkpoint or bool(self._checkpoint_files() - self.known_files),
        )

    def require_a_process_group(self) -> None:
        """Every node exited 0; that is green only if some rank joined a process group
        (a script that finds no GPU and returns trained nothing)."""
        if not self.usage_works or any(JOINED in used for used in self.usage.values()):
            return
        rank, lines = next(iter(sorted(self.rank_tails.items())), (None, deque()))
        shown = "\n".join(f"  {text}" for _, text in list(lines)[-TAIL_LINES:]) or "  (none)"
        who = f"global rank {rank}'s" if rank is not None else "the ranks'"
        raise OperationError(
            "every node exited 0, but no rank joined a process group: the job trained "
            f"nothing (torch.distributed.init_process_group was never called); {who} last "
            f"lines:\n{shown}"
        )

    def require_a_step(self) -> None:
        """A run that resumed at or past its last step trained nothing: not green (its
        `done` step is the checkpoint's, and a steps/s from it would be made up)."""
        resumed, done = self.resumed_from, self.done
        if resumed is None or self.first_step_at is not None or done is None:
            return
        last = done.step
        if last is not None and last <= resumed:
            past = self.resumed_total if self.resumed_total is not None else last
            # --steps is the built-in trainer's (refused for a script): the user's code
            # trains further through its own arguments.
            further = (
                f"with {self.own_code}'s own arguments after `--` set to train further (e.g. "
                "more epochs: ddpdeploy smoke --local --resume -- --epochs 4)"
                if self.own_code
                else "with more --steps"
            )
            raise OperationError(
                f"the run trained no step: it resumed from the checkpoint at step {resumed}, "
                f"at or past its last step ({past}); run without --resume, or {further}"
            )

    def saving_nodes(self) -> list[str]:
        """One line when ranks on two or more nodes saved with torch.save: on a shared
        checkpoint volume they write over each other's files."""
        nodes = sorted(set(self.saved_on.values()))
        if len(nodes) < 2:
            return []
        ranks = ", ".join(str(r) for r in sorted(self.saved_on))
        return [
            f"ranks {ranks} on {len(nodes)} nodes ({', '.join(nodes)}) called torch.save: on "
            "the cluster's shared checkpoint volume they write the same files; save on global "
            "rank 0 only (RANK == 0, not LOCAL_RANK == 0)"
        ]

    def tick(self) -> None:
        """Move the clock of a job that prints no steps; time and checkpoint kills."""
        now = time.monotonic()
        if now - self.ticked < TICK_S:
            return
        self.ticked = now
        elapsed = now - self.started
        if self.last_step is None and self.done is None:
            self.view.update(info=f"running, {elapsed:.0f} s")
        kill = self.kill
        # Not once rank 0 said done: a kill after one node's workers have finished restarts
        # the other node into a round that can never fill (static rendezvous), so its new
        # workers wait out the trainer's store timeout (docs/smoke.md).
        if kill is None or kill.at or self.done is not None:
            return
        if kill.at_.seconds is not None and elapsed >= kill.at_.seconds:
            self.strike(f"{elapsed:.0f} s")  # none started yet: the next tick tries again
        elif kill.at_.checkpoint and (new := self._checkpoint_files() - self.known_files):
            # Named, with when it was seen: a script rewriting one file may save again before
            # the kill lands, so the resume can be from a later save than the first.
            more = f" and {len(new) - 1} more" if len(new) > 1 else ""
            self.strike(f"{plain(min(new))}{more}, new in the checkpoint folder at {elapsed:.0f} s")

    def _checkpoint_files(self) -> frozenset[str]:
        if self.checkpoint_dir is None:
            return frozenset()
        try:
            # Hidden names are no checkpoint: ddpkit's lock file, its and torch's temp files.
            return frozenset(p.name for p in self.checkpoint_dir.iterdir() if p.name[:1] != ".")
        except OSError:
            return frozenset()

    def take(self, line: Line) -> None:
        # One console line can hold several ranks' lines (a partial one runs on into the
        # next): each is its rank's own, shown and kept as such.
        for rank, text in split_ranks(line.text):
            self.take_own(line, rank, text)

    def take_own(self, line: Line, rank: int | None, text: str) -> None:
        if text.startswith(API_USAGE):
            self.on_usage(line.node, rank, text[len(API_USAGE) :].strip())
            return
        if text.startswith(FATAL):
            self.fatal = text
        if rank is not None:
            self.rank_tails.setdefault(rank, deque(maxlen=100)).append((line.stream, clip(text)))
            self.rank_seen[rank] = time.time()
            if rank == 0:
                self.rank0_node = line.node
        event = parse_event(text) if line.stream == "stdout" and rank in (0, None) else None
        if event is not None:
            self.on_event(line.node, text, event)
        elif rank is not None and self.ranks.shows(rank):
            prefix = f"[rank{rank}] " if self.ranks.prefixed(self.world_size) else ""
            self.view.output(prefix + text)

    def on_usage(self, node: str, rank: int | None, key: str) -> None:
        if rank is None:  # the agent's own torch import: this torch reports its usage
            self.usage_works = True
            return
        self.usage.setdefault(rank, set()).add(key)
        if key == SAVED:
            self.saved_on[rank] = node
        kill = self.kill
        if kill is not None and kill.at and key == "torch.python.import" and not kill.restarted:
            # A worker process started after the kill: torchrun restarted the group.
            kill.restarted, kill.restarted_at = True, time.monotonic()
        if kill is not None and kill.restarted and key == LOADED:
            kill.loaded = True

    def on_event(self, node: str, text: str, event: Event) -> None:
        step = event.step
        line = describe(event)
        if line is not None:  # probe, ranks, hang: a note now, a line in the report
            self.diagnostics[event.kind] = line
            self.hang = event if event.kind == "hang" else self.hang
            self.view.note(f"{node}: {event.kind}: {line}")
            return
        if event.kind == "step" and step is not None:
            self.first_step_at = self.first_step_at or time.monotonic()
            self.last_step = step
            loss = number(event.fields.get("loss"))
            info = f"loss {loss:.4f}" if loss is not None else "running"
            self.view.update(completed=step, info=info)
            self.chaos_step(step)
        elif event.kind == "done":
            self.done = event
            # The kill can land after the last step (rank 0's lines arrive in batches): the
            # restarted workers resume at the end and only say "done". That is recovery too.
            self.recovered(step)
            self.view.update(completed=step, info="done")
        elif event.kind in ("start", "checkpoint"):
            total = event.fields.get("total_steps")
            if isinstance(total, int) and total > 0:
                self.view.update(total=total)
            resumed = _resumed_step(event)
            if event.kind == "start" and not self.started_once:
                self.started_once = True
                if resumed is not None:
                    self.resumed_from = resumed
                    self.resumed_total = total if isinstance(total, int) else None
            kill = self.kill
            if event.kind == "start" and kill is not None and kill.at:
                if not kill.restarted:
                    kill.restarted, kill.restarted_at = True, time.monotonic()
                if resumed is not None:
                    kill.resumed_step = resumed
            self.view.note(f"{node}: {text}")
            self.saw_checkpoint = self.saw_checkpoint or event.kind == "checkpoint"
            if event.kind == "checkpoint" and kill is not None:
                kill.announces = True
                kill.committed = kill.committed or not kill.restarted
            if event.kind == "checkpoint" and kill and kill.at_.checkpoint and not kill.at:
                self.strike(f"checkpoint step {step}" if step is not None else "checkpoint")

    def chaos_step(self, step: int) -> None:
        kill = self.kill
        if kill is None:
            return
        if not kill.at and kill.at_.step is not None and step >= kill.at_.step:
            self.strike(f"step {step}")
        else:
            self.recovered(step)

    def strike(self, when: str) -> None:
        """Kill one worker of a node without rank 0 (when known); time the recovery. A node
        with no worker (not started yet, or already finished) is noted, and a later tick or
        event tries again."""
        kill = self.kill
        assert kill is not None
        names = [n.name for n in self.target.nodes]
        others = [n for n in names if n != self.rank0_node] or names
        kill.node = others[-1]
        try:
            kill.what = self.target.kill_worker(kill.node)
        except NoWorker:
            kill.missed = kill.missed or (when, kill.node)
            return
        kill.at, kill.when = time.monotonic(), when
        # torch's usage line may trail the step line (another stream); the folder does not.
        kill.saved_before = bool(self.saved_on or self._checkpoint_files() - self.known_files)
        self.view.note(f"kill-at: SIGKILL {kill.what} of {kill.node}, {when}")

    def recovered(self, step: int | None) -> None:
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
            if any((f.node, f.local_rank) not in times for f in failures):
                # The target cannot tell (compose): when each rank's last line reached us.
                times = {(f.node, f.local_rank): self.rank_seen.get(f.rank, inf) for f in failures}
            cause = root_cause(failures, times)
            lines = _as_printed(self.rank_tails.get(cause.rank, ()))
            node, rank, code = nodes[cause.node], cause.rank, cause.code
        else:  # the agent itself died (e.g. SIGKILL): no summary, no worker to name
            node, rank = nodes[first], None
            code = self.target.exit_codes()[first] or 1
            lines = _node_lines(self.target.tail(node.name))
        said = f"{_where(node, rank)} exited with code {code_text(code)}"
        if lines:
            said += _last_lines(lines, code)
        else:  # a worker named: the agent's lines (its banner, its `failed` line) are not its own
            stacks = _stacks_of(self.hang, rank)
            said += "; it printed nothing" + (f"; its stacks: {plain(stacks)}" if stacks else "")
        if "hang" in self.diagnostics:  # the watchdog's finding says more than exit 124
            return f"hang: {plain_lines(self.diagnostics['hang'])}\n{said}"
        if self.fatal is not None:  # ddpkit's reason (the probe's floor …) before any tail
            return f"{plain(self.fatal.removeprefix(FATAL))}\n{said}"
        return said


def _last_lines(lines: list[str], code: int) -> str:
    """The failure's reason where its lines show one, and its last lines."""
    # The job's own lines: plain text (an escape it printed is not replayed).
    shown = "\n".join(f"  {plain(t)}" for t in lines[-TAIL_LINES:])
    reason = (
        read_only_write(lines)
        or needs_gpu(lines)
        or teardown_abort(lines, code)
        or port_taken(lines)
    )
    why = f": {plain(reason)}. Its" if reason else "; its"
    return f"{why} last lines:\n{shown}"


def _node_lines(tail: list[str]) -> list[str]:
    """A node's console as its last lines when its agent failed with no worker to name:
    without the API-usage lines smoke itself asked torch for."""
    lines = []
    for line in agent_lines(tail):
        for who, text in split_ranks(line):
            if not text.startswith(API_USAGE):
                lines.append(text if who is None else f"[rank{who}]:{text}")
    return lines or ["(it printed nothing)"]


def _stacks_of(hang: Event | None, rank: int | None) -> str | None:
    """The file the hang watchdog wrote ``rank``'s stacks to, when it names one."""
    stacks = hang.fields.get("stacks") if hang is not None else None
    for path in stacks if isinstance(stacks, list) else []:
        if isinstance(path, str) and path.rsplit("/", 1)[-1] == f"hang-rank{rank}.txt":
            return path
    return None


def _resumed_step(event: Event) -> int | None:
    """The step a `start` event says the workers resumed from; None for a fresh start."""
    step = event.fields.get("resume_step")
    return step if event.fields.get("resumed") and isinstance(step, int) else None


def _as_printed(tail: Iterable[tuple[str, str]]) -> list[str]:
    """A rank's lines, its final traceback last: torchrun tails a worker's stdout and
    stderr files apart, so lines printed just before a crash can arrive after its
    traceback, which a process always prints as it ends."""
    lines = list(tail)
    start = max(
        (
            i
            for i, (stream, text) in enumerate(lines)
            if stream == "stderr" and text.startswith("Traceback (most recent call last):")
        ),
        default=None,
    )
    if start is None:
        return [text for _, text in lines]
    after = lines[start:]
    trace = [text for stream, text in after if stream == "stderr"]
    printed = [text for stream, text in after if stream != "stderr"]
    return [text for _, text in lines[:start]] + printed + trace


def _where(node: Node, rank: int | None) -> str:
    parts = [] if node.rank is None else [f"node rank {node.rank}"]
    if rank is not None:
        parts.append(f"global rank {rank}")
    return f"node {node.name}" + (f" ({', '.join(parts)})" if parts else "")


# ---- the command's entry points ---------------------------------------------------------


@dataclass(frozen=True)
class RunOptions:
    world_size: int
    steps: int | None = None  # the built-in trainer's --steps, when given: the bar's length
    timeout: float = 900
    ranks: Ranks = field(default_factory=Ranks)
    kill_at: KillAt | None = None
    checkpoint_dir: Callable[[], Path | None] = lambda: None  # the run's folder, once started
    # The job has a checkpoint volume smoke cannot list (smoke --docker's): only `checkpoint`
    # events place a checkpoint kill there.
    volume_unwatched: bool = False
    # The spec field naming the user's code ("command.script", "command.module"); None for
    # the built-in trainer.
    own_code: str | None = None
    # The clean run's wall time, once it ran: a time the hints suggest must fall inside it.
    clean_wall: float | None = None

    def time_hint(self) -> str:
        """A --kill-at time to suggest: half the clean run, once known (a time at or past its
        end is refused)."""
        wall = self.clean_wall
        return "--kill-at 20s" if wall is None else f"--kill-at {max(1, int(wall / 2))}s"


def run_once(
    start: Callable[[bool], RunBackend],
    report: Report,
    label: str,
    options: RunOptions,
    kill: bool = False,
) -> Outcome:
    """Start a target (``start(kill)``: a chaos run's target holds its ranks at a --kill-at
    STEP until the kill), follow it to the end, always tear it down."""
    with report.progress(label, options.steps, keep=True) as shown, start(kill) as target:
        run = _Run(
            target,
            shown,
            options.ranks,
            options.world_size,
            Kill(options.kill_at) if kill and options.kill_at else None,
            options.checkpoint_dir(),
            options.own_code,
        )
        outcome = run.loop(options.timeout)
    if outcome.kill is not None and not outcome.kill.at:
        raise OperationError(_not_killed(outcome.kill.at_, options, outcome.kill.missed))
    return outcome


def _no_step_events(at: KillAt, options: RunOptions) -> str:
    return (
        f"--kill-at: {at}: the job prints no step events (its own step lines are not read), "
        'so no step kill can be placed; call ddpkit.log("step", step=step) on every rank, '
        f"or kill at a time ({options.time_hint()}) or at checkpoint"
    )


def _not_killed(at: KillAt, options: RunOptions, missed: tuple[str, str] | None = None) -> str:
    """Why a --kill-at run ended (or would end) with nothing killed, and what to choose;
    ``missed``: (when, node) the kill was due but the node had no worker left."""
    if missed is not None:
        when, node = missed
        if at.checkpoint:
            return (
                f"--kill-at checkpoint: when the first checkpoint was seen ({when}), node "
                f"{node} had no worker left to kill (the job ends right after it), so nothing "
                f"was killed; kill at an earlier time ({options.time_hint()}) or step, or let "
                "the job train on past its first checkpoint"
            )
        return (
            f"--kill-at {at}: at {when} node {node} had no worker left to kill (they had "
            "finished; torchrun was still ending), so nothing was killed; choose an earlier "
            f"point ({options.time_hint()})"
        )
    if not at.checkpoint:
        return (
            f"--kill-at: the job ended before {at}, so nothing was killed; choose an earlier point"
        )
    folder = options.checkpoint_dir()
    if options.volume_unwatched:
        return (
            "--kill-at checkpoint: the job ended without a checkpoint smoke could see (no "
            "`checkpoint` event; smoke --docker does not watch the checkpoint volume, only the "
            "events), so nothing was killed; save with ddpkit.save (it prints the event), or "
            f"kill at a time ({options.time_hint()}) or a step, or run --local, which watches its "
            "checkpoint folder"
        )
    where = (
        f"no new file in its checkpoint folder {plain(str(folder))}"
        if folder is not None
        else "the spec has no checkpoint: folder to watch"
    )
    return (
        "--kill-at checkpoint: the job ended without a checkpoint smoke could see (no "
        f"`checkpoint` event, {where}), so nothing was killed; save under "
        "$DDPDEPLOY_CHECKPOINT_DIR (a file written elsewhere, e.g. in the workspace, is not "
        f"watched), or kill at a time ({options.time_hint()}) or a step"
    )


def smoke(
    start: Callable[[bool], RunBackend], report: Report, options: RunOptions
) -> Iterator[tuple[str, Outcome]]:
    """The smoke run: ("run", outcome). With ``kill_at``: ("clean", outcome) of a clean run
    first, then ("kill", outcome) of the same job with one worker SIGKILLed, and when their
    weights differ ("again", outcome) of a second clean run."""
    kill_at = options.kill_at
    last = options.steps
    if last is not None and kill_at and kill_at.step is not None and kill_at.step >= last:
        raise UserError(f"--kill-at: step {kill_at.step} is not before the last step ({last})")
    if kill_at is None:
        yield "run", run_once(start, report, "job", options)
        return
    kill_at.check(options.timeout)
    clean = _clean_run(start, report, "clean run", options)
    yield "clean", clean
    options = replace(options, clean_wall=clean.wall)
    if kill_at.checkpoint and not clean.saw_checkpoint:
        # The kill run would watch for the same and end with nothing killed.
        raise OperationError(_not_killed(kill_at, options))
    if kill_at.step is not None and clean.steps is None:
        # A step kill is placed on step events; without them the kill run would end with
        # nothing killed, however early the step.
        raise UserError(_no_step_events(kill_at, options))
    if kill_at.seconds is not None and kill_at.seconds >= clean.wall:
        # The kill run would run to its end as well, with nothing killed.
        raise UserError(
            f"--kill-at: {kill_at} is not before the clean run's end ({clean.wall:.1f} s), so no "
            "worker would be killed; choose an earlier time"
        )
    if kill_at.step is not None and clean.steps is not None and kill_at.step >= clean.steps:
        # Known only now (the trainer's default steps, a script's own): no run would kill.
        raise UserError(
            f"--kill-at: step {kill_at.step} is not before the clean run's last step "
            f"({clean.steps}), so no worker would be killed; choose an earlier step"
        )
    chaos = run_once(start, report, f"kill at {kill_at}", options, kill=True)
    yield "kill", chaos
    if same_weights(chaos, clean) is False:
        # An inexact resume, or a job whose runs differ anyway: a second clean run tells.
        yield "again", _clean_run(start, report, "clean run again", options)


def _clean_run(
    start: Callable[[bool], RunBackend], report: Report, label: str, options: RunOptions
) -> Outcome:
    """A --kill-at baseline run (no restarts: `launch.run_restarts`); its failure is said to
    be the baseline's, not the kill's."""
    try:
        return run_once(start, report, label, options)
    except OperationError as exc:
        raise OperationError(
            f"--kill-at: the {label} failed, before any kill (it runs with no restarts): {exc}",
            exc.exit_code,
        ) from None


def same_weights(chaos: Outcome, clean: Outcome) -> bool | None:
    """Whether a --kill-at run ended with the clean run's weights; None when the job prints
    no `done` event with `weights_sha256` to compare."""
    if chaos.weights_sha256 is None or clean.weights_sha256 is None:
        return None
    return chaos.weights_sha256 == clean.weights_sha256
