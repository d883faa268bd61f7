"""The plan of a `smoke --docker` run: the job's compose project and its nodes.

Pure: the command gets the image (the spec's, or one `ddpdeploy build` makes), checks the
engine, and starts one fresh compose project per run from this plan (so a --kill-at run
and its clean run share nothing, checkpoint volume included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddpdeploy.contract import RunRecord
from ddpdeploy.render.compose import compose_job, render_compose
from ddpdeploy.smoke.plan import nodes_of
from ddpdeploy.smoke.target import Node
from ddpdeploy.spec import JobSpec, spec_with
from ddpdeploy.targets import launch_contract

LOCAL_REPO = "ddpdeploy-smoke"  # where a smoke run's own build is tagged


@dataclass(frozen=True)
class ComposePlan:
    name: str
    project: dict[str, Any]  # the rendered compose file
    nodes: list[Node]  # the job's nodes, one service each


def compose_plan(
    spec: JobSpec, image: str, run_env: Mapping[str, str], record: RunRecord | None = None
) -> ComposePlan:
    """The job on CPU in ``image``, with ``run_env`` (the plan's `run_env`) on every node;
    ``record``: what is known of ``image`` (the engine's image ID)."""
    job = spec_with(spec, {"image": image})
    project = render_compose(job, cpu=True, run_env=run_env, record=record)
    nodes = nodes_of(launch_contract(compose_job(job, cpu=True), run_env=run_env))
    return ComposePlan(job.name, project, nodes)
