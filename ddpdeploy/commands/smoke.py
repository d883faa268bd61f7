"""`ddpdeploy smoke --local`: the job's nodes as torchrun agents on this host, on CPU."""

from __future__ import annotations

import importlib.util
import socket
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.errors import UserError
from ddpdeploy.options import spec_command
from ddpdeploy.spec import Checkpoint, JobSpec

if TYPE_CHECKING:
    from ddpdeploy.smoke_runner import SmokeTarget


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _with_args(spec: JobSpec, *args: str) -> JobSpec:
    command = spec.command.model_copy(update={"args": [*spec.command.args, *args]})
    return spec.model_copy(update={"command": command})


def _chaos_spec(spec: JobSpec, kill_at: int) -> tuple[JobSpec, int]:
    """The job for a --kill-at run, and the torchrun restarts it gets.

    torchrun restarts workers only with max restarts > 0: the spec's own value for elastic
    jobs that set one; else 1 for this run (static jobs restart by pod on the cluster, and
    torchrun's default is 0). The built-in trainer checkpoints before the kill so the
    restarted workers resume rather than start over."""
    restarts = spec.rendezvous.max_restarts
    if restarts == 0:
        raise UserError(
            "--kill-at: rendezvous.maxRestarts is 0, so torchrun would not restart the "
            "workers; set --max-restarts 1 or more"
        )
    if spec.command.builtin:
        if spec.checkpoint is None:
            spec = spec.model_copy(
                update={"checkpoint": Checkpoint.model_validate({"claimName": "smoke"})}
            )
        if not any(a.startswith("--checkpoint-every") for a in spec.command.args):
            spec = _with_args(spec, "--checkpoint-every", str(max(1, kill_at // 2)))
    return spec, restarts or 1


@spec_command
def smoke(
    spec: JobSpec,
    local: Annotated[
        bool, typer.Option("--local", help="Run the nodes as local processes (no Docker).")
    ] = True,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="Training steps (passed to the trainer).")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, help="Give up after this many seconds.")
    ] = 900,
    kill_at: Annotated[
        int | None,
        typer.Option(
            "--kill-at",
            min=1,
            help="Chaos: after a clean run, run again and SIGKILL one worker of a node "
            "without rank 0 when rank 0 reports this step; the weights must match.",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Start more workers than this host's cores suit.")
    ] = False,
    docker: Annotated[
        bool,
        typer.Option(
            "--docker", help="Run the nodes as a docker-compose project (`ddpdeploy compose`)."
        ),
    ] = False,
    base_image: Annotated[
        str | None, typer.Option("--base-image", help="--docker without --image: build on this.")
    ] = None,
    keep_volume: Annotated[
        bool, typer.Option("--keep-volume", help="--docker: keep the checkpoint volume.")
    ] = False,
) -> None:
    """Run the job as a CPU smoke test (gloo): one torchrun agent per node on 127.0.0.1,
    each with the env the cluster's operator would give that node.

    Example: ddpdeploy smoke --local --nodes 2 --procs 2 --steps 20
    """
    from ddpdeploy import smoke_runner

    if not (local or docker):
        raise UserError("--no-local: pass --local (processes here) or --docker (compose)")
    smoke_runner.check_cpu_budget(spec.nodes, spec.procs_per_node, force)
    if not docker and importlib.util.find_spec("torch") is None:
        raise UserError(
            "torch is not installed here: pip install torch==2.13.0 (CPU) or 'ddpdeploy[train]'"
        )
    if steps is not None:
        spec = _with_args(spec, "--steps", str(steps))
    restarts = None
    if kill_at is not None:
        spec, restarts = _chaos_spec(spec, kill_at)
    where = "in docker-compose" if docker else "on 127.0.0.1"
    typer.echo(
        f"smoke: {spec.name}: {spec.nodes} node(s) x {spec.procs_per_node} proc(s) = "
        f"world size {spec.nodes * spec.procs_per_node}, gloo {where}",
        err=True,
    )
    if docker:
        from ddpdeploy.smoke_docker import docker_target

        start = docker_target(
            spec,
            base_image=base_image,
            keep_volume=keep_volume,
            env=smoke_runner.RANK_OUTPUT_ENV,
            restarts=restarts,
        )
        smoke_runner.smoke(start, steps=steps, timeout=timeout, kill_at=kill_at)
        return
    with ExitStack() as cleanup:
        start = _local_target(spec, restarts, fresh_checkpoints=kill_at is not None, at=cleanup)
        smoke_runner.smoke(start, steps=steps, timeout=timeout, kill_at=kill_at)


def _local_target(
    spec: JobSpec, restarts: int | None, fresh_checkpoints: bool, at: ExitStack
) -> Callable[[], SmokeTarget]:
    """Start the job's agents on a fresh port (and, for chaos runs, checkpoint folder)."""
    from ddpdeploy.adapters.local import LocalRun
    from ddpdeploy.paths import trainer_script
    from ddpdeploy.render.local import plan

    def start() -> LocalRun:
        checkpoint_dir = None
        if fresh_checkpoints:
            checkpoint_dir = at.enter_context(tempfile.TemporaryDirectory(prefix="ddpdeploy-"))
        elif spec.checkpoint:
            checkpoint_dir = str(Path(".ddpdeploy", "checkpoints", spec.name).resolve())
        nodes = plan(spec, _free_port(), str(trainer_script()), checkpoint_dir, restarts)
        return LocalRun(nodes, Path.cwd())

    return start
