"""smoke --docker's compose project against a real engine: the built-in trainer,
2 nodes x 2 processes, in the image `ddpdeploy build` makes over the local torch image.

It trains to the same weights as `ddpdeploy smoke --local`, what runs is what the rendered
file says, and teardown leaves nothing behind, volumes included."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from ddpdeploy.contract import RunRecord
from ddpdeploy.events import split_ranks
from ddpdeploy.smoke.compose import compose_job, render_compose
from ddpdeploy.smoke.composerun import PROJECT_LABEL, ComposeRun, Line
from ddpdeploy.smoke.launch import nodes_of
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import launch_contract

pytestmark = pytest.mark.docker

HASH = re.compile(r"^weights_sha256  ([0-9a-f]{64})$", re.M)
STEPS = 12
NO_PROBE = ["--no-probe"]  # the start-up all-reduce probe: not what these runs look at


@pytest.fixture(scope="module")
def image(trainer_image: str) -> str:
    return trainer_image


def job(image: str, **extra: Any) -> JobSpec:
    doc = {"name": "cmp", "image": image, "nodes": 2, "procs": 2, "shmSize": "256Mi", **extra}
    doc.setdefault("command", {"args": ["--steps", str(STEPS), *NO_PROBE]})
    return JobSpec.model_validate(doc)


def compose_run(spec: JobSpec) -> ComposeRun:
    """The rendered project, its nodes from the run plan."""
    return ComposeRun(render_compose(spec), nodes_of(launch_contract(compose_job(spec))), spec.name)


def done_event(line: Line | None, done: dict[str, Any] | None) -> dict[str, Any] | None:
    # Every process's lines carry torchrun's rank prefix (the launch contract's base env);
    # a killed rank's partial line runs on into the next rank's.
    for _, text in split_ranks(line.text) if line and line.stream == "stdout" else []:
        if text.startswith('{"event": "done"'):
            done = json.loads(text)
    return done


def run_to_end(run: ComposeRun, timeout: float = 300) -> tuple[dict[str, Any] | None, str | None]:
    """Rank 0's final `done` event, or the node that failed."""
    done = None
    deadline = time.monotonic() + timeout
    for line in run.events():
        done = done_event(line, done)
        failed = run.failed()
        if failed is not None:
            run.drain()
            return done, failed
        if run.finished():
            for rest in run.drain():
                done = done_event(rest, done)
            return done, None
        assert time.monotonic() < deadline, "the compose run did not finish in time"
    raise AssertionError("unreachable")


def nothing_left(engine: Any, project: str) -> list[str]:
    flt = {"label": f"{PROJECT_LABEL}={project}"}
    return (
        [c.name for c in engine.containers.list(all=True, filters=flt)]
        + [n.name for n in engine.networks.list(filters=flt)]
        + [v.name for v in engine.volumes.list(filters=flt)]
    )


@pytest.fixture(scope="module")
def local_hash(cli: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> str:
    """`smoke --local`'s weights_sha256 for the same job and steps."""
    flags = ["--nodes", "2", "--procs", "2", "--steps", str(STEPS), "--", *NO_PROBE]
    local = cli("smoke", "--local", *flags, cwd=tmp_path_factory.mktemp("local"))
    assert local.returncode == 0, local.stderr
    match = HASH.search(local.stdout)
    assert match is not None, local.stdout
    return match[1]


def test_two_by_two_trains_like_smoke_local(image: str, engine: Any, local_hash: str) -> None:
    """The TrainJob layout: nodes reached at <host>.<subdomain> (a network alias here), and
    each node's rank fixed by PET_NODE_RANK, as the Trainer's runtime sets it."""
    # A checkpoint volume: a named volume (and its helper), which teardown must remove too.
    spec = job(image, target="trainjob", checkpoint={"size": "1Gi"})
    with compose_run(spec) as run:
        project = run.project_name
        assert run.volumes() == [f"{project}_checkpoints"]
        # Any anonymous volumes too (the test torch image declares one, /wheels).
        mounted = {m["Name"] for c in run.containers.values() for m in c.container.attrs["Mounts"]}
        # What runs is what the rendered file says: the pod's command and the operator's env.
        # compose records the spec it was given, not the CPU job it runs (RunRecord.of).
        contract = launch_contract(compose_job(spec), record=RunRecord().of(spec))
        for node, n in zip(contract.nodes, run.nodes, strict=True):
            config = run.node(n.name).container.attrs["Config"]
            assert config["Hostname"] == n.name == node.hostname
            assert node.address != node.hostname
            assert node.rank is not None and n.rank == node.rank
            assert config["Entrypoint"] == contract.container_command()
            assert not config["Cmd"]
            env = dict(e.split("=", 1) for e in config["Env"])
            assert env.items() >= contract.node_env(node).items()
        done, failed = run_to_end(run)
        assert failed is None, (failed, run.tail(failed)[-20:])
        assert run.exit_codes() == {node.hostname: 0 for node in contract.nodes}
    assert run.leftovers() == []
    assert nothing_left(engine, project) == []
    assert mounted & {v.name for v in engine.volumes.list()} == set()
    assert done is not None and done["step"] == STEPS

    # The layout trains exactly as the PyTorchJob layout does locally.
    assert done["weights_sha256"] == local_hash
