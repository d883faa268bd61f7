"""An in-memory stand-in for ddpdeploy.adapters.kube.Kube (same method names), for unit
tests of the apply path: objects in a dict, 409 on a create of an existing name, and hooks
that make one call fail or do something (send a signal) before it answers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ddpdeploy.adapters.kube import Conflict
from ddpdeploy.obj import Obj

Key = tuple[str, str | None, str]  # kind, namespace, name


class FakeKube:
    server = "https://fake.invalid"
    default_namespace = "default"

    def __init__(self) -> None:
        self.objects: dict[Key, Obj] = {}
        self.calls: list[tuple[str, str, str]] = []  # (verb, kind, name)
        self.hooks: dict[tuple[str, str], Callable[[], None]] = {}  # (verb, kind) -> run first
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

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Any:
        self._hook("get", kind, name)
        got = self.objects.get((kind, namespace, name))
        return copy.deepcopy(got) if got else None

    def list(self, api_version: str, kind: str, namespace: Any = None, labels: Any = None) -> Any:
        self._hook("list", kind, "")
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind]

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

    def kinds(self) -> list[tuple[str, str]]:
        return sorted((k, name) for k, _, name in self.objects)
