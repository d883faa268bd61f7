"""Our labels, and the one builder of label selectors every list call uses."""

from __future__ import annotations

from collections.abc import Mapping

from ddpdeploy.render.pod import MANAGED_BY
from ddpdeploy.spec import INSTANCE_LABEL, MANAGED_BY_LABEL

__all__ = ["INSTANCE_LABEL", "MANAGED_BY_LABEL", "ours", "ours_selector", "selector"]


def selector(labels: Mapping[str, str]) -> str:
    """An equality label selector (``k=v,k2=v2``), keys sorted so that it reads the same
    every time."""
    return ",".join(f"{key}={labels[key]}" for key in sorted(labels))


def ours(job: str | None = None) -> dict[str, str]:
    """The labels of what ddpdeploy made (for job ``job`` when given)."""
    out = {MANAGED_BY_LABEL: MANAGED_BY}
    if job is not None:
        out[INSTANCE_LABEL] = job
    return out


def ours_selector(job: str | None = None) -> str:
    return selector(ours(job))
