"""docker-compose: run a rendered compose file as a project, stream its nodes' lines, tear
it down.

What runs is what the rendered file says: the file is written to a temporary project folder
and its objects are created through the Docker SDK as compose would create them
(`engine_plan`, `start_project`: compose's names and labels); a file with anything that path
does not read goes to the compose CLI found here (`docker compose` v2, else
`docker-compose`). The SDK also follows each container's stdout and stderr, reads exit
codes, and execs into a node to kill a worker. The project (containers, network, and the
volume unless kept) is always removed by its label: on success, on failure and on Ctrl-C
(use it as a context manager).

`ComposeRun` is a smoke target (`ddpdeploy.smoke.backend.RunBackend`), so `smoke --docker`
drives it with the same loop as local processes; its nodes come from the run plan.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdeploy.errors import OperationError
from ddpdeploy.render.output import to_yaml
from ddpdeploy.smoke.backend import Line, Node, NoWorker, RunBackend
from ddpdeploy.streams import LineSplitter

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
NO_ENGINE_HINT = "; or run the job without Docker: ddpdeploy smoke --local"
# Threads for the engine calls of one project: the SDK's connection pool holds 10, and each
# node's two log streams keep one each.
POOL = 4

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


class ComposeRun(RunBackend):
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
        # The SDK starts what it can read (see engine_plan); ``cli`` forces the compose CLI.
        self.plan = None if cli is not None else engine_plan(project)
        self.cli = cli if cli is not None or self.plan is not None else compose_cli()
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
            if self.plan is not None:
                start_project(self.client, self.project_name, project, self.plan)
            else:
                self._compose("up", "-d", "--no-build", timeout=600)
            self._attach()
        except BaseException:
            self.stop()
            raise

    def _compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        assert self.cli is not None
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
        # A stream ends when its container stops: ask the engine now, not a poll period on.
        self._polled = 0.0

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
        text: str = out.decode(errors="replace").strip()
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
        """Remove the project by its label, as `compose down --volumes` would (the volume
        unless kept): containers still running get SIGTERM and ``grace`` seconds, exited
        ones go at once. Ctrl-C meanwhile does not cut it short. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        # In a thread: a KeyboardInterrupt lands in the main thread, which waits on.
        teardown = threading.Thread(target=self._remove_by_label, args=(grace,), daemon=True)
        teardown.start()
        interrupted = False
        while teardown.is_alive():
            try:
                teardown.join()
            except KeyboardInterrupt:
                interrupted = True
        shutil.rmtree(self.dir, ignore_errors=True)
        if interrupted:
            raise KeyboardInterrupt

    def _remove_by_label(self, grace: int) -> None:
        flt = self._filter()
        with contextlib.suppress(Exception):
            containers = self.client.containers.list(all=True, filters=flt)
            with ThreadPoolExecutor(max_workers=POOL) as pool:
                list(pool.map(lambda c: _remove_container(c, grace), containers))
        with contextlib.suppress(Exception):
            for network in self.client.networks.list(filters=flt):
                with contextlib.suppress(Exception):
                    network.remove()
        if not self.keep_volume:
            with contextlib.suppress(Exception):
                for volume in self.client.volumes.list(filters=flt):
                    with contextlib.suppress(Exception):
                        volume.remove(force=True)


def _remove_container(container: Any, grace: int) -> None:
    with contextlib.suppress(Exception):
        if container.status in ("running", "restarting"):
            container.stop(timeout=grace)  # SIGTERM, then SIGKILL after grace
    with contextlib.suppress(Exception):
        container.remove(force=True, v=True)  # its anonymous volumes too


# ---- the project through the SDK --------------------------------------------------------
# docker-compose 1.29 is itself a Python program: its start-up, `up` and `down` cost ~2 s of
# a 2-node smoke run on 2 cores. The SDK creates the same objects (named and labelled as
# compose names them) from the rendered file, for the keys render.compose writes; a file
# with anything else goes to the compose CLI.

_PROJECT_KEYS = frozenset({"services", "networks", "volumes"})
_SERVICE_KEYS = frozenset(
    {
        "image",
        "hostname",
        "labels",
        "entrypoint",
        "environment",
        "networks",
        "network_mode",
        "restart",
        "stop_grace_period",
        "user",
        "cap_drop",
        "cap_add",
        "security_opt",
        "group_add",
        "read_only",
        "tmpfs",
        "shm_size",
        "volumes",
        "depends_on",
    }
)
_GRACE = re.compile(r"(\d+)s")
_DONE = "service_completed_successfully"
RDZV_HOST_ENV = "DDPDEPLOY_RDZV_HOST"  # the host the nodes' entrypoint waits to resolve


def _plain(value: Any) -> str | None:
    """Render's $-escaping undone ($$ -> $), as compose reads it; None when a lone $ would
    have compose interpolate from its environment (only the CLI does that)."""
    text = str(value)
    return None if "$" in text.replace("$$", "") else text.replace("$$", "$")


@dataclass(frozen=True)
class _Service:
    name: str
    create: dict[str, Any]  # create_container's arguments, host config as a dict
    host: dict[str, Any]  # create_host_config's arguments
    network: str | None  # the project network's key, None for network_mode none
    aliases: list[str]
    after: list[str]  # services that must have exited 0 before this one starts


class _Unsupported(Exception):
    """Something in the file only the compose CLI handles."""


def _need(value: str | None) -> str:
    if value is None:
        raise _Unsupported
    return value


def _restart(text: str) -> dict[str, Any]:
    name, _, count = text.partition(":")
    if name not in ("no", "on-failure", "always", "unless-stopped") or (
        count and not count.isdigit()
    ):
        raise _Unsupported
    return {"Name": name, "MaximumRetryCount": int(count or 0)}


def _networks(name: str, svc: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The service's one network and its aliases there (compose adds the service name)."""
    if svc.get("network_mode") is not None:
        if svc["network_mode"] != "none" or "networks" in svc:
            raise _Unsupported
        return None, []
    nets = svc.get("networks") or []
    if len(nets) != 1:
        raise _Unsupported
    (net,) = nets
    extra = (nets[net] or {}).get("aliases", []) if isinstance(nets, dict) else []
    return str(net), [name, *(_need(_plain(a)) for a in extra)]


def _environment(env: dict[str, Any]) -> dict[str, str]:
    # A name without a value (secretEnv) comes from the environment we run in, if set there.
    out = {}
    for key, value in env.items():
        if value is None:
            if key in os.environ:
                out[key] = os.environ[key]
        else:
            out[key] = _need(_plain(value))
    return out


def _host_config(svc: dict[str, Any]) -> dict[str, Any]:
    tmpfs = {}
    for entry in svc.get("tmpfs", []):
        path, _, options = str(entry).partition(":")
        tmpfs[path] = options
    volumes = []
    for mount in svc.get("volumes", []):
        if not isinstance(mount, dict) or set(mount) != {"type", "source", "target"}:
            raise _Unsupported
        if mount["type"] != "volume":
            raise _Unsupported
        volumes.append((str(mount["source"]), str(mount["target"])))
    return {
        "cap_drop": svc.get("cap_drop"),
        "cap_add": svc.get("cap_add"),
        "security_opt": svc.get("security_opt"),
        "group_add": svc.get("group_add"),
        "read_only": bool(svc.get("read_only", False)),
        "tmpfs": tmpfs or None,
        "shm_size": svc.get("shm_size"),
        "restart_policy": _restart(str(svc.get("restart", "no"))),
        "volumes": volumes,
    }


def _service(name: str, svc: dict[str, Any]) -> _Service:
    if set(svc) - _SERVICE_KEYS or "image" not in svc:
        raise _Unsupported
    grace = _GRACE.fullmatch(str(svc.get("stop_grace_period", "10s")))
    after = svc.get("depends_on") or {}
    if grace is None or any((after[d] or {}).get("condition") != _DONE for d in after):
        raise _Unsupported
    create: dict[str, Any] = {
        "image": _need(_plain(svc["image"])),
        "entrypoint": [_need(_plain(a)) for a in svc["entrypoint"]]
        if "entrypoint" in svc
        else None,
        "environment": _environment(svc.get("environment") or {}),
        "hostname": svc.get("hostname"),
        "user": svc.get("user"),
        "labels": {str(k): str(v) for k, v in (svc.get("labels") or {}).items()},
        "stop_timeout": int(grace[1]),
    }
    network, aliases = _networks(name, svc)
    return _Service(name, create, _host_config(svc), network, aliases, list(after))


def engine_plan(project: dict[str, Any]) -> list[_Service] | None:
    """The services in start order (dependencies first), or None when the file holds
    something only the compose CLI handles."""
    if set(project) - _PROJECT_KEYS:
        return None
    nets = project.get("networks") or {}
    if any(
        set(v or {}) - {"driver"} or (v or {}).get("driver", "bridge") != "bridge"
        for v in nets.values()
    ):
        return None
    if any(v for v in (project.get("volumes") or {}).values()):
        return None  # a volume with options: compose knows them
    try:
        services = [_service(n, s) for n, s in project["services"].items()]
    except (_Unsupported, KeyError, TypeError, ValueError):
        return None
    known = {s.name for s in services}
    helpers = {d for s in services for d in s.after}
    if helpers - known or any(s.after for s in services if s.name in helpers):
        return None  # a dependency that is missing, or one with its own: the CLI orders it
    # Dependencies first; render writes one level (the volume-init helper before the nodes).
    return sorted(services, key=lambda s: bool(s.after))


def _labels(project_name: str, **kind: str) -> dict[str, str]:
    return {PROJECT_LABEL: project_name, **{f"com.docker.compose.{k}": v for k, v in kind.items()}}


def _engine_error(what: str, exc: Exception) -> OperationError:
    reason = getattr(exc, "explanation", None) or str(exc)
    return OperationError(f"compose up failed: {what}: {' '.join(str(reason).split())[:300]}")


def _create(client: Any, project_name: str, service: _Service, project: dict[str, Any]) -> str:
    """Create one service's container as compose would (its name, labels, network alias)."""
    from docker.types import Mount

    api = client.api
    host = dict(service.host)
    host["mounts"] = [
        Mount(target, f"{project_name}_{source}", type="volume")
        for source, target in host.pop("volumes")
        if source in (project.get("volumes") or {})
    ]
    if len(host["mounts"]) != len(service.host["volumes"]):
        raise OperationError(f"compose up failed: {service.name} mounts an undeclared volume")
    net = None
    if service.network is None:
        host["network_mode"] = "none"
    else:
        net = f"{project_name}_{service.network}"
        host["network_mode"] = net
    create = dict(service.create)
    create["labels"] = {
        **create["labels"],
        **_labels(project_name, service=service.name, oneoff="False"),
        "com.docker.compose.container-number": "1",
    }
    networking = None
    if net is not None:
        endpoint = api.create_endpoint_config(aliases=service.aliases)
        networking = api.create_networking_config({net: endpoint})
    made = api.create_container(
        **create,
        name=f"{project_name}_{service.name}_1",
        host_config=api.create_host_config(**{k: v for k, v in host.items() if v is not None}),
        networking_config=networking,
    )
    return str(made["Id"])


def _ensure_image(client: Any, image: str) -> None:
    """Pull an image the engine lacks, as `compose up` does."""
    import docker.errors

    try:
        client.api.inspect_image(image)
    except docker.errors.ImageNotFound:
        client.images.pull(image)


def start_project(
    client: Any, project_name: str, project: dict[str, Any], services: list[_Service]
) -> None:
    """`compose up -d` through the SDK: network and volumes, helpers run to a zero exit,
    then every node created and started at once (in threads: each is a few API calls)."""
    import docker.errors
    import requests

    errors = (docker.errors.DockerException, requests.RequestException)
    try:
        for net, conf in (project.get("networks") or {}).items():
            client.api.create_network(
                f"{project_name}_{net}",
                driver=(conf or {}).get("driver", "bridge"),
                labels=_labels(project_name, network=net),
            )
        for vol in project.get("volumes") or {}:
            client.api.create_volume(
                f"{project_name}_{vol}", labels=_labels(project_name, volume=vol)
            )
    except errors as exc:
        raise _engine_error("creating the project", exc) from None
    for image in sorted({s.create["image"] for s in services}):
        try:
            _ensure_image(client, image)
        except errors as exc:
            raise _engine_error(f"image {image} is not here and pulling it failed", exc) from None
    helpers = [s for s in services if not s.after]
    helpers = [s for s in helpers if any(s.name in o.after for o in services)]
    for helper in helpers:
        _run_helper(client, project_name, project, helper)
    nodes = [s for s in services if s not in helpers]
    with ThreadPoolExecutor(max_workers=POOL) as pool:
        made = _each(pool, errors, nodes, lambda s: _create(client, project_name, s, project))
        # The rendezvous host first: a node whose entrypoint finds it unresolvable (not
        # running yet) sleeps a whole second before it asks again.
        hosts = {s.create["environment"].get(RDZV_HOST_ENV) for s in nodes}
        first = [s for s in nodes if hosts & set(s.aliases)]
        _each(pool, errors, first, lambda s: client.api.start(made[s.name]))
        rest = [s for s in nodes if s not in first]
        _each(pool, errors, rest, lambda s: client.api.start(made[s.name]))


def _each(
    pool: ThreadPoolExecutor,
    errors: tuple[type[Exception], ...],
    services: list[_Service],
    call: Callable[[_Service], Any],
) -> dict[str, Any]:
    """``call`` for every service at once; the first engine error as one line."""
    futures = {s.name: pool.submit(call, s) for s in services}
    out = {}
    for name, future in futures.items():
        try:
            out[name] = future.result()
        except errors as exc:
            raise _engine_error(name, exc) from None
    return out


def _run_helper(client: Any, project_name: str, project: dict[str, Any], helper: _Service) -> None:
    """A one-shot service the nodes depend on: start it, wait for exit 0."""
    import docker.errors
    import requests

    try:
        cid = _create(client, project_name, helper, project)
        client.api.start(cid)
        code = int(client.api.wait(cid, timeout=300)["StatusCode"])
        if code != 0:
            tail = client.api.logs(cid, tail=1).decode(errors="replace").strip()
            raise OperationError(
                f"compose up failed: {helper.name} exited with code {code}: {tail or 'no output'}"
            )
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise _engine_error(helper.name, exc) from None
