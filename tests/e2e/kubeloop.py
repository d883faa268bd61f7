"""What the e2e cluster's stand-ins (cluster_dns.py, operator.py) share: raw JSON calls through the
kubernetes client, and list+watch loops that keep going through any failure.

Plain dicts in and out (the API's own JSON, camelCase), never the client's models: the
stand-ins read what the API serves, custom resources and core objects alike.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, config, watch

Obj = dict[str, Any]
log = logging.getLogger(__name__)


def api_client(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(kubeconfig)


def raw(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
    """Call a kubernetes client method and return the API's JSON as a dict."""
    resp = method(*args, _preload_content=False, _request_timeout=30, **kwargs)
    data = resp.data
    return json.loads(data) if data else {}


def status_of(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def key_of(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class Watched:
    """One kind's objects by (namespace, name), kept current by list then watch.

    ``list_fn`` is a kubernetes client list method (with ``kwargs``, e.g. a label selector);
    ``on_change(kind, obj)`` is called for every object seen on a (re)list as "SYNC" and
    for every watch event. Any failure (an expired resourceVersion, the apiserver going
    away) lists again after a second.
    """

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        on_change: Callable[[str, Obj], None] | None = None,
        **kwargs: Any,
    ) -> None:
        self.name = name
        self.list_fn = list_fn
        self.kwargs = kwargs
        self.on_change = on_change
        self.lock = threading.Lock()
        self.objects: dict[tuple[str, str], Obj] = {}
        self.synced = threading.Event()

    def get(self, namespace: str, name: str) -> Obj | None:
        with self.lock:
            return self.objects.get((namespace, name))

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name=self.name, daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._list_and_watch(stop)
            except Exception as exc:  # relist after any failure
                log.warning("%s: %s; listing again in 1s", self.name, str(exc).strip()[:300])
                stop.wait(1)

    def _list_and_watch(self, stop: threading.Event) -> None:
        body = raw(self.list_fn, **self.kwargs)
        items = body.get("items") or []
        with self.lock:
            self.objects = {key_of(obj): obj for obj in items}
        rv = body["metadata"]["resourceVersion"]
        log.info("%s: listed %d at resourceVersion %s", self.name, len(items), rv)
        self.synced.set()
        if self.on_change:
            for obj in items:
                self.on_change("SYNC", obj)
        while not stop.is_set():
            w = watch.Watch()
            events = w.stream(
                self.list_fn,
                resource_version=rv,
                timeout_seconds=60,
                allow_watch_bookmarks=True,
                deserialize=False,
                _request_timeout=(10, 90),
                **self.kwargs,
            )
            for event in events:
                kind, obj = event["type"], event["object"]
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if kind == "BOOKMARK":
                    continue
                with self.lock:
                    if kind == "DELETED":
                        self.objects.pop(key_of(obj), None)
                    else:
                        self.objects[key_of(obj)] = obj
                if self.on_change:
                    self.on_change(kind, obj)
                if stop.is_set():
                    w.stop()
