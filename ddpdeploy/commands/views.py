"""What the cluster commands show: the status table and document, the `up --wait` view, the
`list` table, log lines.

Everything that comes from the cluster (pod and job messages, reasons, names, log lines)
goes through ddpdeploy.text.plain and reaches rich as ``Text`` (never parsed as markup), so
``[/bold]`` in a reason neither crashes nor styles, and ``[pytorch]`` stays. Standard output
is written through ddpdeploy.adapters.stdout (a full disk or closed pipe: one line, exit 1).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ddpdeploy.adapters.stdout import write_stdout
from ddpdeploy.cluster.jobstate import PodView, pod_view
from ddpdeploy.cluster.watch import Snapshot, kind_of, layout_of_job
from ddpdeploy.events import Progress
from ddpdeploy.formats import counted
from ddpdeploy.obj import Obj
from ddpdeploy.text import REPLACEMENT, plain

# Above this many pods the live view is a count per phase and the pods that are not
# running, named; every row stays in `status`.
MAX_ROWS = 16


def cell(value: object) -> Text:
    """A value from the cluster as a table cell: plain text, no markup."""
    return Text(plain(value))


def print_out(renderable: RenderableType, width: int | None = None) -> None:
    """Print a rich renderable on standard output through the one stdout writer (rendered
    into a string first: rich writing to a full stdout itself raises a traceback)."""
    tty = sys.stdout.isatty()
    if width is None and tty:
        width = shutil.get_terminal_size().columns
    console = Console(file=io.StringIO(), force_terminal=tty, highlight=False, width=width)
    console.print(renderable)
    write_stdout(console.file.getvalue())  # type: ignore[attr-defined]


# A lone UTF-16 surrogate (a log's JSON escape "\ud800" reads as one): json.dumps writes it
# as an escape that strict parsers (jq, serde_json, I-JSON) refuse, and no UTF-8 holds it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def strict(doc: Any) -> Any:
    """``doc`` as strict JSON can hold it: a non-finite number (a loss of nan, an inf a log
    wrote) becomes null; the lines beside it still say it as text. A lone surrogate in a
    string (or a key) becomes U+FFFD, as the table and YAML show it."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, str):
        return _SURROGATE.sub(REPLACEMENT, doc)
    if isinstance(doc, dict):
        return {strict(key): strict(value) for key, value in doc.items()}
    if isinstance(doc, list | tuple):
        return [strict(value) for value in doc]
    return doc


def print_json(doc: Any) -> None:
    """A document as strict JSON (RFC 8259: no NaN or Infinity, which strict parsers
    refuse)."""
    write_stdout(json.dumps(strict(doc), indent=2, allow_nan=False) + "\n")


def log_line(line: str) -> None:
    """One line of a pod's log on standard output, flushed (`logs -f`, `up --follow`)."""
    write_stdout(plain(line) + "\n")


def rank_line(rank: int | None, node: int, text: str, previous: bool = False) -> None:
    """A line of the merged `logs`: its global rank (none for the agent's own) and node."""
    who = (f"rank{rank} " if rank is not None else "") + f"node{node}"
    write_stdout(f"[{who}{' previous' if previous else ''}] {plain(text)}\n")


def say(text: str) -> None:
    """A line of ours on stderr (what a command did)."""
    print(plain(text), file=sys.stderr, flush=True)


def _views(snap: Snapshot) -> list[PodView]:
    job, pods, _ = snap
    layout = layout_of_job(job)
    return sorted(
        (pod_view(p, layout) for p in pods),
        key=lambda v: (v.replica, v.index is None, v.index or 0, v.name),
    )


def _title(name: str, snap: Snapshot) -> Text:
    job, _, state = snap
    title = f"{kind_of(job)} {name}: {state.state}" + (f" — {state.reason}" if state.reason else "")
    return cell(title)


def title(name: str, snap: Snapshot) -> Text:
    """The table's title line alone (`status` when the job's pods could not be read)."""
    return _title(name, snap)


def table(name: str, snap: Snapshot, max_rows: int | None = None) -> Table:
    """The job's pods, one row each; over ``max_rows`` pods a summary by phase with the
    pods that are not running named."""
    views = _views(snap)
    out = Table(title=_title(name, snap), title_justify="left")
    if max_rows is not None and len(views) > max_rows:
        for col in ("PHASE", "PODS", "NOT RUNNING"):
            out.add_column(col)
        phases = Counter(v.phase for v in views)
        for phase in sorted(phases):
            stuck = [v for v in views if v.phase == phase and (phase != "Running" or v.detail)]
            named = ", ".join(f"{v.name}{f' ({v.detail})' if v.detail else ''}" for v in stuck[:8])
            more = f" and {len(stuck) - 8} more" if len(stuck) > 8 else ""
            out.add_row(cell(phase), str(phases[phase]), cell(named + more))
        return out
    for col in ("POD", "REPLICA", "PHASE", "RESTARTS", "DETAIL"):
        out.add_column(col)
    for v in views:
        out.add_row(cell(v.name), cell(v.replica), cell(v.phase), str(v.restarts), cell(v.detail))
    return out


def _lines(name: str, snap: Snapshot, max_rows: int) -> list[str]:
    _, _, state = snap
    lines = [plain(f"{name}: {state.state}" + (f" ({state.reason})" if state.reason else ""))]
    views = sorted(_views(snap), key=lambda v: v.name)
    if len(views) > max_rows:
        phases = Counter(v.phase for v in views)
        lines.append("  " + ", ".join(f"{n} {plain(p)}" for p, n in sorted(phases.items())))
        views = [v for v in views if v.phase != "Running" or v.detail][:max_rows]
    for v in views:
        detail = f" {v.detail}" if v.detail else ""
        lines.append(plain(f"  {v.name}: {v.phase}, {counted(v.restarts, 'restart')}{detail}"))
    return lines


class WaitView:
    """A live table on a terminal; elsewhere (CI, pipes) a line block per change. Keeps the
    last snapshot, so that an interrupt can say what state the job was in."""

    def __init__(self, name: str, live: bool | None = None, max_rows: int = MAX_ROWS) -> None:
        self.name = name
        self.max_rows = max_rows
        self.console = Console(stderr=True, highlight=False)
        use_live = self.console.is_terminal if live is None else live
        self._live = Live(console=self.console, auto_refresh=False) if use_live else None
        self._last: list[str] = []
        self.last: Snapshot | None = None

    def __enter__(self) -> WaitView:
        if self._live:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._live.stop()

    def __call__(self, snap: Snapshot) -> None:
        self.last = snap
        if self._live:
            self._live.update(table(self.name, snap, self.max_rows), refresh=True)
            return
        lines = _lines(self.name, snap, self.max_rows)
        if lines != self._last:
            print("\n".join(lines), file=sys.stderr, flush=True)
            self._last = lines


class WaitViews:
    """The views one `up --wait` draws in turn (cluster.watch.Views); remembers the last
    snapshot any of them showed, for the line an interrupt ends with."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.last: Snapshot | None = None

    @contextlib.contextmanager
    def __call__(self, live: bool) -> Iterator[WaitView]:
        with WaitView(self.name, live=None if live else False) as view:
            try:
                yield view
            finally:
                self.last = view.last or self.last


def print_training(training: Progress | str | None) -> None:
    """`status`'s lines under the pods: rank 0's progress, or why it is unknown."""
    if training is None:
        return
    lines = [training] if isinstance(training, str) else training.lines()
    write_stdout("".join(plain(line) + "\n" for line in lines))


TRAINING = "training: "  # how the table's first training line starts


def _training_doc(training: Progress | str | None) -> Obj | None:
    """The ``training`` section: the table's lines and the line fields without their
    "training: " start, which the section's key says (YAML showed `training:` again under
    `training:`)."""
    if training is None or isinstance(training, str):
        return None if training is None else {"error": training.removeprefix(TRAINING)}
    doc = training.doc()
    if isinstance(doc.get("quiet"), str):
        doc["quiet"] = doc["quiet"].removeprefix(TRAINING)
    doc["lines"] = [line.removeprefix(TRAINING) for line in doc["lines"]]
    return doc


def status_doc(
    name: str, namespace: str, snap: Snapshot, training: Progress | str | None = None
) -> Obj:
    """`status -o json|yaml`: JSON and YAML escape what they hold; strings stay as the
    cluster wrote them (a reader of the document may want the exact text). ``training``:
    rank 0's progress as the table shows it (its ``error`` when unreadable)."""
    job, _, state = snap
    return {
        "name": name,
        "namespace": namespace,
        "state": state.state,
        "reason": state.reason,
        "conditions": ((job or {}).get("status") or {}).get("conditions") or [],
        "pods": [_pod_doc(pod_view(p, layout_of_job(job))) for p in snap[1]],
        "training": _training_doc(training),
    }


def _pod_doc(view: PodView) -> Obj:
    return {
        "name": view.name,
        "replica": view.replica,
        "index": view.index,
        "phase": view.phase,
        "restarts": view.restarts,
        "detail": view.detail,
    }


def list_table(rows: list[Obj]) -> Table:
    out = Table()
    for col in ("NAME", "KIND", "NAMESPACE", "STATE", "AGE", "NODES×GPUS"):
        out.add_column(col)
    for r in rows:
        size = f"{r['nodes']}×{r['gpus']}"
        out.add_row(*(cell(r[k]) for k in ("name", "kind", "namespace", "state", "age")), size)
    return out
