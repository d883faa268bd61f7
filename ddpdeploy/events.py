"""Reading torchrun's console, line by line: pure (no I/O), so any reader of torchrun's
output (a smoke run, a pod's log) uses the same functions.

Rank prefixes. With `contract.RANK_OUTPUT_ENV` in the agent's env, torchrun tees every worker line
to the console prefixed with its global rank (`[rank3]:...`); `split_ranks` takes it apart,
the one rule of every reader (a rank's partial line runs on into the next rank's).
Lines without the prefix are the agent's own (its warnings, its failure summary).

The event protocol (optional). A job may print, from global rank 0 on stdout, one JSON
object per line with an ``"event"`` key; the built-in trainer does, any script may (by hand
or through the helpers). A job that prints none is still judged the same way: a smoke run
succeeds when every node's agent exits 0. The events only add to the report:

- ``{"event": "start", "total_steps": 100, "world_size": 4, "restart_count": 0,
  "resumed": false, ...}``: the workers (re)started; ``total_steps`` sets the progress
  bar's length. Shown as a note naming the node.
- ``{"event": "step", "step": 10, "loss": 0.52}``: progress (``loss`` optional) and the
  steps/s of the report; a ``--kill-at STEP`` run kills at this step.
- ``{"event": "checkpoint", "step": 10, "path": "..."}``: a checkpoint is durable; shown as
  a note; ``--kill-at checkpoint`` kills after the first one.
- ``{"event": "done", "step": 100, "weights_sha256": "..."}``: the last step and the final
  weights' checksum, which the report shows and ``--kill-at`` compares with a clean run.

- ``probe``, ``ranks``, ``hang`` (ddpkit's diagnostics, docs/events.md): the start-up
  all-reduce probe, the per-rank work times with any straggler, the hang watchdog's
  finding; ``describe`` gives each its one report line.

Any other fields are kept and ignored. Event lines are consumed as events: they are not
echoed as the job's output. Anything else a rank prints (stdout or stderr) is the job's own
output.
"""

from __future__ import annotations

import json
import math
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ddpdeploy.formats import ago, duration
from ddpdeploy.text import first_of

EVENTS = ("start", "step", "checkpoint", "done", "probe", "ranks", "hang")
DIAGNOSTICS = ("probe", "ranks", "hang")

_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:", re.ASCII)
# torchrun's error summary, one block per failed worker ("rank : 3 (local_rank: 1)").
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.ASCII)
_SUMMARY_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.ASCII)
_ROOT_CAUSE = "Root Cause (first observed failure)"


@dataclass(frozen=True)
class Event:
    """One protocol line: its kind (``start``, ``step``, ``checkpoint``, ``done``) and all
    its fields (``event`` included)."""

    kind: str
    fields: dict[str, Any]

    @property
    def step(self) -> int | None:
        value = self.fields.get("step")
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
        return value if ok else None


_RANK_ANYWHERE = re.compile(r"\[rank(\d+)\]:", re.ASCII)


def split_ranks(text: str) -> list[tuple[int | None, str]]:
    """A console line as the workers' lines in it, each (its rank or None, its text).

    torchrun tees what it reads of a worker's output, a partial line too (a rank's last
    write before it exits, without its newline), and the next worker's prefixed line runs
    on from there: so every rank prefix inside a worker's line starts a line of its own.
    One right at the start of a line's text stays in it: that is torch's own prefix of an
    uncaught exception's lines ("[rank0]: Traceback ...").

    A script that prints "[rank3]:" mid-line is split there too: the tee's glue leaves no
    other mark, and its text is still shown, only as rank 3's. A protocol event is the one
    exception: a whole JSON event is one line (its strings may hold anything), and no glue
    of a partial line makes one. An event is looked for after the first 16 prefixes that
    open a ``{``, which keeps a line of a million of them linear."""
    match = _RANK_PREFIX.match(text)
    if match is None:
        return [(None, text)]
    out: list[tuple[int | None, str]] = []
    tries = _EVENT_TRIES
    while True:
        rank, start = int(match[1]), match.end()
        following = _RANK_ANYWHERE.search(text, start + 1)  # its text is never empty
        whole = False
        if following is not None and tries and text.startswith("{", start):
            tries -= 1
            whole = _event_to_end(text, start)
        if following is None or whole:
            out.append((rank, text[start:]))
            return out
        out.append((rank, text[start : following.start()]))
        match = following


# Each try reads to the line's end (and json's error scans back to its start): a line of a
# million prefixes that each open a "{" would take hours. torchrun's glue puts an event
# after a few partial lines at most (one per worker that ended mid-line).
_EVENT_TRIES = 16
_DECODER = json.JSONDecoder()
_JSON_SPACE = re.compile(r"[ \t\n\r]*\Z")  # what json.loads allows after the value


def _event_to_end(text: str, start: int) -> bool:
    """Whether ``text`` from ``start`` is one protocol event, read in place (a copy of the
    rest of the line at every rank prefix made a long line of prefixes quadratic)."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return False
    if _JSON_SPACE.match(text, end) is None:
        return False
    return isinstance(value, dict) and value.get("event") in EVENTS


def parse_event(text: str) -> Event | None:
    """The protocol event on this line (rank prefix already split off), or None for any
    other line (including JSON that is not one of the protocol's events, and JSON nested
    deeper than the parser goes)."""
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or value.get("event") not in EVENTS:
        return None
    return Event(value["event"], value)


# ---- failures ---------------------------------------------------------------------------


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
    and lists those too, so they count only when nothing else failed.

    ``last_output``: (node, local rank) -> wall-clock time of that worker's last output, where
    known; finer than torchrun's 1 s stamps."""
    own = [f for f in failures if f.code != -signal.SIGTERM] or failures
    return min(
        own, key=lambda f: (last_output.get((f.node, f.local_rank), float("inf")), not f.root)
    )


def agent_lines(tail: list[str]) -> list[str]:
    """A node's console without torchrun's own traceback and summary, which follow the
    workers' lines and only repeat the rank."""
    cut = [
        i
        for i, t in enumerate(tail)
        if t.startswith("Traceback (most recent call")
        and any("ChildFailedError" in u for u in tail[i:])
    ]
    return tail[: cut[-1]] if cut else tail


def code_text(code: int) -> str:
    """An exit code as torchrun reports it: negative for a signal, named."""
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


# ---- diagnostics: one line each -----------------------------------------------------------


def describe(event: Event) -> str | None:
    """The report line of a ``probe``, ``ranks`` or ``hang`` event; None for other kinds.
    Fields a script left out, or wrote as something else than the protocol's type, are
    shown as ``?``: any JSON a log holds makes a line, never an error."""
    f = event.fields
    if event.kind == "probe":
        return _probe_line(f)
    if event.kind == "ranks":
        return _ranks_line(f)
    if event.kind == "hang":
        return _hang_line(f)
    return None


# A field as a line shows it: a number or a short text; anything else (a list where a number
# belongs, an int too long to print) is "?". Text is made plain where it is printed.
MAX_FIELD = 200
_BIG = 10**18


def field_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if -_BIG < value < _BIG else "?"
    if isinstance(value, float):
        return shown_float(value, "")
    if isinstance(value, str):
        return value if len(value) <= MAX_FIELD else value[:MAX_FIELD] + "…"
    return "?"


def shown_float(value: float, spec: str) -> str:
    """A float formatted by ``spec``; "?" when it is nan, infinite or past _BIG, as an int
    is: fixed-point 1e308 is a 309-digit number, not a rate or a time."""
    return format(value, spec) if math.isfinite(value) and abs(value) < _BIG else "?"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _who(value: Any) -> str:
    if not isinstance(value, dict):
        return "?"
    return f"rank {field_text(value.get('rank', '?'))} ({field_text(value.get('host', '?'))})"


MAX_WARNINGS = 3
MAX_NAMED_RANKS = 16


def _probe_line(f: dict[str, Any]) -> str:
    parts = [f"busbw {field_text(f.get('busbw_gbps', '?'))} GB/s"]
    sizes = _list(f.get("sizes"))
    if sizes:
        per = ", ".join(
            f"{field_text(s.get('mb'))} MB {field_text(s.get('busbw_gbps'))}"
            for s in sizes
            if isinstance(s, dict)
        )
        parts.append(f"per size: {per}")
    parts.append(
        f"world {field_text(f.get('world_size', '?'))}, {field_text(f.get('backend', '?'))}"
    )
    parts.append(f"transport {field_text(f.get('transport', '?'))}")
    if "slowest" in f:
        parts.append(f"slowest {_who(f['slowest'])}")
    if f.get("ok") is False:
        parts.append(f"BELOW the floor {field_text(f.get('min_busbw_gbps'))} GB/s")
    # One line wherever it is shown (status, up's log, smoke's report), so its warnings
    # go on it too, the first few of them: a log may hold thousands.
    warnings = _list(f.get("warnings"))
    parts += [f"warning: {field_text(w)}" for w in warnings[:MAX_WARNINGS]]
    if len(warnings) > MAX_WARNINGS:
        parts.append(f"{len(warnings) - MAX_WARNINGS} more warnings")
    return "; ".join(parts)


def _ranks_line(f: dict[str, Any]) -> str:
    def ms(value: Any) -> str:
        seconds = number(value)
        return "?" if seconds is None else f"{shown_float(seconds * 1e3, '.1f')} ms"

    slowest, fastest = _dict(f.get("slowest")), _dict(f.get("fastest"))
    line = (
        f"step {field_text(f.get('step', '?'))}: work per step slowest {_who(slowest)} "
        f"{ms(slowest.get('work_s'))}, fastest {_who(fastest)} {ms(fastest.get('work_s'))}, "
        f"median {ms(f.get('median_work_s'))}"
    )
    stragglers = [s for s in _list(f.get("stragglers")) if isinstance(s, dict)]
    if stragglers:
        named = ", ".join(f"{_who(s)} {field_text(s.get('x_median', '?'))}x" for s in stragglers)
        return f"{line}; straggler: {named}"
    return f"{line}; no straggler"


def _hang_line(f: dict[str, Any]) -> str:
    ranks = _list(f.get("ranks"))
    hosts = _dict(f.get("hosts"))
    # A job of thousands of ranks: the first few, counted.
    named = first_of(
        [f"{field_text(r)} ({field_text(hosts.get(field_text(r), '?'))})" for r in ranks],
        MAX_NAMED_RANKS,
    )
    stacks = _list(f.get("stacks"))
    where = f.get("dir") or (
        stacks[0].rsplit("/", 1)[0] if stacks and isinstance(stacks[0], str) else "?"
    )
    # None named: every rank had finished the step before and none was in ddpkit's own
    # phases, so the watchdog cannot tell which one is behind (one may be in its own code,
    # another waiting in a collective); only the stacks can.
    named = named or "none named (the watchdog cannot tell which: see the stacks)"
    return (
        f"hung at step {field_text(f.get('step', '?'))} (no step for "
        f"{field_text(f.get('idle_s', '?'))} s): ranks that did not arrive: "
        f"{named}; stacks of {len(stacks)} rank(s) in {field_text(where)}"
    )


# Python's own error names the path; torch.save's C++ writer names only the cause, so the
# user's own frame (the line that wrote) stands in for it.
_READ_ONLY = "Read-only file system"
_READ_ONLY_PATH = re.compile(r"Read-only file system: '((?:[^'\\]|\\.)*)'")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)', re.ASCII)
_OWN_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.ASCII)
_LIBRARIES = ("/site-packages/", "/dist-packages/", "/lib/python3")  # not the user's frame


def own_text(text: str) -> str:
    """A worker's line without torch's own prefix of an uncaught exception's lines (the
    tee's prefix already split off): "[rank1]: ValueError: x" is "ValueError: x"."""
    return _OWN_PREFIX.sub("", text, count=1)


def read_only_write(lines: list[str]) -> str | None:
    """One line naming what a worker wrote on the read-only root (a pod's, and compose's
    since it runs with the pod's settings) and the fix; None when ``lines`` (the root-cause
    rank's own) show no such error."""
    # torch prefixes an uncaught exception's lines with the rank again ("[rank0]: ").
    lines = [_OWN_PREFIX.sub("", t, count=1) for t in lines]
    hits = [i for i, t in enumerate(lines) if _READ_ONLY in t]
    if not hits:
        return None
    last = hits[-1]
    match = _READ_ONLY_PATH.search(lines[last])
    what = f"it wrote {match[1]}" if match else f"it wrote a file{_own_frame(lines, last)}"
    return (
        f"{what} on the read-only root file system, as the pod would refuse it; write under "
        "$DDPDEPLOY_CHECKPOINT_DIR (or /tmp), or pass --writable-rootfs"
    )


def _own_frame(lines: list[str], last: int) -> str:
    """`` (train.py line 7: its code)``: the last frame before ``last`` in the user's own
    code rather than a library's; empty when the lines show none."""
    frames = [
        (i, m)
        for i, t in enumerate(lines[:last])
        if (m := _FRAME.match(t)) and not any(lib in m[1] for lib in _LIBRARIES)
    ]
    if not frames:
        return ""
    i, frame = frames[-1]
    code = lines[i + 1].strip() if i + 1 < last else ""
    return f" ({frame[1]} line {frame[2]}{': ' + code if code else ''})"


# What torch raises when a script asks for CUDA where there is none (a smoke run is always
# on the CPU): CPU builds, and CUDA builds on a host without a GPU (a CUDA base image under
# smoke --docker). Each with what the script did and the change that runs it on the CPU.
_NO_GPU = (
    (
        ("Distributed package doesn't have NCCL built in", "ProcessGroupNCCL is only supported"),
        "it asked for the nccl backend",
        "use gloo when torch.cuda.is_available() is false",
    ),
    (
        ("DistributedDataParallel device_ids and output_device arguments only work",),
        "it gave DDP device_ids for a model on the CPU",
        "leave device_ids out (None) when torch.cuda.is_available() is false",
    ),
    (
        ("Attempting to deserialize object on a CUDA device",),
        "it loaded a checkpoint onto a CUDA device",
        'pass torch.load map_location="cpu" when torch.cuda.is_available() is false',
    ),
    (
        (
            "Torch not compiled with CUDA enabled",
            "has no attribute '_cuda_",
            "Cannot access accelerator device when none is available",
            "No CUDA GPUs are available",
            "Found no NVIDIA driver",
            "device type at start of device string: None",
        ),
        "it used a CUDA device",
        "keep the model and tensors on the CPU when torch.cuda.is_available() is false (no "
        "torch.cuda.set_device, no .to(LOCAL_RANK) or .cuda())",
    ),
)


def needs_gpu(lines: list[str]) -> str | None:
    """One line saying that a worker failed asking for a GPU, which a smoke run (on the CPU,
    gloo) has not, with the line of the script that asked and the change; None when
    ``lines`` (the root-cause rank's own) end in no such error."""
    lines = [_OWN_PREFIX.sub("", t, count=1) for t in lines]
    tracebacks = [i for i, t in enumerate(lines) if t.startswith("Traceback (most recent")]
    for last in range(len(lines) - 1, tracebacks[-1] if tracebacks else len(lines), -1):
        if _FRAME.match(lines[last]) or lines[last].startswith(" "):
            continue  # a frame or its code: the last traceback's own lines say what failed
        for needles, what, fix in _NO_GPU:
            if any(n in lines[last] for n in needles):
                return (
                    f"{what}{_own_frame(lines, last)}, and smoke runs on the CPU with gloo; {fix}"
                )
    return None


# What libstdc++ prints when a thread object is destroyed unjoined: here, torch 2.13 freeing
# DDP's reducer and its gloo group in the interpreter's teardown, after the script's end.
_TEARDOWN = "terminate called without an active exception"


def teardown_abort(lines: list[str], code: int) -> str | None:
    """One line saying that a worker aborted (SIGABRT) in torch's teardown after its script
    ended, with the change that avoids it; None for any other failure."""
    if code not in (-6, 134):
        return None
    own = [_OWN_PREFIX.sub("", t, count=1).strip() for t in lines]
    own = [t for t in own if t]
    if not own or own[-1] != _TEARDOWN or any(t.startswith("Traceback (most") for t in own):
        return None
    return (
        "it aborted after its script ended, in torch's teardown of DDP and its process group "
        "at interpreter exit (torch 2.13 with gloo does that now and then); end the script "
        "with ddpkit.finish(), or flush and os._exit(0) after destroy_process_group()"
    )


# torch's TCPStore when its port is bound already (by anything: another run, a server).
_PORT_TAKEN = re.compile(r"failed to listen on any local network address\. port: (\d+).*EADDRINUSE")


def port_taken(lines: list[str]) -> str | None:
    """One line saying that the rendezvous port was bound by another program before
    torchrun's agent could bind it; None for any other failure."""
    for line in reversed(lines):
        if match := _PORT_TAKEN.search(line):
            return (
                f"its rendezvous port {match[1]} was bound by another program after smoke "
                "chose it and before torchrun could bind it; run again (smoke chooses a new "
                "free port each run)"
            )
    return None


# ---- a running job's progress, from rank 0's log ------------------------------------------


def probe_line(line: str) -> str | None:
    """The probe's report line when ``line`` (a pod's, rank prefix optional) is rank 0's
    ``probe`` event; None for any other line."""
    for rank, text in split_ranks(line.strip()):
        event = parse_event(text) if rank in (None, 0) else None
        if event is not None and event.kind == "probe":
            return describe(event)
    return None


# What the kubelet writes before each line when asked for timestamps (RFC 3339, up to ns).
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d) ", re.ASCII)


def split_timestamp(line: str) -> tuple[float | None, str]:
    """A log line read with timestamps as (its time, epoch seconds, or None; its text)."""
    from datetime import datetime

    match = _STAMP.match(line)
    if match is None:
        return None, line
    zone = "+00:00" if match[3] == "Z" else match[3]
    try:
        when = datetime.fromisoformat(match[1] + zone).timestamp()
    except (ValueError, OverflowError):  # the shape of a stamp, not a date (month 13)
        return None, line
    return when + float(f"0.{match[2] or 0}"), line[match.end() :]


NO_EVENTS = "no training events in rank 0's log (a script without ddpkit.log)"


def worker_lines(lines: list[str]) -> list[tuple[int, str]]:
    """The workers' own lines in a node's log (timestamps optional): (rank, text). torchrun
    starts the workers once every node has joined the rendezvous, so none means none has
    started."""
    return [
        (rank, text)
        for line in lines
        for rank, text in split_ranks(split_timestamp(line.rstrip("\r\n"))[1])
        if rank is not None
    ]


def last_error(lines: list[str]) -> str | None:
    """The line a run that failed ended with, from its node's log: the last line a worker
    wrote (an exception's message, a flag error), torchrun's own traceback and summary
    aside; else the last line the agent or our launcher wrote (a DNS wait that gave up)."""
    texts = [split_timestamp(t.rstrip("\r\n"))[1] for t in lines]
    texts = [t for t in agent_lines(texts) if t.strip()]
    own = [t for line in texts for r, t in split_ranks(line) if r is not None and t.strip()]
    if own:
        return _OWN_PREFIX.sub("", own[-1], count=1).strip() or None
    return texts[-1].strip() if texts else None


@dataclass(frozen=True)
class Progress:
    """The training itself as rank 0's latest events tell it; every field may be missing
    (a script prints what it likes). Times are epoch seconds."""

    events: int = 0  # protocol lines seen
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    eta_s: float | None = None
    checkpoint_step: int | None = None
    checkpoint_age_s: float | None = None
    done: bool = False
    ranks: str | None = None  # describe() of the latest of each
    hang: str | None = None
    probe: str | None = None
    run: str | None = None  # the run record's short form
    quiet: str | None = None  # with no event: what the pod and its log tell instead
    window: int | None = None  # only the log's last lines were read, none of them a step

    def lines(self) -> list[str]:
        """What `status` shows, one line each; with no event, what is known instead (the
        ``quiet`` line), else the "no events" line."""
        if not self.events:
            return [self.quiet or NO_EVENTS]
        out = [self._step_line()]
        if self.checkpoint_step is not None:
            age = "" if self.checkpoint_age_s is None else f", {ago(self.checkpoint_age_s)}"
            out.append(f"last checkpoint: step {self.checkpoint_step}{age}")
        out += [f"{k}: {v}" for k, v in (("probe", self.probe), ("ranks", self.ranks)) if v]
        if self.hang:
            out.append(self.hang)
        if self.run:
            out.append(f"run: {self.run}")
        return out

    def _step_line(self) -> str:
        if self.step is None and self.window is not None:
            return (
                f"training: started; no rank-0 step in the log's last {self.window} lines "
                "(other ranks' lines fill them; `ddpdeploy logs --rank 0` reads it all)"
            )
        if self.step is None:
            return "training: started, no step yet"
        total = f"/{self.total_steps}" if self.total_steps is not None else ""
        parts = [f"step {self.step}{total}" + (" (done)" if self.done else "")]
        if self.eta_s is not None and not self.done:
            parts.append(f"ETA {duration(self.eta_s)}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.samples_per_s is not None:
            parts.append(f"{shown_float(self.samples_per_s, '.1f')} samples/s")
        return "training: " + ", ".join(parts)

    def doc(self) -> dict[str, Any]:
        """`status -o json|yaml`'s ``training``: the same data."""
        from dataclasses import asdict

        return {**asdict(self), "lines": self.lines()}


def number(value: Any) -> float | None:
    """A JSON number as a float (a loss may be nan or inf: shown as it is); None for
    anything else, or an int too large for a float."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def finite(value: Any) -> float | None:
    """A JSON number as a finite float (rates and times: what an ETA is computed from)."""
    got = number(value)
    return got if got is not None and math.isfinite(got) else None


def _count(value: Any) -> int | None:
    """A step or a step count: an int within int64 (a longer one is no step)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    return value if ok else None


def _rank0_events(lines: list[str]) -> Iterator[tuple[float | None, Event]]:
    """Rank 0's protocol events in a node's log, each with its line's time (or None)."""
    for line in lines:
        when, text = split_timestamp(line.rstrip("\r\n"))
        for rank, own in split_ranks(text):
            event = parse_event(own) if rank in (None, 0) else None
            if event is not None:
                yield when, event


def progress(lines: list[str], now: float | None = None) -> Progress:
    """Rank 0's latest state from its log ``lines`` (oldest first; timestamps, as the
    kubelet writes them, and rank prefixes optional): only rank 0's protocol lines count.
    ``now`` (epoch seconds) dates the last checkpoint when lines carry their time."""
    got: dict[str, Any] = {"events": 0}
    steps: list[tuple[float, int]] = []  # (time, step) of timed step lines, for the ETA
    step_s: float | None = None
    for when, event in _rank0_events(lines):
        got["events"] += 1
        f = event.fields
        if event.kind in ("start", "done") and isinstance(f.get("run"), dict):
            got["run"] = run_short(f["run"])
        if event.kind == "start":
            if _count(f.get("total_steps")) is not None:
                got["total_steps"] = f["total_steps"]
            got["done"], steps = False, []  # a restart: the rate starts over
        elif event.kind in ("step", "done") and event.step is not None:
            got["step"], got["done"] = event.step, event.kind == "done"
            got["loss"] = number(f.get("loss")) if event.kind == "step" else got.get("loss")
            if event.kind == "step":
                got["samples_per_s"] = number(f.get("samples_per_s"))
            if when is not None:
                steps.append((when, event.step))
        elif event.kind == "checkpoint" and event.step is not None:
            got["checkpoint_step"] = event.step
            got["checkpoint_age_s"] = None if now is None or when is None else now - when
        elif event.kind in DIAGNOSTICS:
            got[event.kind] = describe(event)
            step_s = finite(f.get("step_s")) if event.kind == "ranks" else step_s
    if not got.get("done"):
        got["eta_s"] = _eta(got.get("step"), got.get("total_steps"), steps, step_s)
    return Progress(**got)


def _eta(
    step: int | None, total: int | None, steps: list[tuple[float, int]], step_s: float | None
) -> float | None:
    """Seconds left at the rate of the timed step lines seen (else the ranks event's)."""
    if step is None or total is None:
        return None
    if len(steps) >= 2 and steps[-1][1] > steps[0][1] and steps[-1][0] > steps[0][0]:
        step_s = (steps[-1][0] - steps[0][0]) / (steps[-1][1] - steps[0][1])
    if step_s is None:
        return None
    try:
        eta = max(0, total - step) * step_s
    except OverflowError:  # a step count no float holds
        return None
    return eta if math.isfinite(eta) and eta < 100 * 365 * 86400 else None


def run_short(run: dict[str, Any]) -> str:
    """The record of what ran, short: image, spec sha256[:12], git commit[:12] (+dirty)."""
    parts = []
    if run.get("image"):
        parts.append(f"image {field_text(run['image'])}")
    if run.get("spec_sha256"):
        parts.append(f"spec {field_text(run['spec_sha256'])[:12]}")
    if run.get("git_commit"):
        dirty = " (dirty)" if run.get("git_dirty") else ""
        parts.append(f"git {field_text(run['git_commit'])[:12]}{dirty}")
    return ", ".join(parts) or "no image, spec or git recorded"
