"""A `smoke --docker` run: the job's rendered compose file started as a project, its
nodes' lines streamed, the project torn down.

One path: what runs is what the rendered file says, created through the Docker SDK as
compose creates it (`engine_plan`, `start_project`: compose's names and labels; tests hold
the two equal against a real engine). A key it does not start is refused by name, never
handed to another tool. The SDK also follows each container's stdout and stderr, reads exit
codes, and execs into a node to kill a worker (`killworker`). The project (containers,
network, and the volume unless kept) is removed by its label on success, on failure and on
Ctrl-C (use it as a context manager); what could not be removed is named.

`ComposeRun` is a smoke target (`ddpdeploy.smoke.backend.RunBackend`), so `smoke --docker`
drives it with the same loop as local processes; its nodes come from the run plan.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdeploy.adapters.docker_engine import connect
from ddpdeploy.errors import OperationError
from ddpdeploy.paths import package_file
from ddpdeploy.render.output import to_yaml
from ddpdeploy.smoke.backend import Line, Node, NoWorker, RunBackend
from ddpdeploy.streams import LineSplitter
from ddpdeploy.text import clip

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
NO_ENGINE_HINT = "; or run the job without Docker: ddpdeploy smoke --local"
# Threads for the engine calls of one project: the SDK's connection pool holds 10, and each
# node's two log streams keep one each.
POOL = 4


def engine() -> Any:
    """A Docker SDK client to a live engine, or one line saying there is none."""

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
        release: str | None = None,
    ) -> None:
        super().__init__()
        self.release = release  # a chaos run's hold: the file, in every node, that ends it
        self.plan = engine_plan(project)
        self.client = client or engine()
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
            start_project(self.client, self.project_name, project, self.plan)
            self._attach()
        except BaseException:
            self.stop()
            raise

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
        self.containers[node].lines.append(clip(text))  # kept: bounded; shown live: whole
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
        script = package_file("smoke", "killworker.py").read_text()
        code, out = container.exec_run(["python3", "-c", script, rank])
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
        ones go at once. Ctrl-C meanwhile does not cut it short. Idempotent. Raises one
        OperationError naming what could not be removed, and how to remove it."""
        if self._stopped:
            return
        self._stopped = True
        failed: list[str] = []
        # In a thread: a KeyboardInterrupt lands in the main thread, which waits on.
        teardown = threading.Thread(target=self._remove_by_label, args=(grace, failed), daemon=True)
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
        if failed:
            raise OperationError(
                f"the compose project {self.project_name} was not removed whole: "
                f"{'; '.join(failed)}; remove what is left with `docker rm -f`, "
                f"`docker network rm` and `docker volume rm` (label {PROJECT_LABEL}="
                f"{self.project_name})"
            )

    def _remove_by_label(self, grace: int, failed: list[str]) -> None:
        """Every object of the project, containers first (a network or volume in use cannot
        go), each failure noted in ``failed`` and the rest removed all the same."""
        flt = self._filter()
        kinds: list[tuple[str, Any, dict[str, Any], Callable[[Any], object]]] = [
            (
                "container",
                self.client.containers,
                {"all": True},
                lambda c: _remove_container(c, grace),
            ),
            ("network", self.client.networks, {}, lambda n: n.remove()),
        ]
        if not self.keep_volume:
            kinds.append(("volume", self.client.volumes, {}, lambda v: v.remove(force=True)))
        for kind, collection, extra, remove in kinds:
            try:
                found = collection.list(filters=flt, **extra)
            except Exception as exc:  # noqa: BLE001 - any engine failure is reported
                failed.append(f"listing its {kind}s: {_reason(exc)}")
                continue
            with ThreadPoolExecutor(max_workers=POOL) as pool:
                names = [f"{kind} {obj.name}" for obj in found]
                done = pool.map(_attempt, names, [remove] * len(found), found)
                failed.extend(text for text in done if text)


def _attempt(what: str, call: Callable[[Any], object], obj: Any) -> str | None:
    """``call(obj)``; what failed, in a few words, or None."""
    try:
        call(obj)
    except Exception as exc:  # noqa: BLE001 - any engine failure is reported
        return f"{what}: {_reason(exc)}"
    return None


def _reason(exc: Exception) -> str:
    text = getattr(exc, "explanation", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())[:200]


def _remove_container(container: Any, grace: int) -> None:
    """SIGTERM, then SIGKILL after ``grace``; then remove it with its anonymous volumes.
    One that is already gone is no failure."""
    import docker.errors

    try:
        if container.status in ("running", "restarting"):
            container.stop(timeout=grace)
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass


# ---- the project through the SDK --------------------------------------------------------
# docker-compose 1.29 is itself a Python program: its start-up, `up` and `down` cost ~2 s of
# a 2-node smoke run on 2 cores. The SDK creates the same objects (named and labelled as
# compose names them) from the rendered file, for the keys smoke.compose writes on CPU;
# anything else in a file is refused by name (a render that writes a new key starts it
# here first: tests render every kind of job and start it).

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
_GRACE = re.compile(r"(\d+)s", re.ASCII)
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
    """Something in the file smoke --docker does not start; its text says what."""


def _need(value: str | None, what: str) -> str:
    if value is None:
        raise _Unsupported(f"{what} uses $VAR interpolation from the host's environment")
    return value


def _restart(name: str, text: str) -> dict[str, Any]:
    policy, _, count = text.partition(":")
    if policy not in ("no", "on-failure", "always", "unless-stopped") or (
        count and not count.isdigit()
    ):
        raise _Unsupported(f"service {name}: restart {text!r}")
    return {"Name": policy, "MaximumRetryCount": int(count or 0)}


def _networks(name: str, svc: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The service's one network and its aliases there (compose adds the service name)."""
    if svc.get("network_mode") is not None:
        if svc["network_mode"] != "none" or "networks" in svc:
            raise _Unsupported(f"service {name}: network_mode {svc['network_mode']!r}")
        return None, []
    nets = svc.get("networks") or []
    if len(nets) != 1:
        raise _Unsupported(f"service {name}: {len(nets)} networks (one is started)")
    (net,) = nets
    extra = (nets[net] or {}).get("aliases", []) if isinstance(nets, dict) else []
    where = f"service {name}'s network alias"
    return str(net), [name, *(_need(_plain(a), where) for a in extra)]


def _environment(name: str, env: dict[str, Any]) -> dict[str, str]:
    # A name without a value (secretEnv) comes from the environment we run in, if set there.
    out = {}
    for key, value in env.items():
        if value is None:
            if key in os.environ:
                out[key] = os.environ[key]
        else:
            out[key] = _need(_plain(value), f"service {name}'s {key}")
    return out


def _host_config(name: str, svc: dict[str, Any]) -> dict[str, Any]:
    tmpfs = {}
    for entry in svc.get("tmpfs", []):
        path, _, options = str(entry).partition(":")
        tmpfs[path] = options
    volumes = []
    for mount in svc.get("volumes", []):
        plain = isinstance(mount, dict) and set(mount) == {"type", "source", "target"}
        if not plain or mount["type"] != "volume":
            raise _Unsupported(f"service {name}: volume {mount!r} (named volumes are started)")
        volumes.append((str(mount["source"]), str(mount["target"])))
    return {
        "cap_drop": svc.get("cap_drop"),
        "cap_add": svc.get("cap_add"),
        "security_opt": svc.get("security_opt"),
        "group_add": svc.get("group_add"),
        "read_only": bool(svc.get("read_only", False)),
        "tmpfs": tmpfs or None,
        "shm_size": svc.get("shm_size"),
        "restart_policy": _restart(name, str(svc.get("restart", "no"))),
        "volumes": volumes,
    }


def _service(name: str, svc: dict[str, Any]) -> _Service:
    unknown = sorted(set(svc) - _SERVICE_KEYS)
    if unknown or "image" not in svc:
        raise _Unsupported(f"service {name}: {', '.join(unknown) or 'no image'}")
    grace = _GRACE.fullmatch(str(svc.get("stop_grace_period", "10s")))
    if grace is None:
        raise _Unsupported(f"service {name}: stop_grace_period {svc['stop_grace_period']!r}")
    after = svc.get("depends_on") or {}
    if any((after[d] or {}).get("condition") != _DONE for d in after):
        raise _Unsupported(f"service {name}: depends_on without {_DONE}")
    create: dict[str, Any] = {
        "image": _need(_plain(svc["image"]), f"service {name}'s image"),
        "entrypoint": [_need(_plain(a), f"service {name}'s entrypoint") for a in svc["entrypoint"]]
        if "entrypoint" in svc
        else None,
        "environment": _environment(name, svc.get("environment") or {}),
        "hostname": svc.get("hostname"),
        "user": svc.get("user"),
        "labels": {str(k): str(v) for k, v in (svc.get("labels") or {}).items()},
        "stop_timeout": int(grace[1]),
    }
    network, aliases = _networks(name, svc)
    return _Service(name, create, _host_config(name, svc), network, aliases, list(after))


def engine_plan(project: dict[str, Any]) -> list[_Service]:
    """The services in start order (dependencies first); OperationError naming what in the
    file smoke --docker does not start (a GPU file is one: smoke runs on CPU)."""
    try:
        return _plan(project)
    except _Unsupported as exc:
        raise OperationError(
            f"smoke --docker does not start this compose file: {exc}; `ddpdeploy compose` "
            "writes it for `docker compose up` instead"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise OperationError(f"smoke --docker cannot read this compose file ({exc!r})") from None


def _plan(project: dict[str, Any]) -> list[_Service]:
    extra = sorted(set(project) - _PROJECT_KEYS)
    if extra:
        raise _Unsupported(", ".join(extra))
    for net, conf in (project.get("networks") or {}).items():
        if set(conf or {}) - {"driver"} or (conf or {}).get("driver", "bridge") != "bridge":
            raise _Unsupported(f"network {net}: {conf!r} (a plain bridge is started)")
    for vol, conf in (project.get("volumes") or {}).items():
        if conf:
            raise _Unsupported(f"volume {vol}: {conf!r} (a plain named volume is started)")
    services = [_service(n, s) for n, s in project["services"].items()]
    known = {s.name for s in services}
    helpers = {d for s in services for d in s.after}
    if helpers - known or any(s.after for s in services if s.name in helpers):
        raise _Unsupported("depends_on deeper than one level, or on a missing service")
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
