"""The Kubernetes API, through the official client: the only module that talks to a cluster.

Objects go in and come out as plain dicts. Every failure leaves as one OperationError line
that says what to do: unreachable API, rejected credentials, RBAC, missing kind, conflict.
The `kubernetes` package is imported lazily, so `render` never loads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddpdeploy.errors import OperationError
from ddpdeploy.streams import LineSplitter

Obj = dict[str, Any]

FIELD_MANAGER = "ddpdeploy"
REQUEST_TIMEOUT = 30  # seconds to wait for an answer to an ordinary call
CONNECT_TIMEOUT = 10  # seconds to connect (TCP and TLS handshake)
# Every request (discovery included) gets this unless it says otherwise: a server that
# accepts and never answers must not hang a command.
DEFAULT_TIMEOUT = (CONNECT_TIMEOUT, REQUEST_TIMEOUT)
_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class MissingKind(OperationError):
    """The cluster does not serve this kind (its CRD is not installed)."""


class Forbidden(OperationError):
    """RBAC refused the call; preflight checks that only inform may skip on it."""


class Conflict(OperationError):
    """409: the object exists already (a create) or changed under us."""


def _api_message(exc: Any) -> str:
    summary = getattr(exc, "summary", None)
    text = summary() if callable(summary) else str(getattr(exc, "body", "") or exc)
    return " ".join(str(text).split())


def _discovery_cache(host: str) -> str:
    """Per-user, per-server discovery cache (kubectl keeps one too), not a file in /tmp."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "ddpdeploy" / "discovery"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / f"{hashlib.sha256(host.encode()).hexdigest()[:16]}.json")


def _default_timeout(rest: Any) -> None:
    """Give every request through ``rest`` DEFAULT_TIMEOUT unless it names its own."""
    request = rest.request

    def bounded(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        return request(*args, _request_timeout=_request_timeout or DEFAULT_TIMEOUT, **kwargs)

    rest.request = bounded


class Kube:
    """One cluster, as the kubeconfig (or the pod's service account) describes it."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        from kubernetes import client
        from kubernetes.config.config_exception import ConfigException

        cfg = client.Configuration()
        try:
            self.default_namespace = self._load(cfg, kubeconfig, context)
        except (ConfigException, OSError, ValueError) as exc:
            raise OperationError(
                f"no usable cluster credentials ({' '.join(str(exc).split())}); pass "
                "--kubeconfig FILE or --context NAME, or set KUBECONFIG"
            ) from None
        cfg.retries = 1
        self.server = cfg.host
        self._api = client.ApiClient(cfg)
        _default_timeout(self._api.rest_client)
        with self.errors("connecting"):
            from kubernetes import dynamic

            self._dyn = dynamic.DynamicClient(self._api, cache_file=_discovery_cache(cfg.host))

    @staticmethod
    def _load(cfg: Any, kubeconfig: str | None, context: str | None) -> str:
        """Load credentials into ``cfg``; return the context's namespace (or "default")."""
        from kubernetes import config

        env = os.environ.get("KUBECONFIG", "")
        default = Path("~/.kube/config").expanduser()
        if kubeconfig or context or env or default.exists() or not _SA_DIR.is_dir():
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            if context:
                contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
                active = next((c for c in contexts if c["name"] == context), active)
            return (active or {}).get("context", {}).get("namespace") or "default"
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
            raise self._api_failure(what, exc) from None
        except (HTTPError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise OperationError(
                f"{what}: cannot reach the Kubernetes API at {self.server} "
                f"({' '.join(str(reason).split())[:200]}); check that the cluster is up and "
                "that the kubeconfig context (--context) points at it"
            ) from None

    def _api_failure(self, what: str, exc: Any) -> OperationError:
        status, message = getattr(exc, "status", None), _api_message(exc)
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
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        with self.errors(f"looking up {kind}"):
            try:
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
                got = res.get(name=name, namespace=namespace, _request_timeout=REQUEST_TIMEOUT)
            except NotFoundError:
                return None
        return got.to_dict()

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, labels: str | None = None
    ) -> list[Obj]:
        res = self.resource(api_version, kind)
        with self.errors(f"listing {res.kind}"):
            got = res.get(
                namespace=namespace, label_selector=labels, _request_timeout=REQUEST_TIMEOUT
            )
        return [item for item in got.to_dict().get("items") or []]

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
        return got.to_dict()

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
        return got.to_dict()

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
        return got.to_dict()

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
    ) -> Iterator[str]:
        """A pod's log lines as they come (through the kubelet)."""
        from kubernetes import client

        core = client.CoreV1Api(self._api)
        with self.errors(f"reading the logs of pod {pod}"):
            resp = core.read_namespaced_pod_log(
                pod,
                namespace,
                container=container,
                follow=follow,
                tail_lines=tail,
                _preload_content=False,
                # A followed stream may stay quiet for long; connecting is still bounded.
                _request_timeout=(CONNECT_TIMEOUT, None) if follow else DEFAULT_TIMEOUT,
            )
            lines = LineSplitter(b"")
            for chunk in resp.stream(4096):
                for line in lines.feed(chunk):
                    yield line.decode(errors="replace")
            for line in lines.finish():
                yield line.decode(errors="replace")

    def exec_stream(
        self, pod: str, namespace: str, container: str, argv: list[str]
    ) -> Iterator[bytes]:
        """Run ``argv`` in a pod's container (through the kubelet) and yield its stdout."""
        from kubernetes import client
        from kubernetes.stream import stream

        core = client.CoreV1Api(self._api)
        what = f"running {argv[0]} in pod {pod}"
        errors = b""
        with self.errors(what):
            ws = stream(
                core.connect_get_namespaced_pod_exec,
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
            )
            try:
                while ws.is_open():
                    ws.update(timeout=5)
                    if ws.peek_stdout():
                        yield ws.read_stdout()
                    if ws.peek_stderr():
                        errors += ws.read_stderr()
                if ws.peek_stdout():
                    yield ws.read_stdout()
                code = ws.returncode
            finally:
                ws.close()
        if code:
            tail = errors.decode(errors="replace").strip()[-300:]
            raise OperationError(f"{what}: exit code {code}: {tail}")
