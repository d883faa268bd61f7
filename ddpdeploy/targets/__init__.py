"""The targets a job can run on, by their --target name; see base.Layout."""

from __future__ import annotations

from ddpdeploy.targets.base import COMPLETION_INDEX, POD_IP, Layout, Node
from ddpdeploy.targets.indexed_job import IndexedJob
from ddpdeploy.targets.pytorchjob import PyTorchJob
from ddpdeploy.targets.trainjob import TrainJob

TARGETS: dict[str, Layout] = {t.name: t for t in (PyTorchJob(), TrainJob(), IndexedJob())}
DEFAULT_TARGET = "pytorchjob"


def layout_of(name: str) -> Layout:
    return TARGETS[name]


def layout_for_kind(api_version: str, kind: str) -> Layout | None:
    """The target whose job object is ``kind`` (for cluster commands reading objects back)."""
    return next(
        (t for t in TARGETS.values() if (t.api_version, t.kind) == (api_version, kind)), None
    )


__all__ = [
    "COMPLETION_INDEX",
    "POD_IP",
    "DEFAULT_TARGET",
    "TARGETS",
    "Layout",
    "Node",
    "layout_for_kind",
    "layout_of",
]
