"""smoke --docker's compose project against a real engine: the built-in trainer,
2 nodes x 2 processes, in the image `ddpdeploy build` makes over the local torch image.

It trains to the same weights as `ddpdeploy smoke --local`, what runs is what the rendered
file says, and a failing run names its node and leaves nothing behind."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpdeploy.contract import RunRecord
from ddpdeploy.events import split_rank
from ddpdeploy.smoke.compose import compose_job, render_compose
from ddpdeploy.smoke.composerun import PROJECT_LABEL, ComposeRun, Line
from ddpdeploy.smoke.launch import nodes_of
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import launch_contract

pytestmark = pytest.mark.docker

HASH = re.compile(r"^weights_sha256  ([0-9a-f]{64})$", re.M)
STEPS = 12


@pytest.fixture(scope="module")
def image(trainer_image: str) -> str:
    return trainer_image


def job(image: str, **extra: Any) -> JobSpec:
    doc = {"name": "cmp", "image": image, "nodes": 2, "procs": 2, "shmSize": "256Mi", **extra}
    doc.setdefault("command", {"args": ["--steps", str(STEPS)]})
    return JobSpec.model_validate(doc)


def compose_run(spec: JobSpec) -> ComposeRun:
    """The rendered project, its nodes from the run plan."""
    return ComposeRun(render_compose(spec), nodes_of(launch_contract(compose_job(spec))), spec.name)


def done_event(line: Line | None, done: dict[str, Any] | None) -> dict[str, Any] | None:
    # Every process's lines carry torchrun's rank prefix (the launch contract's base env).
    text = split_rank(line.text)[1] if line else ""
    if line and line.stream == "stdout" and text.startswith('{"event": "done"'):
        return json.loads(text)
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


# ranked: the node's rank is fixed by its name (PET_NODE_RANK) rather than by the order
# nodes join c10d's rendezvous (the default): static, and TrainJob, whose runtime sets it.
@pytest.mark.parametrize(
    ("rendezvous", "target", "ranked"),
    [
        ("static", "pytorchjob", True),
        ("c10d", "pytorchjob", False),
        ("elastic", "pytorchjob", False),
        ("c10d", "trainjob", True),
        ("c10d", "indexed-job", False),
    ],
    ids=["static", "c10d", "elastic", "trainjob", "indexed-job"],
)
def test_two_by_two_trains_like_smoke_local(
    rendezvous: str,
    target: str,
    ranked: bool,
    image: str,
    engine: Any,
    cli: Callable[..., Any],
    tmp_path: Path,
) -> None:
    extra: dict[str, Any] = {"target": target}
    if rendezvous == "elastic":
        extra["rendezvous"] = {"mode": "elastic", "minNodes": 2, "maxNodes": 2}
    elif rendezvous == "static":
        extra["rendezvous"] = {"mode": "static"}
    spec = job(image, **extra)
    with compose_run(spec) as run:
        project = run.project_name
        # What runs is what the rendered file says: the pod's command and the operator's env.
        # compose records the spec it was given, not the CPU job it runs (RunRecord.of).
        contract = launch_contract(compose_job(spec), record=RunRecord().of(spec))
        for node, n in zip(contract.nodes, run.nodes, strict=True):
            config = run.node(n.name).container.attrs["Config"]
            assert config["Hostname"] == n.name == node.hostname
            assert n.rank == (node.rank if ranked else None)
            assert config["Entrypoint"] == contract.container_command()
            assert not config["Cmd"]
            env = dict(e.split("=", 1) for e in config["Env"])
            assert env.items() >= contract.node_env(node).items()
        done, failed = run_to_end(run)
        assert failed is None, (failed, run.tail(failed)[-20:])
        assert run.exit_codes() == {node.hostname: 0 for node in contract.nodes}
    assert nothing_left(engine, project) == []
    assert done is not None and done["step"] == STEPS

    # Every layout trains exactly as the PyTorchJob layout does locally.
    assert done["weights_sha256"] == local_hash(cli, tmp_path, rendezvous == "elastic")


_LOCAL: dict[bool, str] = {}


def local_hash(cli: Callable[..., Any], cwd: Path, elastic: bool) -> str:
    """`smoke --local`'s weights_sha256 for the same job and steps (once per module)."""
    if elastic not in _LOCAL:
        flags = ["--nodes", "2", "--procs", "2", "--steps", str(STEPS)]
        flags += ["--elastic", "2:2"] if elastic else []
        local = cli("smoke", "--local", *flags, cwd=cwd)
        assert local.returncode == 0, local.stderr
        match = HASH.search(local.stdout)
        assert match is not None, local.stdout
        _LOCAL[elastic] = match[1]
    return _LOCAL[elastic]


def test_killed_worker_restarts_and_ends_with_the_same_weights(
    image: str, cli: Callable[..., Any], tmp_path: Path
) -> None:
    rdzv = {"mode": "elastic", "minNodes": 2, "maxNodes": 2, "maxRestarts": 1}
    # Slow steps: the kill must land while the workers still train.
    args = ["--steps", str(STEPS), "--debug-step-delay", "0.5"]
    spec = job(image, rendezvous=rdzv, command={"args": args})
    starts, killed, done = 0, "", None
    with compose_run(spec) as run:
        for line in run.events():
            done = done_event(line, done)
            text = split_rank(line.text)[1] if line else ""
            if line and line.stream == "stdout" and text.startswith('{"event": "start"'):
                starts += 1
            if not killed and line and text.startswith('{"event": "step", "step": 3,'):
                # A worker of the node without rank 0 (c10d puts rank 0 on either).
                other = next(n.name for n in run.nodes if n.name != line.node)
                killed = run.kill_worker(other)
            assert run.failed() is None, run.tail(run.failed() or "")[-20:]
            if run.finished():
                break
        for rest in run.drain():
            done = done_event(rest, done)
        assert run.exit_codes() == {"cmp-worker-0": 0, "cmp-worker-1": 0}
    assert re.fullmatch(r"local rank 1 \(pid \d+\)", killed)
    assert starts == 2  # torchrun restarted the worker group, which started over
    assert done is not None and done["step"] == STEPS
    assert done["weights_sha256"] == local_hash(cli, tmp_path, elastic=True)


def test_failing_trainer_names_its_node_and_leaves_nothing(image: str, engine: Any) -> None:
    spec = job(
        image,
        command={"module": "ddpdeploy_no_such_module"},
        checkpoint={"size": "1Gi"},  # a named volume, which teardown must remove too
    )
    with compose_run(spec) as run:
        project = run.project_name
        assert run.volumes() == [f"{project}_checkpoints"]
        # Any anonymous volumes too (the test torch image declares one, /wheels).
        mounted = {m["Name"] for c in run.containers.values() for m in c.container.attrs["Mounts"]}
        done, failed = run_to_end(run)
        # Under c10d (the default) either node may be the first to fail, with no fixed rank.
        assert done is None and failed in ("cmp-worker-0", "cmp-worker-1")
        assert run.exit_codes()[failed] not in (None, 0)
        assert next(n.rank for n in run.nodes if n.name == failed) is None
        assert any("No module named ddpdeploy_no_such_module" in t for t in run.tail(failed))
    assert run.leftovers() == []
    assert nothing_left(engine, project) == []
    assert mounted & {v.name for v in engine.volumes.list()} == set()


def test_interrupt_mid_run_tears_down(image: str, engine: Any) -> None:
    spec = job(image, command={"args": ["--steps", "100000"]})
    with pytest.raises(KeyboardInterrupt), compose_run(spec) as run:
        project = run.project_name
        deadline = time.monotonic() + 300  # a run that never steps fails, not hangs CI
        for line in run.events():
            if line and split_rank(line.text)[1].startswith('{"event": "step"'):
                raise KeyboardInterrupt  # as Ctrl-C would, once training runs
            assert run.failed() is None
            assert time.monotonic() < deadline, "no step line within 300 s"
    assert nothing_left(engine, project) == []
