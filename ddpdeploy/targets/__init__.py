"""The targets a job can run on, registered once by their --target name (see base.Layout),
and the two entries every caller above them uses: the launch contract on the spec's own
target, and every object the job needs there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpdeploy import contract
from ddpdeploy.render.pod import checkpoint_pvc, selector_labels
from ddpdeploy.render.policy import beside_job
from ddpdeploy.rules import DEFAULT_TARGET, TARGET_NAMES
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets.base import Layout
from ddpdeploy.targets.indexed_job import IndexedJob
from ddpdeploy.targets.pytorchjob import PyTorchJob
from ddpdeploy.targets.trainjob import TrainJob

TARGETS: dict[str, Layout] = {t.name: t for t in (PyTorchJob(), TrainJob(), IndexedJob())}
assert tuple(TARGETS) == TARGET_NAMES, "rules.TARGET_RULES and TARGETS name the same targets"
SCALABLE = tuple(t for t in TARGETS.values() if t.can_scale)
_KINDS = [t.kind for t in TARGETS.values()]
JOB_KINDS = f"{', '.join(_KINDS[:-1])} or {_KINDS[-1]}"  # "PyTorchJob, TrainJob or Job"
# What `logs --replica` may name, over every target that has replicas.
REPLICA_NAMES = tuple(dict.fromkeys(r for t in TARGETS.values() for r in t.replica_names))


def layout_of(name: str) -> Layout:
    return TARGETS[name]


def layout_for_kind(api_version: str, kind: str) -> Layout | None:
    """The target whose job object is ``kind`` (for cluster commands reading objects back)."""
    return next(
        (t for t in TARGETS.values() if (t.api_version, t.kind) == (api_version, kind)), None
    )


def launch_contract(
    spec: JobSpec,
    port: int | None = None,
    *,
    run_env: Mapping[str, str] | None = None,
    record: contract.RunRecord | None = None,
) -> contract.LaunchContract:
    """contract.launch_contract on the spec's own target's layout."""
    layout = layout_of(spec.target)
    return contract.launch_contract(spec, layout, port, run_env=run_env, record=record)


def render_objects(spec: JobSpec, record: contract.RunRecord | None = None) -> list[dict[str, Any]]:
    """Every object the job needs on its target, dependencies (the PVC, the policy, a
    Service) first. Pure: no network, no clock, no randomness; same spec (and ``record``,
    what ddpdeploy knows of the image it built), same objects."""
    layout = layout_of(spec.target)
    # The objects run on this same layout.
    launch = contract.launch_contract(spec, layout, record=record)
    pvc = checkpoint_pvc(spec)
    policies = beside_job(spec, selector_labels(spec))
    return [*([pvc] if pvc else []), *policies, *layout.objects(spec, launch)]


__all__ = [
    "DEFAULT_TARGET",
    "JOB_KINDS",
    "REPLICA_NAMES",
    "SCALABLE",
    "TARGETS",
    "Layout",
    "launch_contract",
    "layout_for_kind",
    "layout_of",
    "render_objects",
]
