"""`ddpdeploy smoke`: the job's nodes as torchrun agents on this host (`--local`) or as a
compose project (`--docker`), on CPU; the progress view and the report live here."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ddpdeploy.commands.options import count_option, number_option, spec_command
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.signals import interrupted
from ddpdeploy.text import plain_lines

if TYPE_CHECKING:
    from ddpdeploy.image.build import BuiltImage
    from ddpdeploy.report import Say
    from ddpdeploy.smoke.backend import RunBackend
    from ddpdeploy.smoke.local import WorkspaceRuns
    from ddpdeploy.smoke.runner import Kill, KillAt, Outcome, Ranks
    from ddpdeploy.spec import JobSpec


@spec_command
def smoke(
    spec: JobSpec,
    train_args: list[str],
    local: Annotated[
        bool | None,
        typer.Option("--local", help="Run the nodes as local processes (no Docker); the default."),
    ] = None,
    steps: Annotated[
        int | None,
        count_option(
            "--steps",
            minimum=1,
            help="The built-in trainer's steps; a script's own arguments go after `--`.",
        ),
    ] = None,
    timeout: Annotated[
        float,
        number_option("--timeout", minimum=1, help="Give up after this many seconds."),
    ] = 900,
    kill_at: Annotated[
        str | None,
        typer.Option(
            "--kill-at",
            help="Chaos: after a clean run, run again and SIGKILL one worker of a node "
            "without rank 0 at a step event (8), after a time (20s) or after the first "
            "checkpoint (checkpoint); the job must finish again.",
        ),
    ] = None,
    ranks: Annotated[
        str,
        typer.Option(
            "--ranks",
            help="Whose output to show live: a list of global ranks (0,3) or all; each "
            "line is prefixed with its rank when more than one rank is shown.",
        ),
    ] = "0",
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="--local: keep the checkpoint folder of the last run (default: each run "
            "starts from an empty one).",
        ),
    ] = False,
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
    """Run the job as a CPU smoke test (gloo): one torchrun agent per node, each with the
    env the cluster's operator would give that node. The run succeeds when every node's
    agent exits 0; the job's own output (rank 0's by default) is shown as it comes.

    Example: ddpdeploy smoke --local --nodes 2 --procs 2 --steps 20

    \b
    Your own script (`ddpdeploy init --script train.py`): its arguments after `--`
      ddpdeploy smoke --local --nodes 2 -- --epochs 1 --lr 0.1
    """
    from ddpdeploy.commands.console import ConsoleReport
    from ddpdeploy.smoke import runner
    from ddpdeploy.smoke.local import WorkspaceRuns

    shown, chaos = _checked_flags(local, docker, ranks, kill_at, resume)
    if chaos is not None:
        chaos.check(timeout)  # before the job is announced
    if not docker and (keep_volume or base_image is not None):
        flag = "--keep-volume" if keep_volume else "--base-image"
        raise UserError(f"{flag}: only with --docker (a --local run uses no image or volume)")
    spec = _runnable(spec, steps, train_args, force, docker)
    shown.check(spec.nodes * spec.procs_per_node)
    restarts = None
    if chaos is not None:
        spec, restarts = _chaos_spec(spec, chaos)
    folder = None if docker else _checkpoint_folder(spec, chaos is not None, resume)
    world = _announce(spec, docker)
    options = runner.RunOptions(
        world_size=world,
        steps=steps,
        timeout=timeout,
        ranks=shown,
        kill_at=chaos,
        checkpoint_dir=lambda: folder,
        volume_unwatched=docker and spec.checkpoint is not None,
        own_code=_own_code(spec),
    )
    outcomes: dict[str, Outcome] = {}
    report = ConsoleReport()
    try:
        if docker:
            start = _docker_target(spec, restarts, base_image, keep_volume, chaos)
            outcomes.update(runner.smoke(start, report, options))
        else:
            runs = WorkspaceRuns(Path.cwd())
            start = _local_target(spec, restarts, folder, resume, chaos, runs, report.say)
            with _one_local_run(), _workspace_writes(spec, runs):
                outcomes.update(runner.smoke(start, report, options))
    except KeyboardInterrupt as exc:  # every target is torn down on its way out
        raise interrupted(exc, "the run was stopped and its processes ended") from None
    except OperationError as exc:
        if "clean" in outcomes and _static_plain(spec):  # the kill run failed
            raise OperationError(f"{exc}\n{STATIC_RESTART}", exc.exit_code) from None
        raise
    _report(outcomes)


def _checked_flags(
    local: bool | None, docker: bool, ranks: str, kill_at: str | None, resume: bool
) -> tuple[Ranks, KillAt | None]:
    """The flags that go together, and the ranks shown and the kill, parsed."""
    from ddpdeploy.smoke import runner

    if local and docker:
        raise UserError("--local and --docker: pick one (processes here, or a compose project)")
    shown = runner.Ranks.parse(ranks)
    chaos = runner.KillAt.parse(kill_at) if kill_at is not None else None
    if resume and docker:
        raise UserError("--resume: only with --local (each --docker run gets a new volume)")
    if resume and chaos:
        raise UserError("--resume: not with --kill-at, whose runs each start from empty")
    return shown, chaos


def _runnable(
    spec: JobSpec, steps: int | None, train_args: list[str], force: bool, docker: bool
) -> JobSpec:
    """The job with --steps, once this host can run it: its cores, its script, torch."""
    from ddpdeploy.smoke import launch
    from ddpdeploy.smoke.budget import check_cpu_budget

    spec = launch.with_steps(spec, steps, train_args)
    check_cpu_budget(spec.nodes, spec.procs_per_node, force)
    if not docker or not spec.image:  # a ready --image carries its own workspace
        _check_script(spec)
    if not docker and spec.command.module is not None:  # an image may install its package
        from ddpdeploy.smoke.local import check_module

        pythonpath = spec.env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
        check_module(Path.cwd(), spec.command.module, pythonpath)
    if not docker and importlib.util.find_spec("torch") is None:
        raise UserError(
            "torch is not installed here: pip install torch==2.13.0 (CPU) or 'ddpdeploy[train]'"
        )
    return spec


def _chaos_spec(spec: JobSpec, chaos: KillAt) -> tuple[JobSpec, int]:
    """The job as --kill-at runs it, and its restarts; a note where an own script's
    restart may not come back."""
    from ddpdeploy.smoke import launch

    spec, restarts = launch.chaos_spec(spec, chaos)
    if _static_plain(spec):
        typer.echo(f"smoke: note: {STATIC_RESTART}", err=True)
    return spec, restarts


# Under static rendezvous torchrun keeps one store for every restart of the workers, and
# torch's process group then reads peers' stale addresses (docs/own-script.md).
STATIC_RESTART = (
    "rendezvous.mode static: a plain init_process_group may fail with 'Connection refused' "
    "or hang after a restart (restarted workers read peers' stale addresses from the store "
    "torchrun keeps); use mode c10d (the default) or ddpkit.init_process_group"
)


def _own_code(spec: JobSpec) -> str | None:
    """The spec field that names the user's code; None for the built-in trainer."""
    if spec.command.script is not None:
        return "command.script"
    return "command.module" if spec.command.module is not None else None


def _static_plain(spec: JobSpec) -> bool:
    """A script of the user's under static rendezvous: its restarts may not come back (the
    built-in trainer's do: ddpkit.init_process_group)."""
    return not spec.command.builtin and not spec.c10d


def _announce(spec: JobSpec, docker: bool) -> int:
    """One line of what runs where (and a note on secret env); the world size."""
    from ddpdeploy.smoke.compose import secret_env_note

    world = spec.nodes * spec.procs_per_node
    where = "in docker-compose" if docker else "on 127.0.0.1"
    typer.echo(
        f"smoke: {spec.name}: {spec.nodes} node(s) x {spec.procs_per_node} proc(s) = "
        f"world size {world}, gloo {where}",
        err=True,
    )
    note = secret_env_note(spec, os.environ)
    if note:
        typer.echo(f"smoke: {note}", err=True)
    return world


def _check_script(spec: JobSpec) -> None:
    """A script the job names must be a file of the workspace (this folder) as the image
    would hold it, before anything starts: a local run that the image could not repeat is
    no smoke test of it."""
    from ddpdeploy.image.context import check_script

    check_script(Path.cwd(), spec.command.script)


def _checkpoint_folder(spec: JobSpec, chaos: bool, resume: bool = False) -> Path | None:
    """Where a local run's checkpoints go: .ddpdeploy/checkpoints/NAME, when the job has a
    checkpoint volume (every --kill-at run gets one); with --resume also when it has none
    but that folder holds what a --kill-at run saved there (said in one line)."""
    from ddpdeploy.fs import linked_below
    from ddpdeploy.paths import local_checkpoints

    folder = Path.cwd() / local_checkpoints(spec.name)
    if spec.checkpoint is None and not chaos:
        # --resume keeps the last run's checkpoint folder: a --kill-at run of this job had
        # one although the spec has none, and the user resumes what that run saved.
        if not resume or not _holds_files(folder):
            return None
        typer.echo(
            f"smoke: --resume: the spec has no checkpoint volume, but {folder} holds files "
            "of an earlier run (a --kill-at run, or one whose spec had a checkpoint volume); "
            "this run gets that folder, as that run did",
            err=True,
        )
    # Never through a link: the folder is emptied before each run.
    linked_below(Path.cwd(), local_checkpoints(spec.name))
    return folder


def _holds_files(folder: Path) -> bool:
    """Whether ``folder`` (never followed through a link) holds a file anywhere below."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return any(files for _, _, files in os.walk(folder))


@contextlib.contextmanager
def _one_local_run() -> Iterator[None]:
    """One `smoke --local` per workspace at a time (a lock on its .ddpdeploy folder): a
    second would empty the first's checkpoint folder under it and set aside its files."""
    from ddpdeploy.fs import FolderBusy, FolderLock, own_folder
    from ddpdeploy.paths import OWN_DIR

    try:
        lock = FolderLock(own_folder(Path.cwd() / OWN_DIR), "smoke")
    except FolderBusy:
        raise UserError(
            f"smoke --local: another smoke --local is running in {Path.cwd()}; wait for it "
            "to end (a second run would empty its checkpoint folder)"
        ) from None
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def _workspace_writes(spec: JobSpec, runs: WorkspaceRuns) -> Iterator[None]:
    """Say in one line, after the runs (green or not), which files they wrote in the
    workspace outside the checkpoint folder: the pod's read-only root would refuse them, and
    a local run cannot make this host's file system read-only. What the last run wrote is
    recorded, for the next run to set aside."""
    from ddpdeploy.smoke import workspace

    try:
        yield
    finally:
        wrote = runs.end()
        volume = spec.checkpoint is not None
        line = workspace.warning(wrote, volume) if spec.security.read_only_root_filesystem else None
        if line:  # the names of files the job wrote: plain text
            typer.echo(f"smoke: {plain_lines(line)}", err=True)


def _free_port() -> int:
    """A port no process holds now, below the kernel's ephemeral range where it can: the
    kernel hands ephemeral ports to every outgoing connection (the run's own gloo pairs
    among them), so one chosen there can be taken before torchrun binds it. A foreign
    listener on a c10d endpoint makes the agent wait on it as on a store."""
    low = _ephemeral_low()
    for port in random.sample(range(_LOW_PORT, low), min(64, max(0, low - _LOW_PORT))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room below the range: any free port
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_LOW_PORT = 20000  # above the well-known and most registered servers' ports


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _local_target(
    spec: JobSpec,
    restarts: int | None,
    folder: Path | None,
    resume: bool,
    chaos: KillAt | None,
    runs: WorkspaceRuns,
    say: Say,
) -> Callable[[bool], RunBackend]:
    """Start the job's agents on a fresh port, each run in a fresh checkpoint folder and
    with what earlier runs wrote in the workspace set aside, unless ``resume``; the chaos
    run's with the hold at its --kill-at step. A run starts under its progress bar, so what
    it says goes through the report's ``say`` (a line of its own above the bar; typer.echo
    ran on from the bar's line on a terminal)."""
    from ddpdeploy.fs import own_folder
    from ddpdeploy.paths import OWN_DIR, trainer_script
    from ddpdeploy.smoke import launch, workspace
    from ddpdeploy.smoke.launch import hold_env, local_nodes
    from ddpdeploy.smoke.local import LocalRun, fresh_folder

    def start(kill: bool = False) -> LocalRun:
        moved = runs.begin(keep=resume)
        note = workspace.set_aside_note(moved, str(runs.aside_rel)) if moved else None
        if note:
            say(f"smoke: {note}")
        checkpoint_dir = None
        if folder is not None:
            own_folder(Path.cwd() / OWN_DIR)  # ignored by the user's git from inside
            if fresh_folder(folder, keep=resume):
                say(f"smoke: emptied {folder} (--resume keeps it)")
            checkpoint_dir = str(folder)
        hold = hold_env(chaos) if kill else None
        trainer = str(trainer_script())
        nodes = local_nodes(
            spec, _free_port(), trainer, checkpoint_dir, launch.run_restarts(restarts, kill), hold
        )
        return LocalRun(nodes, Path.cwd())

    return start


def _docker_target(
    spec: JobSpec,
    restarts: int | None,
    base_image: str | None,
    keep_volume: bool,
    chaos: KillAt | None = None,
) -> Callable[[bool], RunBackend]:
    """Check the engine, get the image; each run a fresh project (the chaos run's with the
    hold at its --kill-at step)."""
    from ddpdeploy.adapters.docker_engine import image_id
    from ddpdeploy.contract import RunRecord
    from ddpdeploy.smoke import launch
    from ddpdeploy.smoke.compose import compose_plan
    from ddpdeploy.smoke.composerun import ComposeRun, engine

    client = engine()  # no engine: one line pointing to --local, before any build
    if spec.image:  # a ready image: the record names the image ID that runs
        image, record = spec.image, RunRecord(image_digest=image_id(client, spec.image))
    else:  # built here: its ID and the workspace's git facts, from the build
        built = _build_image(spec, base_image)
        image, record = built.reference, built.record()
    hold = launch.hold_env(chaos, launch.CONTAINER_RELEASE)
    jobs = {
        kill: compose_plan(
            spec,
            image,
            launch.run_env(launch.run_restarts(restarts, kill), hold=hold if kill else {}),
            record,
        )
        for kill in (False, True)
    }

    def start(kill: bool = False) -> ComposeRun:
        job = jobs[kill]
        release = launch.CONTAINER_RELEASE if kill and hold else None
        return ComposeRun(
            job.project,
            job.nodes,
            job.name,
            keep_volume=keep_volume,
            client=client,
            release=release,
        )

    return start


def _build_image(spec: JobSpec, base_image: str | None) -> BuiltImage:
    """`ddpdeploy build` of this folder, in this process (no second interpreter to start),
    its progress on our stderr. Skipped when the image is up to date."""
    from ddpdeploy.commands.console import ConsoleReport
    from ddpdeploy.image.build import build_image
    from ddpdeploy.smoke.compose import LOCAL_REPO
    from ddpdeploy.spec import spec_with

    local = spec_with(spec, {"image": f"{LOCAL_REPO}/{spec.name}"})
    return build_image(local, workspace=Path.cwd(), base_image=base_image, report=ConsoleReport())


# ---- the report -------------------------------------------------------------------------


def _echo_plain(text: str) -> None:
    """A report line on stdout; what in it came from the job (a weights checksum, a
    diagnostics line) cannot reach the terminal as an escape."""
    typer.echo(plain_lines(text))


def _report(outcomes: dict[str, Outcome]) -> None:
    """The last run's report on stdout; with --kill-at, the kill and the comparison."""
    outcome = outcomes.get("run") or outcomes["kill"]
    echo = _echo_plain
    echo(f"wall time       {outcome.wall:.1f} s")
    if outcome.steps is not None:
        echo(f"steps           {outcome.steps}")
    if outcome.steps_per_s is not None:
        echo(f"steps/s         {outcome.steps_per_s:.1f}")
    if outcome.weights_sha256 is not None:
        echo(f"weights_sha256  {outcome.weights_sha256}")
    for kind, label in (("probe", "probe"), ("ranks", "rank times")):  # ddpkit's, if any
        if kind in outcome.diagnostics:
            echo(f"{label:<16}{outcome.diagnostics[kind]}")
    for node, code in outcome.exit_codes.items():
        echo(f"exit code       {code}  {node}")
    for warning in outcome.warnings:
        typer.echo(f"smoke: warning: {plain_lines(warning)}", err=True)
    kill, clean = outcome.kill, outcomes.get("clean")
    if kill is not None and clean is not None:
        _report_kill(outcome, kill, clean, outcomes.get("again"))


def _report_kill(outcome: Outcome, kill: Kill, clean: Outcome, again: Outcome | None) -> None:
    """What happened after the kill (restart, resume, recovery), then, apart from it, the
    weights against the clean run's (and a second clean run's when they differ)."""
    echo = _echo_plain
    # When it struck (a checkpoint's step, the clock's second), and what was asked if other.
    asked = "" if kill.when in ("", str(kill.at_)) else f" (asked: {kill.at_})"
    echo(f"killed          {kill.what} of {kill.node} at {kill.when or kill.at_}{asked}")
    started_over = kill.restarted_at is not None and not kill.loaded and kill.resumed_step is None
    if kill.restarted_at is not None:
        how = "it loaded a file (torch.load)" if kill.loaded else "no torch.load: it started over"
        if started_over and not kill.saved_before:
            how += " (it had saved no checkpoint before the kill)"
        elif started_over and not kill.lost_progress:
            how += " (no checkpoint was complete before the restart)"
        if kill.resumed_step is not None:
            how = f"it resumed from step {kill.resumed_step}"
        echo(f"restarted       {kill.restarted_at - kill.at:.1f} s after the kill; {how}")
    if kill.recovered_at is None:
        echo("recovery        not observed (no step event after a restart of the workers)")
    else:
        echo(
            f"recovery        {kill.recovered_at - kill.at:.1f} s "
            f"(kill -> step {kill.recovered_step} after torchrun restarted the workers)"
        )
    echo(f"finished        every node exited 0 after the kill{_steps_of(outcome)}")
    if kill.lost_progress:
        raise OperationError(
            "--kill-at: the restarted workers started over (no torch.load after the restart) "
            "although the job had saved with torch.save before the kill, so it lost that "
            "progress: load the newest checkpoint when the script starts (ddpkit.load_latest, "
            "or torch.load of your snapshot under $DDPDEPLOY_CHECKPOINT_DIR)"
        )
    _report_weights(outcome, clean, again)


def _steps_of(outcome: Outcome) -> str:
    return f", at step {outcome.steps}" if outcome.steps is not None else ""


def _report_weights(outcome: Outcome, clean: Outcome, again: Outcome | None) -> None:
    from ddpdeploy.smoke.runner import same_weights

    echo = _echo_plain
    same = same_weights(outcome, clean)
    if same is None:
        echo("clean run       not compared (the job prints no `done` weights_sha256)")
        return
    echo(f"clean run       {clean.weights_sha256}{' (same)' if same else ''}")
    if same or again is None:
        return
    if same_weights(again, clean):
        raise OperationError(
            "--kill-at: the job resumed and finished, but its weights differ from two "
            "identical clean runs of the same job: the resume after the kill was not exact "
            "(state the checkpoint leaves out: the optimizer's, the sampler's epoch, RNG)"
        )
    echo(
        f"clean again     {again.weights_sha256}: two clean runs differ, so the script is not "
        "deterministic and the weights cannot show whether the resume was exact (seed every "
        "random source, e.g. torch.manual_seed, to compare)"
    )
