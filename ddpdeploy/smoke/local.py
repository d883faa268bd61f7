"""Local processes: one torchrun agent per node on this host, as a smoke target; and the
run's checkpoint folder on this host.

Cleanup does not rely on process groups: torchrun starts each worker in a session of its
own, so signalling an agent's group misses its workers, and an agent that died (SIGKILL)
leaves them orphaned. Every agent therefore gets a per-run marker in its env, which its
workers inherit; `stop()` kills every process whose /proc/<pid>/environ carries it. A
process that clears its environment and leaves its session carries no marker: this process
is the run's child subreaper (smoke.reaper), so such an orphan is re-parented here, and
`stop()` also kills every descendant the run added.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.fs import linked_below, write_atomic
from ddpdeploy.paths import helpers_dir
from ddpdeploy.smoke import reaper, workspace
from ddpdeploy.smoke.backend import Line, Node, NoWorker, RunBackend
from ddpdeploy.smoke.launch import HOLD_RELEASE_ENV, HOLD_STEP_ENV, LocalNode
from ddpdeploy.text import clip

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

RUN_MARKER = "DDPDEPLOY_SMOKE_RUN"  # this run's id, in the env of its agents and workers
NODE_MARKER = "DDPDEPLOY_SMOKE_NODE"  # the node (hostname) an agent or worker belongs to
REAP_EVERY_S = 5.0  # how often a run reaps the orphans that exited (smoke.reaper)


@dataclass
class Agent:
    node: LocalNode
    proc: subprocess.Popen[str]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=300))


class LocalRun(RunBackend):
    """The agents of one local run; use as a context manager so they always stop."""

    def __init__(self, nodes: list[LocalNode], cwd: Path) -> None:
        super().__init__()
        self.marker = uuid.uuid4().hex
        # torchrun writes each worker's output here too (PET_LOG_DIR), one folder per node.
        self.log_dir = Path(tempfile.mkdtemp(prefix="ddpdeploy-smoke-"))
        self.agents: dict[str, Agent] = {}
        self.nodes = [Node(n.hostname, n.rank) for n in nodes]
        # torchrun sets OMP_NUM_THREADS=1 only for several processes per node; with one, each
        # node's process would take every core of this host that the nodes share (2 nodes on
        # 2 cores ran 4 threads, 1.3x slower). A share of the cores, as on nodes of their own.
        self.threads = max(1, len(os.sched_getaffinity(0)) // max(1, len(nodes)))
        # A chaos run's hold (ddpkit): the ranks wait at a step until this file grows a byte.
        held = any(HOLD_STEP_ENV in n.env for n in nodes)
        self.release = self.log_dir / "chaos-release" if held else None
        self._stopped = False
        self._next_reap = 0.0
        # Before any agent: what is ours already is not the run's; orphans come here.
        self._before = reaper.snapshot()
        self._subreaper = reaper.become_subreaper()
        try:
            for node in nodes:
                self._start(node, cwd)
        except BaseException:  # Ctrl-C or SIGTERM between two starts: none may outlive us
            self.stop()
            raise

    def _start(self, node: LocalNode, cwd: Path) -> None:
        ours = {
            "PET_LOG_DIR": str(self.log_dir / node.hostname),
            RUN_MARKER: self.marker,
            NODE_MARKER: node.hostname,
        }
        if self.release is not None:
            ours[HOLD_RELEASE_ENV] = str(self.release)
        env = {**os.environ, **node.env, **ours}
        if "OMP_NUM_THREADS" not in env and node.env.get("PET_NPROC_PER_NODE") == "1":
            env["OMP_NUM_THREADS"] = str(self.threads)
        env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH"))
        proc = subprocess.Popen(
            node.argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,  # Ctrl-C reaches the CLI only; stop() ends the rest
        )
        agent = Agent(node, proc)
        self.agents[node.hostname] = agent
        for stream in ("stdout", "stderr"):
            self._read_in_background(self._read, agent, stream)

    def _read(self, agent: Agent, stream: str) -> None:
        for raw in getattr(agent.proc, stream):
            text = raw.rstrip("\n")
            agent.tail.append(clip(text))  # kept: bounded; shown live: whole
            self._feed(Line(agent.node.hostname, stream, text))

    def exit_codes(self) -> dict[str, int | None]:
        now = time.monotonic()
        if self._subreaper and now >= self._next_reap:  # the run loop asks several times a second
            self._next_reap = now + REAP_EVERY_S
            earlier = {pid for pid, _ in self._before}  # the caller's own children
            reaper.reap_orphans(frozenset(a.proc.pid for a in self.agents.values()) | earlier)
        return {name: agent.proc.poll() for name, agent in self.agents.items()}

    def tail(self, node: str) -> list[str]:
        return list(self.agents[node].tail)

    def last_output_at(self, node: str) -> dict[int, float]:
        """Per local rank, the mtime of its newest log file in the node's latest attempt."""
        attempts = sorted(
            (self.log_dir / node).glob("*/attempt_*"),
            key=lambda p: int(p.name.split("_")[1]),
        )
        if not attempts:
            return {}
        out: dict[int, float] = {}
        for rank_dir in attempts[-1].iterdir():
            if rank_dir.name.isdigit():
                stamps = [f.stat().st_mtime for f in rank_dir.glob("std*.log")]
                if stamps:
                    out[int(rank_dir.name)] = max(stamps)
        return out

    def kill_worker(self, node: str, local_rank: int | None = None) -> str:
        """SIGKILL the live worker of ``node`` with ``local_rank`` (default: the highest);
        then release the ranks that hold for it (a chaos run's hold: one more byte in the
        release file), also when there was none to kill."""
        try:
            return self._kill_worker(node, local_rank)
        finally:
            if self.release is not None:
                with self.release.open("ab") as f:
                    f.write(b"\n")

    def _kill_worker(self, node: str, want: int | None) -> str:
        workers = [
            (int(env["LOCAL_RANK"]), pid)
            for pid, env in marked_processes(self.marker).items()
            if env.get(NODE_MARKER) == node and env.get("LOCAL_RANK", "").isdigit()
        ]
        if want is not None:
            workers = [w for w in workers if w[0] == want]
        if not workers:
            raise NoWorker(f"--kill-at: node {node} had no worker process to kill")
        local_rank, pid = max(workers)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return f"local rank {local_rank} (pid {pid})"

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every agent (torchrun passes it on to its workers), SIGKILL what is left
        after ``grace``, then every process of this run that is still alive."""
        if self._stopped:
            return
        self._stopped = True
        live = [a for a in self.agents.values() if a.proc.poll() is None]
        for agent in live:
            _signal_group(agent.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for agent in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.proc.wait(max(0.0, deadline - time.monotonic()))
        for agent in self.agents.values():
            _signal_group(agent.proc, signal.SIGKILL)
            agent.proc.wait()
        kill_marked(self.marker)
        left = reaper.kill_descendants(self._before)  # what left the marker behind (env -i)
        if self._subreaper:
            reaper.stop_subreaping()
        shutil.rmtree(self.log_dir, ignore_errors=True)
        if left:
            raise OperationError(survivors_line(left))


def worker_pythonpath(pythonpath: str | None) -> str:
    """The PYTHONPATH of a local run's workers, given the one they would inherit: `import
    ddpkit` works in a script as in the image (the trainer's folder first on the path)."""
    return os.pathsep.join(filter(None, [str(helpers_dir()), pythonpath]))


def check_module(cwd: Path, module: str, pythonpath: str | None) -> None:
    """Refuse in one line a command.module the workers could not run, before any starts:
    looked up as `python -m` in a worker would (the workspace ``cwd`` first on its path,
    then its PYTHONPATH, then what this interpreter has installed), without importing it or
    the packages above it (their code would run here)."""
    from importlib.machinery import PathFinder

    fix = "pkg/train.py in this folder is pkg.train"
    parts = module.split(".")
    path = [str(cwd), *(str(cwd / p) for p in worker_pythonpath(pythonpath).split(os.pathsep))]
    spec = PathFinder.find_spec(parts[0], [*path, *sys.path]) or _installed(parts[0])
    if spec is None:
        raise UserError(
            f"command.module: {module}: there is no module {parts[0]} in this workspace "
            f"({cwd}) or installed for {sys.executable}; name a module of the workspace "
            f"({fix}), or install its package"
        )
    for depth in range(1, len(parts)):
        parent, name = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
        where = spec.submodule_search_locations
        if where is None:  # a module: nothing below it
            raise UserError(
                f"command.module: {module}: {parent} is a module ({spec.origin}), not a "
                f"package, so there is no {name}; name the module itself ({fix})"
            )
        found = PathFinder.find_spec(name, list(where))
        if found is None:
            raise UserError(
                f"command.module: {module}: the package {parent} ({', '.join(where)}) has no "
                f"module {parts[depth]}; name one of its modules ({fix})"
            )
        spec = found
    where = spec.submodule_search_locations
    if where is not None and PathFinder.find_spec(f"{module}.__main__", list(where)) is None:
        raise UserError(
            f"command.module: {module} is a package with no __main__.py, which python -m "
            f"runs; add one, or name a module in it (e.g. {module}.train for {module}/train.py)"
        )


def _installed(name: str) -> ModuleSpec | None:
    """A top-level module the interpreter's own finders know (built in, frozen, or through
    an install's finder such as an editable one's); finding a top-level name imports
    nothing."""
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # in sys.modules without a spec (__main__)
        return None


def survivors_line(pids: list[int]) -> str:
    """One line for the run's processes that outlived SIGKILL: the kernel holds them (state
    D, in a system call that cannot be interrupted, such as I/O on a hung mount)."""
    shown = ", ".join(f"{pid} ({reaper.state(pid) or 'gone'})" for pid in pids[:8])
    more = f" and {len(pids) - 8} more" if len(pids) > 8 else ""
    listing = ",".join(str(pid) for pid in pids[:8])
    return (
        f"{len(pids)} process(es) of this run outlived SIGKILL for "
        f"{reaper.KILL_TIMEOUT_S:g} s: pid {shown}{more}; the kernel holds them (state D: "
        f"blocked in I/O, e.g. on a hung mount) and they end when it returns; see "
        f"`ps -o pid,stat,wchan:20,cmd -p {listing}`"
    )


def fresh_folder(path: Path, keep: bool) -> bool:
    """Make ``path`` (a run's checkpoint folder) exist; empty it unless ``keep``. True when
    it held something that was removed."""
    emptied = False
    if not keep and path.is_dir() and any(path.iterdir()):
        shutil.rmtree(path)
        emptied = True
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OperationError(f"cannot create checkpoint folder {path}: {exc.strerror}") from None
    return emptied


def workspace_listing(root: Path, ignored: frozenset[str]) -> dict[str, tuple[int, int]]:
    """Every regular file under ``root`` as relative path -> (mtime in ns, size), skipping
    folders named in ``ignored`` and never following symlinks."""
    out: dict[str, tuple[int, int]] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ignored]
        for name in files:
            path = Path(folder, name)
            try:
                stat = path.lstat()
            except OSError:  # gone while we looked
                continue
            if not path.is_symlink():
                out[str(path.relative_to(root))] = (stat.st_mtime_ns, stat.st_size)
    return out


def _own_streams(root: Path) -> frozenset[str]:
    """This process's stdout and stderr, where they are files in ``root`` (a shell's
    `> out.txt`): relative paths. They change during every run, and are not the job's."""
    out = set()
    for fd in (1, 2):
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))  # Linux; elsewhere: none known
            out.add(str(path.relative_to(root.resolve())))
        except (OSError, ValueError):
            continue
    return frozenset(out)


def _held_for_writing(root: Path) -> frozenset[str]:
    """Files in ``root`` (relative paths) that a live process holds open for writing (Linux;
    elsewhere: none known). After a run every process of it has ended, so such a file is
    someone else's: the `tee run.log` smoke's output is piped to, an editor, a logger."""
    base = root.resolve()
    out = set()
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                path = Path(os.readlink(f"/proc/{entry.name}/fd/{fd}"))
                if not path.is_relative_to(base):
                    continue
                info = Path(f"/proc/{entry.name}/fdinfo/{fd}").read_text()
            except OSError:
                continue
            flags = [ln.split()[1] for ln in info.splitlines() if ln.startswith("flags:")]
            if flags and int(flags[0], 8) & (os.O_WRONLY | os.O_RDWR):
                out.add(str(path.relative_to(base)))
    return frozenset(out)


def _signal_group(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def marked_processes(marker: str) -> dict[int, dict[str, str]]:
    """Live processes whose environment carries ``RUN_MARKER=marker``, with that env."""
    needle = f"{RUN_MARKER}={marker}".encode()
    found: dict[int, dict[str, str]] = {}
    if not os.path.isdir("/proc"):  # not Linux: only the agents' own SIGTERM handling helps
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        items = raw.split(b"\0")
        if needle in items:
            pairs = (i.decode(errors="replace").partition("=") for i in items if b"=" in i)
            found[int(entry.name)] = {k: v for k, _, v in pairs}
    return found


def kill_marked(marker: str, timeout: float = 10.0) -> None:
    """SIGKILL every process of the run until none is left (restarts can fork new ones)."""
    deadline = time.monotonic() + timeout
    while (pids := marked_processes(marker)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class WorkspaceRuns:
    """The files local runs write into the workspace (outside the checkpoint folder): what
    each run created is recorded (workspace.RECORD), and before the next run, of this smoke
    or a later one, those still unchanged are set aside (workspace.ASIDE). Our own stdout
    and stderr, when redirected to a file in the workspace, are neither."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.before: dict[str, tuple[int, int]] | None = None
        self.wrote: set[str] = set()  # every run's, for the read-only root's warning
        self.own = _own_streams(root)
        self.aside: Path | None = None  # where the last begin() set files aside

    def begin(self, keep: bool) -> list[str]:
        """Before a run: set aside what earlier runs wrote (unless ``keep``) and note the
        workspace as the run starts; the files set aside."""
        now = self._listing()
        recorded = self._recorded()
        if self.before is not None:
            recorded |= {p: now[p] for p in workspace.created(self.before, now, recorded)}
            self.wrote |= set(workspace.written(self.before, now))
        moved = [] if keep else workspace.unchanged(recorded, now)
        self.aside = None
        if moved:  # into a folder of its own: nothing set aside before is replaced
            self.aside = aside = self._aside_folder()
            for rel in moved:
                (aside / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.root / rel, aside / rel)
        self._record({} if not keep else recorded)
        self.before = self._listing() if moved else now
        return moved

    def end(self) -> list[str]:
        """After the last run: what every run wrote (sorted); what the last one wrote is
        recorded for the next smoke to set aside."""
        if self.before is None:
            return sorted(self.wrote)
        # What another process still writes (smoke's output through `| tee run.log`) is not
        # the run's: its processes have all ended.
        self.own |= _held_for_writing(self.root)
        now = self._listing()
        self.wrote -= self.own
        self.wrote |= set(workspace.written(self.before, now))
        recorded = self._recorded()
        made = workspace.created(self.before, now, recorded)
        self._record({**recorded, **{p: now[p] for p in made}})
        return sorted(self.wrote)

    @property
    def aside_rel(self) -> Path | None:
        """``aside`` relative to the workspace, as a note names it."""
        return self.aside.relative_to(self.root) if self.aside is not None else None

    def _aside_folder(self) -> Path:
        """A new folder under workspace.ASIDE, named by the time, for this set-aside."""
        linked_below(self.root, Path(workspace.ASIDE))  # never moved through a link
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for n in range(1000):
            folder = self.root / workspace.ASIDE / (stamp if n == 0 else f"{stamp}-{n}")
            try:
                folder.mkdir(parents=True)
            except FileExistsError:
                continue
            return folder
        raise OperationError(f"cannot make a folder under {workspace.ASIDE} to set files aside")

    def _listing(self) -> dict[str, tuple[int, int]]:
        listing = workspace_listing(self.root, workspace.IGNORED)
        return {p: s for p, s in listing.items() if p not in self.own}

    def _recorded(self) -> dict[str, tuple[int, int]]:
        return recorded(self.root)

    def _record(self, files: Mapping[str, tuple[int, int]]) -> None:
        linked_below(self.root, Path(workspace.RECORD).parent)
        (self.root / workspace.RECORD).parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({p: list(s) for p, s in sorted(files.items())}, indent=1) + "\n"
        write_atomic(self.root / workspace.RECORD, text.encode(), "smoke")


def recorded(root: Path) -> dict[str, tuple[int, int]]:
    """The files the last `smoke --local` run in the workspace ``root`` created there
    (workspace.RECORD): path -> (mtime in ns, size); empty when there is no record to trust."""
    try:
        doc = json.loads((root / workspace.RECORD).read_text())
    except (OSError, ValueError):
        return {}  # none yet, or not ours to trust: nothing is set aside for it
    if not isinstance(doc, dict):
        return {}
    return {
        str(p): (int(s[0]), int(s[1]))
        for p, s in doc.items()
        if isinstance(s, list)
        and len(s) == 2
        and all(isinstance(x, int) for x in s)
        and workspace.inside(str(p))
    }
