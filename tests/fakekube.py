"""An in-memory stand-in for a cluster connection (ddpdeploy.adapters.kube.KubeApi, which
`Kube` is too; tests/test_fakekube.py holds it to the protocol), for unit tests of the apply
path: objects in a dict, listed by namespace and label selector as the API server does,
409 on a create of an existing name, and hooks that make one call fail or do something
(send a signal) before it answers."""

from __future__ import annotations

import builtins
import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ddpdeploy.adapters.kube import WATCH_SECONDS, Conflict
from ddpdeploy.obj import Obj

Key = tuple[str, str | None, str]  # kind, namespace, name


def matches(selector: str | None, labels: dict[str, str]) -> bool:
    """Whether ``labels`` match a label selector: ``k=v`` (or ``k==v``), ``k!=v``, ``k``
    (has the label) and ``!k`` (has not), comma-separated, all of them. Set-based terms
    (``k in (a, b)``) are refused: nothing in the product builds them."""
    for term in (t.strip() for t in (selector or "").split(",")):
        if not term:
            continue
        if " in " in term or " notin " in term or "(" in term:
            raise NotImplementedError(f"FakeKube: set-based selector {term!r}")
        if "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


class FakeKube:
    # `list` below is a method: the annotations after it say builtins.list.
    server = "https://fake.invalid"
    default_namespace = "default"

    def __init__(self) -> None:
        self.objects: dict[Key, Obj] = {}
        self.calls: list[tuple[str, str, str]] = []  # (verb, kind, name)
        self.hooks: dict[tuple[str, str], Callable[[], None]] = {}  # (verb, kind) -> run first
        self.pod_logs: dict[str, list[str]] = {}  # pod -> its log lines
        self.exec_out: dict[str, bytes] = {}  # pod -> what any command run in it prints
        self._uid = 0

    def _hook(self, verb: str, kind: str, name: str) -> None:
        self.calls.append((verb, kind, name))
        hook = self.hooks.pop((verb, kind), None)
        if hook is not None:
            hook()

    def add(self, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        self._uid += 1
        obj["metadata"]["uid"] = f"uid-{self._uid}"
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta.get("namespace"), meta["name"])] = obj
        return obj

    def has_kind(self, api_version: str, kind: str) -> bool:
        return True

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Obj | None:
        self._hook("get", kind, name)
        got = self.objects.get((kind, namespace, name))
        return copy.deepcopy(got) if got else None

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
        """As the API server lists: ``namespace`` None is every namespace; ``fields`` only
        ``metadata.name=NAME`` (what `watch` asks)."""
        self._hook("list", kind, "")
        name = fields.removeprefix("metadata.name=") if fields else None
        if fields and name == fields:
            raise NotImplementedError(f"FakeKube: field selector {fields!r}")
        found = [
            copy.deepcopy(o)
            for (k, ns, n), o in self.objects.items()
            if k == kind
            and (namespace is None or ns == namespace)
            and (name is None or n == name)
            and matches(labels, o["metadata"].get("labels") or {})
        ]
        return found, str(self._uid)

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
        """The SYNC of what is there; no changes follow (nothing changes on its own here)."""
        fields = f"metadata.name={name}" if name else None
        yield "SYNC", self.listed(api_version, kind, namespace, labels, fields)[0]

    def apply(self, obj: Obj, dry_run: bool = False) -> Obj:
        self._hook("dry-run" if dry_run else "apply", obj["kind"], obj["metadata"]["name"])
        if dry_run:
            return obj
        meta = obj["metadata"]
        old = self.objects.get((obj["kind"], meta.get("namespace"), meta["name"]))
        new = self.add(obj)
        if old:
            new["metadata"]["uid"] = old["metadata"]["uid"]
        return new

    def create(self, obj: Obj, dry_run: bool = False) -> Obj:
        meta = obj["metadata"]
        self._hook("create", obj["kind"], meta["name"])
        if (obj["kind"], meta.get("namespace"), meta["name"]) in self.objects:
            raise Conflict(f"creating {obj['kind']} {meta['name']}: conflict: already exists")
        return obj if dry_run else self.add(obj)

    def create_as_applier(self, obj: Obj) -> Obj:
        return self.create(obj)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None) -> bool:
        self._hook("delete", kind, name)
        return self.objects.pop((kind, namespace, name), None) is not None

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
        self._hook("logs", "Pod", pod)
        lines = self.pod_logs.get(pod, [])
        yield from lines[len(lines) - tail :] if tail is not None else lines

    def exec_stream(
        self, pod: str, namespace: str, container: str, argv: builtins.list[str]
    ) -> Iterator[bytes]:
        self._hook("exec", "Pod", pod)
        yield self.exec_out.get(pod, b"")

    def kinds(self) -> builtins.list[tuple[str, str]]:
        return sorted((k, name) for k, _, name in self.objects)
