"""The Kubernetes API, through the official client: the only module that talks to a cluster.

Objects go in and come out as plain dicts. Every failure leaves as one OperationError line
that says what to do: unreachable API, rejected credentials, RBAC, missing kind, conflict.
The `kubernetes` package is imported lazily, so `render` never loads it, and only the parts
of it used here (`_load_client`). `KubeApi` is what the cluster room uses of a connection.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import queue
import re
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ddpdeploy import fs
from ddpdeploy.errors import ApiSilent, ApiUnreachable, LogUnavailable, OperationError, UserError
from ddpdeploy.obj import Obj
from ddpdeploy.streams import LineSplitter
from ddpdeploy.text import plain

FIELD_MANAGER = "ddpdeploy"
REQUEST_TIMEOUT = 30  # seconds to wait for an answer to an ordinary call
CONNECT_TIMEOUT = 10  # seconds to connect (TCP and TLS handshake)
# Every request (discovery included) gets this unless it says otherwise: a server that
# accepts and never answers must not hang a command.
DEFAULT_TIMEOUT = (CONNECT_TIMEOUT, REQUEST_TIMEOUT)
WATCH_SECONDS = 30  # the server ends a watch after this long; it is then resumed
FOLLOW_QUIET = 7 * 24 * 3600  # seconds a followed log may stay silent
# A followed log has no heartbeat of its own: after this many seconds without a line the
# API server is asked whether it still answers (GET /version, PING_TIMEOUT at most).
HEARTBEAT = 15
PING_TIMEOUT = 10
_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class MissingKind(OperationError):
    """The cluster does not serve this kind (its CRD is not installed)."""


class Forbidden(OperationError):
    """RBAC refused the call; preflight checks that only inform may skip on it."""


class Conflict(OperationError):
    """409: the object exists already (a create) or changed under us."""


@runtime_checkable
class KubeApi(Protocol):
    """What the cluster room asks of a cluster connection: `Kube`, or a test's stand-in
    (tests/fakekube.py). Objects are plain dicts; failures are OperationError lines."""

    @property
    def server(self) -> str:
        """The API server's URL, for lines that name it."""

    @property
    def default_namespace(self) -> str:
        """The kubeconfig context's namespace (the service account's in a pod), or default."""

    def has_kind(self, api_version: str, kind: str) -> bool:
        """Whether the cluster serves the kind (its CRD installed)."""

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        """The object, or None when it does not exist."""

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, labels: str | None = None
    ) -> builtins.list[Obj]:
        """The objects (in ``namespace``, None: every one) that match the label selector."""

    def listed(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        labels: str | None = None,
        fields: str | None = None,
    ) -> tuple[builtins.list[Obj], str]:
        """The objects and the list's resourceVersion (to watch from)."""

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        *,
        labels: str | None = None,
        name: str | None = None,
        since: str | None = None,
        seconds: int = ...,
        stop: threading.Event | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """("SYNC", [objects]), then (ADDED|MODIFIED|DELETED, object) as they come."""

    def apply(self, obj: Obj, dry_run: bool = False) -> Obj:
        """Server-side apply (dry run: validated, not stored)."""

    def create(self, obj: Obj, dry_run: bool = False) -> Obj:
        """Create; Conflict when it exists."""

    def create_as_applier(self, obj: Obj) -> Obj:
        """Create, with our fields recorded as applied (later applies do not conflict)."""

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None) -> bool:
        """Delete (dependents in the background); False when it was not there."""

    def logs(
        self,
        pod: str,
        namespace: str,
        container: str,
        follow: bool = False,
        tail: int | None = None,
        *,
        previous: bool = False,
        since_seconds: int | None = None,
        timestamps: bool = False,
        limit_bytes: int | None = None,
    ) -> Iterator[str]:
        """A pod's log lines as they come."""

    def exec_stream(
        self, pod: str, namespace: str, container: str, argv: builtins.list[str]
    ) -> Iterator[bytes]:
        """Run ``argv`` in a pod's container; its stdout as it comes."""


# --- loading the client ----------------------------------------------------------------
#
# `import kubernetes.<anything>` runs kubernetes/__init__.py, which imports every part of
# the client (config, dynamic, watch, stream, utils, leaderelection, informer); up to 36,
# kubernetes/client/__init__.py and client/models/__init__.py also import every generated
# API class and model (~700 modules), and in 37 `CoreV1Api` alone imports 250 models: most
# of a cluster command's start on a busy machine, for classes never used here (responses
# are read as JSON). So those packages get stand-ins: module objects with the real
# __path__, their __init__ not run, in which only the submodules imported here load. Any
# other name asked of a stand-in runs the real __init__ into it first, so that code
# elsewhere in the process that wants the whole client still gets it. Checked on kubernetes
# 29.0.0, 30.1.0, 31.0.0, 33.1.0, 35.0.0, 36.0.3 and 37.0.2 (python-legacy generated code up
# to 36, openapi-generator's python client from 37: both are called below).

_STAND_INS = (
    "kubernetes",
    "kubernetes.client",
    "kubernetes.client.api",
    "kubernetes.client.models",
    "kubernetes.utils",  # rest.py (37) imports utils.retry; utils/__init__ imports the rest
)
# What this module uses of the client, imported once (one error line if any is missing).
_USED = (
    "kubernetes.client.configuration",
    "kubernetes.client.exceptions",
    "kubernetes.client.rest",
    "kubernetes.client.api_client",
    "kubernetes.config.config_exception",
    "kubernetes.config",
    "kubernetes.dynamic",
    "kubernetes.dynamic.discovery",
    "kubernetes.dynamic.exceptions",
    "kubernetes.watch",
)
_LOADING = threading.RLock()


def _stand_in(name: str) -> types.ModuleType | None:
    """The package ``name`` as a module whose __init__ has not run (None: no such package)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return None
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def __getattr__(attr: str) -> Any:  # noqa: N807 - a module's own __getattr__
        # A submodule (`from kubernetes.client import rest` asks for one this way) loads
        # alone, under the import system's own locks; any other name loads the package as
        # it is, once.
        submodule = attr.isidentifier() and not attr.startswith("__")
        if submodule and importlib.util.find_spec(f"{name}.{attr}"):
            return importlib.import_module(f"{name}.{attr}")
        with _LOADING:
            if module.__dict__.get("__getattr__") is __getattr__:
                del module.__dict__["__getattr__"]
                loader.exec_module(module)
        return getattr(module, attr)

    module.__dict__["__getattr__"] = __getattr__
    return module


def _version_of(top: types.ModuleType) -> str:
    """kubernetes.__version__ without running kubernetes/__init__.py (the dynamic client's
    discovery cache records it)."""
    with contextlib.suppress(OSError, TypeError):
        text = Path(str(top.__file__)).read_text(encoding="utf-8")
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if found:
            return found[1]
    from importlib.metadata import version

    return version("kubernetes")


def _install_stand_ins() -> None:
    for name in _STAND_INS:
        module = _stand_in(name)
        if module is None:
            continue  # gone in this version: nothing imports it then
        parent, _, child = name.rpartition(".")
        sys.modules[name] = module
        if parent:
            setattr(sys.modules[parent], child, module)
        if name == "kubernetes":
            module.__dict__["__version__"] = _version_of(module)
    client = sys.modules.get("kubernetes.client")
    if client is None:
        raise ImportError("No module named 'kubernetes.client'")
    # The names the client's own modules take from kubernetes.client (kube_config,
    # incluster_config: `from kubernetes.client import ApiClient, Configuration`; watch:
    # `client.ApiClient()`): the objects its __init__ would bind.
    api_client = importlib.import_module("kubernetes.client.api_client")
    configuration = importlib.import_module("kubernetes.client.configuration")
    for attr, value in (
        ("ApiClient", api_client.ApiClient),
        ("Configuration", configuration.Configuration),
    ):
        setattr(client, attr, value)


def _load_client(more: tuple[str, ...] = ()) -> None:
    """Import what this module uses of the kubernetes client (and ``more`` of it), through
    stand-ins unless the process has the client already; one OperationError line if it
    cannot."""
    with _LOADING:
        before = set(sys.modules)
        try:
            if "kubernetes" not in sys.modules:
                _install_stand_ins()
            for name in (*_USED, *more):
                importlib.import_module(name)
        except (ImportError, AttributeError) as exc:
            installed = _installed_version()
            for name in set(sys.modules) - before:  # as it was: a plain import may still work
                if name == "kubernetes" or name.startswith("kubernetes."):
                    del sys.modules[name]
            if installed == "none found":
                raise OperationError(
                    "the kubernetes client is not installed (ddpdeploy needs it for the "
                    "cluster commands): pip install 'kubernetes>=29'"
                ) from None
            raise OperationError(
                f"the installed kubernetes client ({installed}) does not have "
                f"what ddpdeploy uses ({_one_line(exc, 200)}); install one it was checked "
                "with: pip install 'kubernetes>=29,<38'"
            ) from None


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    loaded = sys.modules.get("kubernetes")
    if loaded is not None and "__version__" in vars(loaded):  # (a stand-in's would load it)
        return f"version {vars(loaded)['__version__']}"
    try:
        return f"version {version('kubernetes')}"
    except PackageNotFoundError:
        return "none found"


def _status_message(body: Any) -> str | None:
    """The ``message`` of a Kubernetes Status object in ``body`` (JSON text or bytes)."""
    try:
        status = json.loads(body)
    except (TypeError, ValueError):
        return None
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) and message else None


def _json(response: Any) -> Obj:
    """A response read as JSON: plain dicts straight away, not the dynamic client's
    ResourceInstance tree (which a list of 128 pods takes a while to build and unbuild)."""
    doc: Obj = json.loads(response.data)
    return doc


def _as_obj(got: Any) -> Obj:
    """The dynamic client's ResourceInstance of one object, as a plain dict."""
    doc: Obj = got.to_dict()
    return doc


def _one_line(text: Any, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else f"{text[:limit]}…"


def _api_status(exc: Any) -> tuple[int | None, str]:
    """(HTTP status, one-line message) of an ApiException: the Status object's message, not
    the raw JSON or, for a websocket (exec) handshake, the response headers."""
    status, body = getattr(exc, "status", None), getattr(exc, "body", None)
    reason = str(getattr(exc, "reason", "") or "")
    # kubernetes.stream raises status 0 with the websocket error as its reason:
    # "Handshake status 403 Forbidden -+-+- {headers} -+-+- b'{...Status...}'".
    handshake = re.match(r"Handshake status (\d{3}) ?([^-]*)", reason, re.ASCII)
    if not status and handshake:
        status = int(handshake[1])
        tail = reason.rsplit(" -+-+- ", 1)[-1] if " -+-+- " in reason else ""
        with contextlib.suppress(ValueError, SyntaxError, MemoryError, RecursionError):
            body = ast.literal_eval(tail) if tail.startswith(("b'", 'b"')) else tail
        reason = handshake[2].strip() or reason
    summary = getattr(exc, "summary", None)
    message = _status_message(body)
    if message is None and callable(summary):
        message = summary()
    if message is None:
        message = body.decode(errors="replace") if isinstance(body, bytes) else body
    return status, _one_line(message or reason or exc)


def _api_message(exc: Any) -> str:
    return _api_status(exc)[1]


class _ClientLog(logging.Handler):
    """The kubernetes client reports some failures only by ``logging.error`` on the root
    logger (a failing exec credential plugin, a corrupt discovery cache), which also puts a
    stderr handler there on first use: printed raw, as `ERROR:root:…`. Held here instead,
    for the one line of ours that says what happened."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # a record that cannot format is dropped
            self.messages = [*self.messages[-19:], _one_line(record.getMessage())]

    def exec_failure(self) -> str | None:
        return next((m for m in reversed(self.messages) if m.startswith("exec:")), None)


_CLIENT_LOG = _ClientLog()


def _hold_client_log() -> _ClientLog:
    """The held log, emptied: what it holds from now on is this connection's. On a root
    logger with no handler, ours is the one that keeps the client's lines off stderr; an
    application that set up logging keeps its handlers (and sees the lines there too)."""
    root = logging.getLogger()
    if _CLIENT_LOG not in root.handlers:
        root.addHandler(_CLIENT_LOG)
    _CLIENT_LOG.messages = []
    return _CLIENT_LOG


def _discovery_cache(host: str) -> str:
    """Per-user, per-server discovery cache (kubectl keeps one too), not a file in /tmp.

    A folder that cannot be made (read-only or not ours) is no failure: the client finds
    no file there, discovers afresh and cannot write it, as with no cache at all."""
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:  # no $HOME and no passwd entry
        base = Path("/nonexistent")
    folder = base / "ddpdeploy" / "discovery"
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    return str(folder / f"{hashlib.sha256(host.encode()).hexdigest()[:16]}.json")


def bounded(call: Callable[[], Any], seconds: float, what: str) -> Any:
    """``call()``'s result, or TimeoutError after ``seconds``: kubernetes.stream opens its
    exec websocket with no timeout at all (its connect passes none to websocket-client), so
    a server that accepts and never answers would hang the command for ever. The opening
    thread is left behind on a timeout; the command ends with the error anyway."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"ddpdeploy {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


def _default_timeout(rest: Any) -> None:
    """Give every request through ``rest`` DEFAULT_TIMEOUT unless it names its own."""
    request = rest.request

    def bounded(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        return request(*args, _request_timeout=_request_timeout or DEFAULT_TIMEOUT, **kwargs)

    rest.request = bounded


def _exec_failed(message: str) -> str:
    return (
        f"the kubeconfig user's exec credential plugin failed ({message}); run it by hand "
        "(or log in again) and check users[].user.exec in the kubeconfig"
    )


_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


# Real kubeconfigs are KBs (a few per cluster, certificates included); the client reads a
# file whole and parses it several times, so /dev/zero or a 50 MB file took all memory or
# minutes, and a FIFO blocked forever.
KUBECONFIG_LIMIT = 4 << 20
_KUBECONFIG_FIX = {  # where the path came from -> how to give another
    "--kubeconfig": "point --kubeconfig at a kubeconfig file",
    "KUBECONFIG": "fix KUBECONFIG or pass --kubeconfig FILE",
    "kubeconfig": "move it away or pass --kubeconfig FILE",  # ~/.kube/config
}


def _load_kubeconfig(cfg: Any, kubeconfig: str | None, context: str | None) -> Any:
    """What ``config.load_kube_config`` does, with the loader kept: its active context gives
    the namespace, where ``list_kube_config_contexts`` parsed every file again (twice with
    --context: a 4 MiB file took 40 s)."""
    from kubernetes.config import kube_config

    merged = kube_config.KubeConfigMerger(kubeconfig or kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    if merged.config is None:
        raise kube_config.ConfigException("Invalid kube-config file. No configuration found.")
    context = context or None  # kubectl reads an empty --context as none given
    _check_context(merged.config, context, kubeconfig)
    loader = kube_config.KubeConfigLoader(
        config_dict=merged.config,
        config_base_path=None,
        active_context=context,
        config_persister=merged.save_changes,  # an exec/auth-provider token refresh
    )
    loader.load_and_set(cfg)
    return loader.current_context


CONTEXTS_NAMED = 10  # a missing context's line names at most this many of the others


def _check_context(config: Any, context: str | None, kubeconfig: str | None) -> None:
    """The context asked for (--context, else the file's current-context) must be in the
    merged kubeconfig: the client says only "Expected object with name X", not which
    contexts there are. A UserError naming them (at most CONTEXTS_NAMED) and the current
    one; no current-context (the client says only "Expected key current-context") is
    named the same way."""
    doc = getattr(config, "value", config)
    if not isinstance(doc, dict):
        return
    current = doc.get("current-context")
    wanted = context if context is not None else current
    entries = doc.get("contexts")
    if not isinstance(entries, list) or (wanted is not None and not isinstance(wanted, str)):
        return
    names = []
    for entry in entries:
        entry = getattr(entry, "value", entry)
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            names.append(entry["name"])
    if wanted in names:
        return
    shown_names = ", ".join(plain(n) for n in names[:CONTEXTS_NAMED])
    more = f" and {len(names) - CONTEXTS_NAMED} more" if len(names) > CONTEXTS_NAMED else ""
    has = f"it has {len(names)}: {shown_names}{more}" if names else "it has no contexts"
    now = f"; current-context: {plain(current)}" if isinstance(current, str) and current else ""
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if not wanted:
        raise UserError(
            f"kubeconfig ({plain(where)}): no current-context is set; {has}; pass --context "
            "NAME or set one (`kubectl config use-context NAME`)"
        )
    if context is not None:
        raise UserError(
            f"--context: no context {plain(context)} in the kubeconfig ({plain(where)}); "
            f"{has}{now}; pass one of those (`kubectl config get-contexts` lists them)"
        )
    raise UserError(
        f"kubeconfig ({plain(where)}): its current-context {plain(wanted)} is not one of its "
        f"contexts; {has}; pass --context NAME or fix current-context"
    )


def _check_kubeconfig(path: Path, label: str, required: bool) -> None:
    """Before the client reads ``path``: a regular file of at most KUBECONFIG_LIMIT bytes
    (else one UserError line naming ``label``, the flag or variable it came from), holding a
    YAML mapping (else one line naming it: the client raises a bare TypeError or YAMLError).
    A missing file: one line when ``required`` (--kubeconfig), else skipped as kubectl does."""
    import yaml

    where = f"--kubeconfig {path}" if required else f"kubeconfig {path}"
    try:
        with fs.open_regular(path, label) as fh:  # O_NONBLOCK: a FIFO is refused, not waited on
            text = fs.read_at_most(fh, KUBECONFIG_LIMIT)
    except FileNotFoundError:
        if required:  # the client would say only "No configuration found"
            raise UserError(f"{where}: no such file; point --kubeconfig at one") from None
        return  # one missing from $KUBECONFIG is skipped, as kubectl does
    except fs.NotRegularFile as exc:
        raise UserError(f"{exc}; {_KUBECONFIG_FIX[label]}") from None
    except OSError:
        return  # unreadable: the client says so
    if len(text) > KUBECONFIG_LIMIT:
        raise UserError(
            f"{label}: {path} is larger than {KUBECONFIG_LIMIT >> 20} MiB; is it a kubeconfig?"
        )
    try:
        # libyaml's reader when there is one: the client parses the file again anyway.
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise OperationError(
            f"{where} is not valid YAML{at} ({_one_line(problem, 120)}); fix it or point "
            "--kubeconfig at a working one"
        ) from None
    except RecursionError:
        raise OperationError(f"{where} is nested too deep to read; fix it") from None
    if doc is not None and not isinstance(doc, dict):
        raise OperationError(
            f"{where} holds {_KINDS.get(type(doc), 'a scalar')}, not a kubeconfig mapping "
            "(apiVersion, clusters, users, contexts); fix it or point --kubeconfig at a "
            "working one"
        )


def _to_stderr(line: str) -> None:
    print(plain(line), file=sys.stderr, flush=True)


def _quiet_unverified_https(server: str) -> None:
    """urllib3 warns on every request to a server whose certificate it does not check
    (InsecureRequestWarning, always shown): silenced for this server's host only, as the
    message names it; the connection says so once, in a line of ours."""
    from urllib.parse import urlsplit

    from urllib3.exceptions import InsecureRequestWarning

    with contextlib.suppress(ValueError):
        host = urlsplit(server).hostname
        if host:
            warnings.filterwarnings(
                "ignore",
                # urllib3 names the host as it connects to it (an IPv6 one in brackets or not)
                message="Unverified HTTPS request is being made to host "
                rf"'\[?{re.escape(host)}\]?'",
                category=InsecureRequestWarning,
            )


def _group_path(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def _discoverer() -> type:
    """The client's lazy discoverer, except that a kind missing from the cache costs one
    request (its group version's resource list) rather than a full re-discovery of every
    API group: `status`, `down` and `list` look up kinds the cluster may not serve (a CRD
    not installed) on every run."""
    from kubernetes.dynamic.discovery import LazyDiscoverer
    from kubernetes.dynamic.exceptions import NotFoundError

    class Discoverer(LazyDiscoverer):  # type: ignore[misc]
        _wanted: dict[str, Any] | None = None

        def search(self, **kwargs: Any) -> Any:
            self._wanted = kwargs
            try:
                return super().search(**kwargs)
            finally:
                self._wanted = None

        def invalidate_cache(self) -> None:
            wanted = self._wanted
            if wanted and wanted.get("api_version") and wanted.get("kind"):
                path = _group_path(wanted["api_version"])
                try:
                    got = self.client.request("get", path, serialize=False)
                    kinds = {r.get("kind") for r in json.loads(got.data).get("resources") or []}
                except NotFoundError:
                    kinds = set()
                if wanted["kind"] not in kinds:
                    return  # the server has no such kind either: the cache stands
            super().invalidate_cache()  # stale (a CRD installed since): discover afresh

    return Discoverer


_AUTH = ["BearerToken"]  # the generated methods' auth setting: the kubeconfig's token


def _quote(segment: str) -> str:
    from urllib.parse import quote

    return quote(segment, safe="")


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class _PodExec:
    """What kubernetes.stream.stream() needs of an API method: bound to an object with an
    ``api_client``, whose request (``call_api`` from 37, ``request`` before) it swaps for
    its websocket while the method runs. Builds the request as CoreV1Api's
    connect_get_namespaced_pod_exec does, without the generated module and its models."""

    PATH = "/api/v1/namespaces/{namespace}/pods/{name}/exec"

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def connect_get_namespaced_pod_exec(
        self,
        name: str,
        namespace: str,
        *,
        command: builtins.list[str],
        container: str,
        stdin: bool,
        stdout: bool,
        stderr: bool,
        tty: bool,
        _preload_content: bool = True,
        _request_timeout: Any = None,
        binary: bool | None = None,
    ) -> Any:
        if binary is not None:  # stream() takes it for itself from 30 on
            raise OperationError(
                f"running {command[0]} in pod {name}: the installed kubernetes client "
                f"({_installed_version()}) streams exec output only as text; install "
                "kubernetes>=30"
            )
        flags = {"stderr": stderr, "stdin": stdin, "stdout": stdout, "tty": tty}
        query: builtins.list[tuple[str, Any]] = [("command", command), ("container", container)]
        query += [(k, _query_value(v)) for k, v in flags.items()]
        paths = {"name": name, "namespace": namespace}
        api = self.api_client
        if hasattr(api, "param_serialize"):  # 37 on
            request = api.param_serialize(
                "GET",
                self.PATH,
                path_params=paths,
                query_params=query,
                header_params={"Accept": "*/*"},
                auth_settings=_AUTH,
                collection_formats={"command": "multi"},
            )
            # stream() answers with the websocket client as `response`; an HTTP error is
            # its ApiException (status 0, the handshake's status in the reason).
            return api.call_api(*request, _request_timeout=_request_timeout).response
        return api.call_api(
            self.PATH,
            "GET",
            path_params=paths,
            query_params=query,
            header_params={"Accept": "*/*"},
            auth_settings=_AUTH,
            collection_formats={"command": "multi"},
            _return_http_data_only=True,
            _preload_content=_preload_content,
            _request_timeout=_request_timeout,
        )


class Kube:
    """One cluster, as the kubeconfig (or the pod's service account) describes it.

    Made without a request: the kubeconfig is read (credentials, server, namespace; an exec
    plugin runs), and the API is first asked (discovery, from the cache when it has the
    kind) by the first call that needs it, which also raises the connection's errors.
    ``warn`` gets our one line about the connection (a kubeconfig that skips TLS
    verification), before the first request; stderr by default."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        *,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        _load_client()
        from kubernetes.client.api_client import ApiClient
        from kubernetes.client.configuration import Configuration
        from kubernetes.config.config_exception import ConfigException

        self._log = _hold_client_log()
        cfg = Configuration()
        try:
            self.default_namespace: str = self._load(cfg, kubeconfig, context)
        except (ConfigException, OSError, ValueError) as exc:
            raise OperationError(
                f"no usable cluster credentials ({_one_line(exc)}); pass "
                "--kubeconfig FILE or --context NAME, or set KUBECONFIG"
            ) from None
        failed = self._log.exec_failure()
        if failed:
            raise OperationError(_exec_failed(failed)) from None
        cfg.retries = 1
        self.server: str = cfg.host
        self._api = ApiClient(cfg)
        _default_timeout(self._api.rest_client)
        self._cache = _discovery_cache(cfg.host)
        self._kinds: dict[tuple[str, str], Any] = {}  # a kind's resource, or None: not served
        self._dyn_client: Any = None
        self._connecting = threading.RLock()
        # insecure-skip-tls-verify: said once, by us, before the first request
        self._tls_warning_due = not cfg.verify_ssl and self.server.lower().startswith("https:")
        self._warn = warn or _to_stderr
        if self._tls_warning_due:
            _quiet_unverified_https(self.server)

    def _first_request(self) -> None:
        """Before the connection's first request: the warning, once."""
        with self._connecting:
            if not self._tls_warning_due:
                return
            self._tls_warning_due = False
            self._warn(
                f"warning: the kubeconfig skips TLS verification for {self.server} "
                "(insecure-skip-tls-verify); the server's identity is not checked"
            )

    @property
    def _dyn(self) -> Any:
        """The dynamic client, made on first use: discovery (the cache file, or the API's
        resource lists) is the connection's first request."""
        with self._connecting:
            if self._dyn_client is None:
                self._first_request()
                try:
                    with self.errors("connecting"):
                        self._dyn_client = self._discover(self._cache)
                except Forbidden as exc:
                    # Not a refusal a preflight check may skip: the connection failed.
                    raise OperationError(str(exc)) from None
            return self._dyn_client

    def _discover(self, cache: str) -> Any:
        """The dynamic client; a cache file it cannot use (the client re-discovers by itself
        after a JSON error, but not after a well-formed file of the wrong shape) is dropped
        and discovery runs afresh."""
        from kubernetes import dynamic

        found = _discoverer()
        try:
            return dynamic.DynamicClient(self._api, cache_file=cache, discoverer=found)
        except (KeyError, TypeError, AttributeError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(cache)
            return dynamic.DynamicClient(self._api, cache_file=cache, discoverer=found)

    @staticmethod
    def _load(cfg: Any, kubeconfig: str | None, context: str | None) -> str:
        """Load credentials into ``cfg``; return the context's namespace (or "default")."""
        from kubernetes import config

        env = os.environ.get("KUBECONFIG", "")
        default = Path("~/.kube/config").expanduser()
        if kubeconfig or context or env or default.exists() or not _SA_DIR.is_dir():
            files = [kubeconfig] if kubeconfig else env.split(os.pathsep) if env else [default]
            label = "--kubeconfig" if kubeconfig else "KUBECONFIG" if env else "kubeconfig"
            # The one place every cluster verb's kubeconfig passes, before the client reads
            # it; the paths as the client takes them (empty entries skipped, ~ expanded).
            for name in filter(None, map(str, files)):
                _check_kubeconfig(Path(name).expanduser(), label, required=bool(kubeconfig))
            try:
                active = _load_kubeconfig(cfg, kubeconfig, context)
                namespace = (active or {}).get("context", {}).get("namespace")
            except (TypeError, AttributeError, KeyError) as exc:
                # A mapping whose entries have the wrong shape (`users: 5`, a context
                # that is a string): the client trips over it.
                raise OperationError(
                    f"the kubeconfig ({', '.join(map(str, files))}) is malformed "
                    f"({_one_line(exc)}); compare it with `kubectl config view`"
                ) from None
            if namespace is not None and not isinstance(namespace, str):
                raise OperationError(
                    f"the kubeconfig context's namespace is {_one_line(repr(namespace), 60)}, "
                    "not a name; fix contexts[].context.namespace or pass -n"
                )
            return namespace or "default"
        config.load_incluster_config(client_configuration=cfg)
        return (_SA_DIR / "namespace").read_text().strip() or "default"

    @contextlib.contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """Turn the client's exceptions into one line naming ``what`` failed and the fix."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            yield
        except ApiException as exc:
            if isinstance(exc.__context__, KeyboardInterrupt):
                # kubernetes.stream wraps even Ctrl-C/SIGTERM in ApiException(status=0).
                raise exc.__context__ from None
            raise self._api_failure(what, exc) from None
        except (HTTPError, OSError) as exc:
            raise self._unreachable(what, getattr(exc, "reason", None) or exc) from None

    def _unreachable(self, what: str, reason: Any) -> OperationError:
        return ApiUnreachable(
            f"{what}: cannot reach the Kubernetes API at {self.server} "
            f"({_one_line(reason, 200)}); check that the cluster is up and "
            "that the kubeconfig context (--context) points at it"
        )

    def _api_failure(self, what: str, exc: Any) -> OperationError:
        status, message = _api_status(exc)
        if not status:  # kubernetes.stream's status 0: no HTTP answer (refused, reset, TLS)
            return self._unreachable(what, message)
        failed = self._log.exec_failure()
        # Forbidden still, so that checks which only inform skip as on any 403.
        refused = Forbidden if status == 403 else OperationError
        if status in (401, 403) and failed:
            # The plugin failed (on a token refresh): the call went out without credentials.
            return refused(f"{what}: {_exec_failed(failed)}")
        if status == 403 and "system:anonymous" in message:
            return Forbidden(
                f"{what}: the API server at {self.server} got no credentials (it saw "
                "system:anonymous); give the kubeconfig user a token, certificate or exec "
                "plugin, or pick another context (--context)"
            )
        if status == 401:
            return OperationError(
                f"{what}: the API server at {self.server} rejected the credentials (expired "
                "or invalid); log in again or refresh the kubeconfig"
            )
        if status == 403 and " cannot " not in message:
            # Not RBAC ("User x cannot create ..."): an admission policy such as a LimitRange.
            return OperationError(f"{what}: the API server refused it: {message}")
        if status == 403:
            return Forbidden(
                f"{what}: forbidden: {message}; ask a cluster admin for RBAC rights, or use a "
                "namespace you may use (-n)"
            )
        if status == 409:
            return Conflict(f"{what}: conflict: {message}")
        if status in (400, 422):
            return OperationError(f"{what}: the API server refused it: {message}")
        return OperationError(f"{what}: API error {status}: {message}")

    def resource(self, api_version: str, kind: str) -> Any:
        """The kind's API resource (looked up once per connection); MissingKind when the
        cluster does not serve it."""
        key = (api_version, kind)
        if key not in self._kinds:
            try:
                self._kinds[key] = self._resource(api_version, kind)
            except MissingKind:
                self._kinds[key] = None
        if self._kinds[key] is None:
            raise MissingKind(
                f"the cluster does not serve {kind} ({api_version}); its CRD is not installed"
            )
        return self._kinds[key]

    def _resource(self, api_version: str, kind: str) -> Any:
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        with self.errors(f"looking up {kind}"):
            try:
                try:
                    return self._dyn.resources.get(api_version=api_version, kind=kind)
                except (KeyError, TypeError, AttributeError, ValueError):
                    # A cache file of the wrong shape trips the search: discover afresh.
                    self._dyn.resources.invalidate_cache()
                    return self._dyn.resources.get(api_version=api_version, kind=kind)
            except ResourceNotFoundError:
                raise MissingKind(
                    f"the cluster does not serve {kind} ({api_version}); its CRD is not installed"
                ) from None

    def has_kind(self, api_version: str, kind: str) -> bool:
        try:
            self.resource(api_version, kind)
        except MissingKind:
            return False
        return True

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        """The object, or None when it does not exist."""
        from kubernetes.dynamic.exceptions import NotFoundError

        res = self.resource(api_version, kind)
        with self.errors(f"reading {kind} {name}"):
            try:
                got = res.get(
                    name=name,
                    namespace=namespace,
                    serialize=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            except NotFoundError:
                return None
            return _json(got)

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, labels: str | None = None
    ) -> list[Obj]:
        return self.listed(api_version, kind, namespace, labels)[0]

    def listed(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        labels: str | None = None,
        fields: str | None = None,
    ) -> tuple[builtins.list[Obj], str]:
        """The objects, in one list call, and the list's resourceVersion (to watch from)."""
        res = self.resource(api_version, kind)
        with self.errors(f"listing {res.kind}"):
            got = _json(
                res.get(
                    namespace=namespace,
                    label_selector=labels,
                    field_selector=fields,
                    serialize=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            )
        items = got.get("items") or []
        for item in items:  # a list's items carry no kind of their own
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items, (got.get("metadata") or {}).get("resourceVersion") or ""

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        *,
        labels: str | None = None,
        name: str | None = None,
        since: str | None = None,
        seconds: int = WATCH_SECONDS,
        stop: threading.Event | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """The objects (by label selector, or the one ``name``), then their changes, as
        they come: ``("SYNC", [objects])`` from a list, then ``(ADDED|MODIFIED|DELETED,
        object)``. The watch starts at the list's resourceVersion (or ``since``); one that
        expired (410 Gone) is a fresh SYNC. The server ends each watch after ``seconds``
        and it resumes where it was; a connection silent for longer is an error. Ends when
        ``stop`` is set (at the next event or the end of a watch)."""
        from kubernetes.client.exceptions import ApiException

        res = self.resource(api_version, kind)
        fields = f"metadata.name={name}" if name else None
        version = since
        while stop is None or not stop.is_set():
            if version is None:
                items, version = self.listed(api_version, kind, namespace, labels, fields)
                yield "SYNC", items
            with self.errors(f"watching {kind}s"):
                try:
                    events = self._events(res, namespace, labels, fields, version, seconds)
                    for event in events:
                        obj = event.get("object") or {}
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            yield event["type"], obj
                        if stop is not None and stop.is_set():
                            return
                except ApiException as exc:
                    if exc.status != 410:
                        raise
                    version = None  # expired: list again

    @staticmethod
    def _events(
        res: Any,
        namespace: str,
        labels: str | None,
        fields: str | None,
        version: str,
        seconds: int,
    ) -> Iterator[Obj]:
        from kubernetes import watch

        stream = watch.Watch().stream(
            res.get,
            namespace=namespace,
            label_selector=labels,
            field_selector=fields,
            resource_version=version,
            allow_watch_bookmarks=True,  # keeps the version fresh on a quiet stream
            timeout_seconds=seconds,  # also makes an expired version an error, not a retry
            serialize=False,
            _request_timeout=(CONNECT_TIMEOUT, seconds + REQUEST_TIMEOUT),
        )
        try:
            yield from stream
        finally:
            stream.close()  # the response with it

    def apply(self, obj: Obj, dry_run: bool = False) -> Obj:
        """Server-side apply as field manager `ddpdeploy` (dry run: validated, not stored)."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        what = f"{'dry run of ' if dry_run else ''}{obj['kind']} {meta['name']}"
        with self.errors(what):
            got = res.server_side_apply(
                body=obj,
                namespace=meta.get("namespace"),
                field_manager=FIELD_MANAGER,
                dry_run="All" if dry_run else None,
                _request_timeout=REQUEST_TIMEOUT,
            )
        return _as_obj(got)

    def create(self, obj: Obj, dry_run: bool = False) -> Obj:
        res = self.resource(obj["apiVersion"], obj["kind"])
        with self.errors(f"creating {obj['kind']} {obj['metadata']['name']}"):
            got = res.create(
                body=obj,
                namespace=obj["metadata"].get("namespace"),
                field_manager=FIELD_MANAGER,
                dry_run="All" if dry_run else None,
                _request_timeout=REQUEST_TIMEOUT,
            )
        return _as_obj(got)

    def create_as_applier(self, obj: Obj) -> Obj:
        """Create-only (Conflict when it exists), then record our fields as applied rather
        than updated, as kubectl's upgrade from client-side apply does: later server-side
        applies by `ddpdeploy` would otherwise conflict with our own create."""
        got = self.create(obj)
        entries = got["metadata"].get("managedFields") or []
        for entry in entries:
            if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Update":
                entry["operation"] = "Apply"
        res = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        with self.errors(f"updating {obj['kind']} {meta['name']}"):
            got = res.patch(
                body={"metadata": {"managedFields": entries}},
                name=meta["name"],
                namespace=meta.get("namespace"),
                content_type="application/merge-patch+json",
                field_manager=FIELD_MANAGER,
                _request_timeout=REQUEST_TIMEOUT,
            )
        return _as_obj(got)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None) -> bool:
        """Delete (dependents in the background); False when it was not there."""
        from kubernetes.dynamic.exceptions import NotFoundError

        res = self.resource(api_version, kind)
        with self.errors(f"deleting {kind} {name}"):
            try:
                res.delete(
                    name=name,
                    namespace=namespace,
                    propagation_policy="Background",
                    _request_timeout=REQUEST_TIMEOUT,
                )
            except NotFoundError:
                return False
        return True

    def logs(
        self,
        pod: str,
        namespace: str,
        container: str,
        follow: bool = False,
        tail: int | None = None,
        *,
        previous: bool = False,
        since_seconds: int | None = None,
        timestamps: bool = False,
        limit_bytes: int | None = None,
    ) -> Iterator[str]:
        """A pod's log lines as they come (through the kubelet); ``previous``: the log of
        the container's last terminated run."""
        what = f"reading the {'previous ' if previous else ''}logs of pod {pod}"
        given = {
            "container": container,
            "follow": follow or None,
            "previous": previous or None,
            "timestamps": timestamps or None,
            "tailLines": tail,
            "sinceSeconds": since_seconds,
            "limitBytes": limit_bytes,
        }
        query = [(k, _query_value(v)) for k, v in given.items() if v is not None]
        path = f"/api/v1/namespaces/{_quote(namespace)}/pods/{_quote(pod)}/log"
        gone = f"the log of pod {pod}{' (its previous run)' if previous else ''}"

        def read(stop: threading.Event | None = None) -> Iterator[str]:
            with self.errors(what):
                resp = self._get_raw(
                    path,
                    query,
                    # A followed stream may stay quiet for long (the client takes no None
                    # for "no read timeout", so a week; the heartbeat watches the server);
                    # connecting is still bounded.
                    (CONNECT_TIMEOUT, FOLLOW_QUIET) if follow else DEFAULT_TIMEOUT,
                )
                try:
                    for line in kubelet_checked(_body_lines(resp), timestamps, gone):
                        if stop is not None and stop.is_set():
                            return
                        yield line
                finally:
                    with contextlib.suppress(Exception):
                        resp.release_conn()

        if follow:
            yield from self._heartbeat(read, what)
        else:
            yield from read()

    def _heartbeat(
        self, read: Callable[[threading.Event], Iterator[str]], what: str
    ) -> Iterator[str]:
        """``read``'s lines, read on a thread: after HEARTBEAT seconds without one the API
        server is asked whether it still answers, and one that does not ends the follow
        (ApiSilent), where the stream's read would wait a week on a server that accepts
        connections and sends nothing (stopped, hung). Waiting on the queue also leaves
        the caller's thread interruptible."""
        out: queue.Queue[tuple[bool, Any]] = queue.Queue()
        stop = threading.Event()

        def pump() -> None:
            try:
                for line in read(stop):
                    out.put((True, line))
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                out.put((False, exc))
            else:
                out.put((False, None))

        threading.Thread(target=pump, name=f"ddpdeploy {what}", daemon=True).start()
        try:
            while True:
                try:
                    ok, item = out.get(timeout=HEARTBEAT)
                except queue.Empty:
                    self._check_answering(what)
                    continue
                if ok:
                    yield item
                elif item is None:
                    return
                else:
                    raise item
        finally:
            stop.set()  # the reader ends at its next line (or stays blocked, a daemon)

    def _check_answering(self, what: str) -> None:
        """ApiSilent unless the API server answers a GET /version within PING_TIMEOUT
        (any answer counts, a refusal too: it is there)."""
        from kubernetes.client.exceptions import ApiException

        def ping() -> None:
            with contextlib.suppress(ApiException):
                self._get_raw("/version", [], (CONNECT_TIMEOUT, PING_TIMEOUT)).release_conn()

        try:
            bounded(ping, PING_TIMEOUT, "asking the API server")  # its retry bounded too
        except Exception as exc:  # noqa: BLE001 - a timeout, a refused or reset connection
            why = "" if isinstance(exc, TimeoutError) else f": {_one_line(exc, 120)}"
            raise ApiSilent(
                f"{what}: the API server at {self.server} stopped answering (no answer "
                f"within {PING_TIMEOUT} s after {HEARTBEAT} s without a line{why}); check "
                "the cluster's control plane, then run the command again"
            ) from None

    def _get_raw(self, path: str, query: builtins.list[tuple[str, str]], timeout: Any) -> Any:
        """GET ``path`` through the client's ApiClient (its auth, TLS and REST layer; the
        generated CoreV1Api would load 250 models): urllib3's response, unread; an error
        status raises ApiException as the generated methods do."""
        from kubernetes.client.exceptions import ApiException

        self._first_request()
        headers = {"Accept": "*/*"}
        if hasattr(self._api, "param_serialize"):  # 37 on: openapi-generator's python client
            request = self._api.param_serialize(
                "GET", path, query_params=query, header_params=headers, auth_settings=_AUTH
            )
            got = self._api.call_api(*request, _request_timeout=timeout)
            if not 200 <= got.status <= 299:
                got.read()
                raise ApiException.from_response(http_resp=got, body=None, data=None)
            return got.response
        # up to 36 (python-legacy): raises on an error status itself
        return self._api.call_api(
            path,
            "GET",
            query_params=query,
            header_params=headers,
            auth_settings=_AUTH,
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=timeout,
        )

    def exec_stream(
        self, pod: str, namespace: str, container: str, argv: builtins.list[str]
    ) -> Iterator[bytes]:
        """Run ``argv`` in a pod's container (through the kubelet) and yield its stdout."""
        _load_client(("kubernetes.stream",))
        from kubernetes.stream import stream

        self._first_request()
        pods = _PodExec(self._api)
        what = f"running {argv[0]} in pod {pod}"
        errors = b""
        with self.errors(what):
            ws = bounded(
                lambda: stream(
                    pods.connect_get_namespaced_pod_exec,
                    pod,
                    namespace,
                    container=container,
                    command=argv,
                    stdin=False,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    binary=True,
                    _preload_content=False,
                ),
                REQUEST_TIMEOUT,
                what,
            )
            try:
                heard = time.monotonic()
                while ws.is_open():
                    ws.update(timeout=5)
                    if ws.peek_stdout():
                        heard = time.monotonic()
                        yield ws.read_stdout()
                    if ws.peek_stderr():
                        heard = time.monotonic()
                        errors += ws.read_stderr()
                    if time.monotonic() - heard > REQUEST_TIMEOUT:  # open, yet silent
                        raise TimeoutError(f"no output for {REQUEST_TIMEOUT} s")
                if ws.peek_stdout():
                    yield ws.read_stdout()
                code, failure = _exec_status(ws.read_channel(_EXEC_STATUS_CHANNEL))
            finally:
                ws.close()
        if failure:
            raise OperationError(f"{what}: {failure}")
        if code:
            tail = _one_line(errors.decode(errors="replace")[-300:])
            raise OperationError(f"{what}: exit code {code}: {tail}")


# The exec protocol's channel that carries the command's end: a Status object.
_EXEC_STATUS_CHANNEL = 3


def _exec_status(raw: str | bytes) -> tuple[int, str]:
    """The exit code of an exec's command and, when the exec itself failed ("container ...
    is not running", the runtime's error), that failure in one line. Read here rather than
    by the client's ``returncode``, which takes the first cause's message for a number and
    raised ValueError on the kubelet's own failures."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    if not text.strip():  # the server sends one on success too: the stream was cut short
        return 0, "the exec ended without its command's status (the connection closed early)"
    try:
        status = json.loads(text)
    except ValueError:
        status = None
    if not isinstance(status, dict):
        return 0, f"the exec ended with an unreadable status ({_one_line(text, 200)})"
    if status.get("status") == "Success":
        return 0, ""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(str(cause.get("message"))), ""
    message = status.get("message")
    return 0, _one_line(message if isinstance(message, str) else text, 300)


if TYPE_CHECKING:
    _KUBE_IS_A_KUBEAPI: type[KubeApi] = Kube  # mypy holds Kube to the protocol


def _body_lines(resp: Any) -> Iterator[str]:
    lines = LineSplitter(b"")
    for chunk in resp.stream(4096):
        for line in lines.feed(chunk):
            yield line.decode(errors="replace")
    for line in lines.finish():
        yield line.decode(errors="replace")


# The kubelet's own errors that come back as a log's body, HTTP 200 (the 1.20 kubelet, once
# the container is gone: after a restart, a pod replaced): its container lookup failing
# (kuberuntime's GetContainerLogs), the runtime's "No such container" (docker) or
# "an error occurred when try to find container" (containerd), the log file gone.
# Kubernetes' own e2e log reader (test/e2e/storage/podlogs) drops the same wordings.
_KUBELET_ERROR = re.compile(
    r"(?:[Uu]nable to retrieve container logs for \S+"
    r"|rpc error: code = \w+ desc = (?:Error: No such container: \S+"
    r"|an error occurred when try to find container \S+.*)"
    r'|failed to try resolving symlinks in path ".*)\s*'
)


def kubelet_error(line: str) -> bool:
    """Whether ``line`` is one of the kubelet's own errors, as it words them."""
    return _KUBELET_ERROR.fullmatch(line) is not None


def kubelet_checked(lines: Iterator[str], timestamps: bool, what: str) -> Iterator[str]:
    """``lines`` of a log, where a body that is the kubelet's error alone (one line in its
    wording) is LogUnavailable naming ``what``, not the pod's line. Read with timestamps,
    every line of the pod's carries one: a bare line in that wording is the kubelet's, and
    comes first (or after the log, then dropped). Without, the first line is held until
    another comes or the body ends, so a followed log that starts so waits for its next."""
    held: str | None = None
    for number, line in enumerate(lines):
        if number == 0 and kubelet_error(line):
            if timestamps:
                raise LogUnavailable(f"{what} is unavailable (the kubelet: {plain(line)})")
            held = line
            continue
        if timestamps and kubelet_error(line):
            continue  # after the log it did send, the kubelet's complaint is not the pod's
        if held is not None:
            yield held
            held = None
        yield line
    if held is not None:
        raise LogUnavailable(f"{what} is unavailable (the kubelet: {plain(held)})")
