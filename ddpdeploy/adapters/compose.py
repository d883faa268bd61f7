"""docker-compose: run a rendered compose file as a project, stream its nodes' lines, tear
it down.

What runs is what the rendered file says: the file is written to a temporary project folder
and started by the compose CLI found here (`docker compose` v2, else `docker-compose`). The
Docker SDK only watches: it follows each container's stdout and stderr, reads exit codes,
and execs into a node to kill a worker. The project (containers, network, and the volume
unless kept) is always removed: on success, on failure and on Ctrl-C (use it as a context
manager).

`ComposeRun` is a smoke target (`ddpdeploy.smoke.target.SmokeTarget`), so `smoke --docker`
drives it with the same loop as local processes; its nodes come from the run plan.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdeploy.errors import OperationError
from ddpdeploy.render.output import to_yaml
from ddpdeploy.smoke.target import Line, Node, NoWorker, SmokeTarget
from ddpdeploy.streams import LineSplitter

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
NO_ENGINE_HINT = "; or run the job without Docker: ddpdeploy smoke --local"

# Run inside a node with python3 (every training image has it; pkill may be missing):
# SIGKILL the torchrun worker with LOCAL_RANK=argv[1] ("" = the highest); say which.
# A worker has LOCAL_RANK in its env and its parent (the agent) has not.
_KILL_WORKER = """
import os, signal, sys
def env(pid):
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
    except OSError:
        return {}
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)
def ppid(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
workers = {}
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        rank = env(p).get("LOCAL_RANK")
        if rank is not None and "LOCAL_RANK" not in env(ppid(p)):
            workers[int(rank)] = int(p)
    except (OSError, ValueError, IndexError):
        pass
want = int(sys.argv[1]) if sys.argv[1] else max(workers, default=None)
if want not in workers:
    sys.exit(f"no worker with LOCAL_RANK={want} (found {sorted(workers)})")
os.kill(workers[want], signal.SIGKILL)
print(f"local rank {want} (pid {workers[want]})")
"""


def compose_cli() -> list[str]:
    """`docker compose` (v2) when that plugin answers, else `docker-compose` (v1)."""
    docker = shutil.which("docker")
    if docker:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            probe = [docker, "compose", "version"]
            if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
                return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy:
        return [legacy]
    raise OperationError(
        "no compose CLI found: install the Docker Compose plugin (`docker compose`) or "
        "docker-compose; or run the job without Docker: ddpdeploy smoke --local"
    )


def engine() -> Any:
    """A Docker SDK client to a live engine, or one line saying there is none."""
    from ddpdeploy.adapters.docker_engine import connect

    return connect(NO_ENGINE_HINT)


@dataclass
class Container:
    """The container of one node (service) of the job, and what the engine says of it."""

    container: Any
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=300))
    status: str = "created"
    code: int | None = None  # exit code of its last exit
    restarts: int = 0

    @property
    def failed(self) -> bool:
        # Any non-zero exit fails a smoke run, also one Docker is about to restart.
        return (
            self.restarts > 0
            or self.status == "restarting"
            or (self.status in ("exited", "dead") and self.code != 0)
        )

    @property
    def exit_code(self) -> int | None:
        """None while it runs (and has not failed); else its last exit code."""
        if self.failed:
            return self.code or 1
        return self.code if self.status in ("exited", "dead") else None


class ComposeRun(SmokeTarget):
    """One rendered compose project, started under a unique project name."""

    def __init__(
        self,
        project: dict[str, Any],
        nodes: list[Node],
        name: str,
        keep_volume: bool = False,
        client: Any | None = None,
        cli: list[str] | None = None,
        release: str | None = None,
    ) -> None:
        super().__init__()
        self.release = release  # a chaos run's hold: the file, in every node, that ends it
        self.client = client or engine()
        self.cli = cli or compose_cli()
        # Unique per run: two runs of one job (or two users) never share containers.
        self.project_name = f"ddpdeploy-{name}-{secrets.token_hex(4)}"
        self.keep_volume = keep_volume
        self.nodes = nodes  # one service each, named like the node
        self.containers: dict[str, Container] = {}
        self._polled = 0.0
        self._stopped = False
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.project_name}-"))
        self.file = self.dir / "compose.yaml"
        self.file.write_text(to_yaml(project), encoding="utf-8")
        try:
            self._compose("up", "-d", "--no-build", timeout=600)
            self._attach()
        except BaseException:
            self.stop()
            raise

    def _compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cmd = [*self.cli, "-p", self.project_name, "-f", str(self.file), *args]
        try:
            # Own session: Ctrl-C in the terminal interrupts us, not a teardown under way.
            done = subprocess.run(
                cmd,
                cwd=self.dir,
                capture_output=True,
                text=True,
                timeout=timeout,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise OperationError(f"compose {args[0]} did not finish within {timeout:g}s") from None
        if done.returncode != 0:
            last = [t for t in done.stderr.splitlines() if t.strip()][-1:] or ["no output"]
            raise OperationError(f"compose {args[0]} failed: {last[0].strip()}")
        return done

    def _attach(self) -> None:
        found = {
            c.labels.get(SERVICE_LABEL): c
            for c in self.client.containers.list(all=True, filters=self._filter())
        }
        for node in self.nodes:
            if node.name not in found:
                raise OperationError(f"compose up started no container for {node.name}")
            self.containers[node.name] = Container(found[node.name])
            for stream in ("stdout", "stderr"):
                self._read_in_background(self._read, node.name, stream)

    def _filter(self) -> dict[str, str]:
        return {"label": f"{PROJECT_LABEL}={self.project_name}"}

    def _read(self, node: str, stream: str) -> None:
        # Errors end the stream quietly: the container went away (teardown).
        with contextlib.suppress(Exception):
            self._follow(node, stream)

    def _follow(self, node: str, stream: str) -> None:
        """Follow one stream of a container until it stops; whole lines only."""
        chunks = self.client.api.logs(
            self.containers[node].container.id,
            stdout=stream == "stdout",
            stderr=stream == "stderr",
            stream=True,
            follow=True,
        )
        lines = LineSplitter(b"")
        for chunk in chunks:
            for raw in lines.feed(chunk):
                self._put(node, stream, raw)
        for raw in lines.finish():
            self._put(node, stream, raw)

    def _put(self, node: str, stream: str, raw: bytes) -> None:
        text = raw.decode(errors="replace").rstrip("\r")
        self.containers[node].lines.append(text)
        self._feed(Line(node, stream, text))

    def poll(self, every: float = 0.5) -> None:
        """Refresh every node's state from the engine (at most once per ``every`` s)."""
        if time.monotonic() - self._polled < every:
            return
        self._polled = time.monotonic()
        for node in self.containers.values():
            node.container.reload()
            state = node.container.attrs["State"]
            node.status = state["Status"]
            node.restarts = int(node.container.attrs.get("RestartCount", 0))
            if node.status != "running" or node.restarts:
                node.code = int(state["ExitCode"])

    def exit_codes(self) -> dict[str, int | None]:
        self.poll()
        return {n.name: self.containers[n.name].exit_code for n in self.nodes}

    def node(self, name: str) -> Container:
        found = self.containers.get(name)
        if found is None:
            raise OperationError(f"no node {name} in project {self.project_name}")
        return found

    def tail(self, node: str) -> list[str]:
        return list(self.node(node).lines)

    def last_output_at(self, node: str) -> dict[int, float]:
        return {}  # the engine's log timestamps would do; torchrun's summary order suffices

    def kill_worker(self, node: str, local_rank: int | None = None) -> str:
        """SIGKILL one torchrun worker process in ``node`` (by default its highest local
        rank), as a crash would; torchrun then restarts the worker group. Then release the
        ranks that hold for the kill (a chaos run's hold), also when it failed."""
        try:
            return self._kill_worker(node, local_rank)
        finally:
            if self.release is not None:
                self._release_everywhere(self.release)

    def _release_everywhere(self, path: str) -> None:
        """Append one byte to ``path`` in every node's container at once (each has its own
        /tmp): the release of the current hold."""
        touch = ["python3", "-c", "import sys; open(sys.argv[1], 'ab').write(b'\\n')", path]
        threads = [
            threading.Thread(target=self._quiet_exec, args=(c.container, touch), daemon=True)
            for c in self.containers.values()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    @staticmethod
    def _quiet_exec(container: Any, cmd: list[str]) -> None:
        # A node that has already gone (it failed) has no rank left to release.
        with contextlib.suppress(Exception):
            container.exec_run(cmd)

    def _kill_worker(self, node: str, local_rank: int | None) -> str:
        rank = "" if local_rank is None else str(local_rank)
        container = self.node(node).container
        code, out = container.exec_run(["python3", "-c", _KILL_WORKER, rank])
        text = out.decode(errors="replace").strip()
        if code != 0:
            if "no worker with LOCAL_RANK" in text:
                raise NoWorker(f"--kill-at: node {node} had no worker process to kill")
            raise OperationError(f"killing a worker in {node} failed: {text[-300:]}")
        return text.splitlines()[-1]

    def leftovers(self) -> list[str]:
        """What of this project still exists on the engine (nothing after stop)."""
        flt = self._filter()
        found = [f"container {c.name}" for c in self.client.containers.list(all=True, filters=flt)]
        found += [f"network {n.name}" for n in self.client.networks.list(filters=flt)]
        if not self.keep_volume:
            found += [f"volume {v.name}" for v in self.client.volumes.list(filters=flt)]
        return found

    def volumes(self) -> list[str]:
        return [v.name for v in self.client.volumes.list(filters=self._filter())]

    def stop(self, grace: int = 5) -> None:
        """`compose down` (volumes too unless kept); then remove by label whatever down
        left (a failed or interrupted down), and the project folder. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        args = ["down", "--remove-orphans", "--timeout", str(grace)]
        if not self.keep_volume:
            args.append("--volumes")
        with contextlib.suppress(OperationError, OSError):
            self._compose(*args, timeout=120)
        self._remove_by_label()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _remove_by_label(self) -> None:
        flt = self._filter()
        for container in self.client.containers.list(all=True, filters=flt):
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)  # its anonymous volumes too
        for network in self.client.networks.list(filters=flt):
            with contextlib.suppress(Exception):
                network.remove()
        if not self.keep_volume:
            for volume in self.client.volumes.list(filters=flt):
                with contextlib.suppress(Exception):
                    volume.remove(force=True)
