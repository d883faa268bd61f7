"""`ddpdeploy smoke --local`: the job's nodes as torchrun agents on this host, on CPU."""

from __future__ import annotations

import importlib.util
import json
import socket
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.options import spec_command
from ddpdeploy.spec import JobSpec


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _event(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def _failure(hostname: str, env: dict[str, str], code: int, tail: list[str]) -> str:
    """Which node and rank failed, and the worker's own last lines: torchrun's traceback
    and summary block after them only repeat the rank, which goes into the first line."""
    ranks = [
        t.split(":", 1)[1].split("(")[0].strip()
        for t in tail
        if t.strip().startswith("rank ") and ":" in t
    ]
    agent_tb = [
        i
        for i, t in enumerate(tail)
        if t.startswith("Traceback (most recent call")
        and any("ChildFailedError" in u for u in tail[i:])
    ]
    if agent_tb:
        tail = tail[: agent_tb[-1]]
    parts = []
    if "PET_NODE_RANK" in env:
        parts.append(f"node rank {env['PET_NODE_RANK']}")
    if ranks:
        parts.append(f"global rank {ranks[0]}")
    where = f"node {hostname}" + (f" ({', '.join(parts)})" if parts else "")
    lines = "\n".join(f"  {t}" for t in tail[-12:])
    return f"{where} exited with code {code}; its last lines:\n{lines}"


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
) -> None:
    """Run the job as a CPU smoke test (gloo): one torchrun agent per node on 127.0.0.1,
    each with the env the cluster's operator would give that node.

    Example: ddpdeploy smoke --local --nodes 2 --procs 2 --steps 20
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ddpdeploy.adapters.local import Line, LocalRun
    from ddpdeploy.paths import trainer_script
    from ddpdeploy.render.local import plan

    if not local:
        raise UserError("--no-local: only local processes are supported so far; pass --local")
    if importlib.util.find_spec("torch") is None:
        raise UserError(
            "torch is not installed here: pip install torch==2.13.0 (CPU) or 'ddpdeploy[train]'"
        )
    if steps is not None:
        spec = spec.model_copy(
            update={
                "command": spec.command.model_copy(
                    update={"args": [*spec.command.args, "--steps", str(steps)]}
                )
            }
        )
    checkpoint_dir = None
    if spec.checkpoint:
        checkpoint_dir = str(Path(".ddpdeploy", "checkpoints", spec.name).resolve())
    nodes = plan(spec, _free_port(), str(trainer_script()), checkpoint_dir)
    console = Console(stderr=True)
    world = spec.nodes * spec.procs_per_node
    console.print(
        f"smoke: {spec.name}: {spec.nodes} node(s) x {spec.procs_per_node} proc(s) = "
        f"world size {world}, gloo on 127.0.0.1"
    )
    done: dict[str, Any] | None = None
    first_step_at: float | None = None
    started = time.monotonic()
    progress = Progress(
        TextColumn("[bold]training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    )
    task = progress.add_task("train", total=steps, info="rendezvous…")

    def show(line: Line) -> None:
        """Rank 0's JSON lines drive the display; the last `done` is the result."""
        nonlocal done, first_step_at
        event = _event(line.text) if line.stream == "stdout" else None
        if event is None:
            return
        if event["event"] == "step":
            first_step_at = first_step_at or time.monotonic()
            progress.update(
                task,
                completed=int(event["step"]),
                info=f"loss {event.get('loss', float('nan')):.4f}",
            )
        elif event["event"] == "done":
            done = event
            progress.update(task, completed=done["step"], info="done")
        elif event["event"] in ("start", "checkpoint"):
            if event.get("total_steps"):
                progress.update(task, total=event["total_steps"])
            progress.console.print(f"[dim]{line.hostname}: {line.text}", soft_wrap=True)

    with progress, LocalRun(nodes, Path.cwd()) as run:
        for line in run.events():
            if line is not None:
                show(line)
            failed = run.failed()
            if failed is not None:
                run.drain()
                raise OperationError(
                    _failure(
                        failed.node.hostname,
                        failed.node.env,
                        failed.proc.returncode,
                        list(failed.tail),
                    )
                )
            if run.finished():
                for rest in run.drain():
                    show(rest)
                break
            if time.monotonic() - started > timeout:
                raise OperationError(f"--timeout: the run did not finish within {timeout:g}s")
    wall = time.monotonic() - started
    if done is None:
        raise OperationError("the trainer ended without its final 'done' line")
    train_time = time.monotonic() - (first_step_at or started)
    rate = done["step"] / train_time if train_time > 0 else float("nan")
    typer.echo(f"wall time       {wall:.1f} s")
    typer.echo(f"steps           {done['step']}")
    typer.echo(f"steps/s         {rate:.1f}")
    typer.echo(f"weights_sha256  {done['weights_sha256']}")
