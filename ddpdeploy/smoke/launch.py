"""The run plan of a smoke run: the job as it runs here, and what every node's agent gets.

Pure: from a spec, the job a smoke run starts (CPU, gloo, the run's extra arguments, a
chaos run's restarts), the run-only env the launch contract adds for it, and for local
processes each node's argv and env on the job's target (its layout's names, node ranks and
injected env), with node addresses mapped to 127.0.0.1: the same container command the
cluster runs, with the in-image paths swapped for this checkout's and this interpreter's
torchrun as the launcher.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ddpdeploy.contract import CHECKPOINT_DIR_ENV, LaunchContract, RunRecord
from ddpdeploy.errors import UserError
from ddpdeploy.smoke.backend import Node
from ddpdeploy.smoke.runner import KillAt
from ddpdeploy.spec import JobSpec, spec_with
from ddpdeploy.targets import launch_contract

LOOPBACK = "127.0.0.1"
CHECKPOINT_ENV = CHECKPOINT_DIR_ENV  # a local run's folder replaces the mount path


@dataclass(frozen=True)
class LocalNode:
    hostname: str
    rank: int | None  # static node rank; None when the rendezvous assigns it
    argv: list[str]
    env: dict[str, str]


def cpu_spec(spec: JobSpec) -> JobSpec:
    """The job as a CPU run: no GPUs, gloo, the same processes per node, as `compose --cpu`
    and every smoke run turn it. (A run on another port passes it to the launch contract,
    `port=`: some targets fix the spec's.)"""
    return spec_with(spec, {"gpus": 0, "procs": spec.procs_per_node, "backend": "gloo"})


def nodes_of(contract: LaunchContract) -> list[Node]:
    """The job's nodes in order, with their static node rank (None under c10d)."""
    return [Node(n.hostname, _rank(contract.node_env(n))) for n in contract.nodes]


def _rank(env: dict[str, str]) -> int | None:
    rank = env.get("PET_NODE_RANK")
    return int(rank) if rank is not None else None


def with_args(spec: JobSpec, *args: str) -> JobSpec:
    """The job with ``args`` appended to its command's arguments (validated)."""
    command = spec.command.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return spec_with(spec, {"command": {**command, "args": [*spec.command.args, *args]}})


def with_steps(spec: JobSpec, steps: int | None, train_args: list[str] | None = None) -> JobSpec:
    """`--steps N`: the built-in trainer's flag; a script's own arguments go after `--`.

    It overrides a ``--steps`` of the spec file's args (argparse keeps the last), but not
    one given after ``--`` on the same command line (``train_args``): which was meant?"""
    if steps is None:
        return spec
    if not spec.command.builtin:
        entry = "command.script" if spec.command.script else "command.module"
        raise UserError(
            f"--steps: sets the built-in trainer's steps, and {entry} runs your own code; "
            "pass its arguments after `--` (e.g. ddpdeploy smoke -- --epochs 2)"
        )
    given = _flag_value(train_args or [], "--steps")
    if given is not None:
        raise UserError(
            f"--steps {steps}: the arguments after `--` also set --steps {given}; "
            "give the step count once"
        )
    return with_args(spec, "--steps", str(steps))


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag V`` or ``--flag=V``), if any."""
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1] if i + 1 < len(args) else ""
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def chaos_spec(spec: JobSpec, kill_at: KillAt) -> tuple[JobSpec, int]:
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
            spec = spec_with(spec, {"checkpoint": {"claimName": "smoke"}})
        if not any(a.startswith("--checkpoint-every") for a in spec.command.args):
            every = max(1, kill_at.step // 2) if kill_at.step is not None else 1
            spec = with_args(spec, "--checkpoint-every", str(every))
    return spec, restarts or 1


def run_restarts(restarts: int | None, kill: bool) -> int | None:
    """A run's torchrun restarts: a --kill-at run's (``restarts``) for the kill run only.
    Its clean runs get none: they are the baseline, and a rank that failed there and was
    restarted would pass for a clean run (a crash and a resume, compared as uninterrupted)."""
    return restarts if kill or restarts is None else 0


# ddpkit's chaos hold (train/ddpkit.py reads the same names): every rank waits at the step
# until the runner appends a byte to the release file, so a --kill-at STEP kill lands
# there (see `hold_env`).
HOLD_STEP_ENV = "DDPDEPLOY_CHAOS_HOLD_STEP"
HOLD_RELEASE_ENV = "DDPDEPLOY_CHAOS_RELEASE"
CONTAINER_RELEASE = "/tmp/ddpdeploy-chaos-release"  # every container's own /tmp (tmpfs)


def hold_env(kill_at: KillAt | None, release: str | None = None) -> dict[str, str]:
    """The chaos run's env that makes every rank hold at a --kill-at STEP (ddpkit's
    step_done and log("step")) until the runner has killed and appended a byte to
    ``release``; empty for a time or checkpoint kill and for every clean run."""
    if kill_at is None or kill_at.step is None:
        return {}
    return hold_steps_env([kill_at.step], release)


def hold_steps_env(steps: list[int], release: str | None = None) -> dict[str, str]:
    """Hold at each of ``steps`` in turn (the chaos harness kills several times in one
    run): the i-th holds until ``release`` has i + 1 bytes."""
    env = {HOLD_STEP_ENV: ",".join(str(s) for s in sorted(steps))}
    if release is not None:
        env[HOLD_RELEASE_ENV] = release
    return env


# torch says (on stderr) which of its APIs a process used first: the runner reads from it
# whether a rank joined a process group, saved or loaded (smoke.runner, API_USAGE).
API_USAGE_ENV = {"PYTORCH_API_USAGE_STDERR": "1"}


def run_env(
    restarts: int | None = None,
    checkpoint_dir: str | None = None,
    hold: dict[str, str] | None = None,
) -> dict[str, str]:
    """Env for this run only: torch's API usage lines, a chaos run's restarts and hold
    (`hold_env`) and where this run's checkpoint folder is. The rank-prefixed output the
    runner reads and what ran (the spec's sha256, the image) the launch contract adds, as on
    every target."""
    env = {**API_USAGE_ENV, **(hold or {})}
    if restarts is not None:
        env["PET_MAX_RESTARTS"] = str(restarts)
    if checkpoint_dir is not None:
        env[CHECKPOINT_ENV] = checkpoint_dir
    return env


def _contract_nodes(
    contract: LaunchContract,
    trainer_path: str,
    checkpoint_dir: str | None = None,
    python: str = sys.executable,
) -> list[LocalNode]:
    hosts = {n.address: LOOPBACK for n in contract.nodes}
    # This interpreter's torchrun, so the smoke run uses the torch it was installed with.
    launcher = [python, "-m", "torch.distributed.run"]
    argv = contract.container_command(trainer_path, checkpoint_dir, launcher)
    out = []
    for node in contract.nodes:
        env = contract.node_env(node, hosts)
        if "PET_RDZV_CONF" in env:
            # One agent hosts the c10d store, named: an agent that may host falls back to
            # a client when the port is bound already, and waits on whatever holds it.
            host = "1" if node.index == 0 else "0"
            env["PET_RDZV_CONF"] = f"{env['PET_RDZV_CONF']},is_host={host}"
        out.append(LocalNode(node.hostname, _rank(env), argv, env))
    return out


def local_nodes(
    spec: JobSpec,
    port: int,
    trainer_path: str,
    checkpoint_dir: str | None = None,
    max_restarts: int | None = None,
    hold: dict[str, str] | None = None,
) -> list[LocalNode]:
    """Every node of ``spec`` as a local torchrun agent. ``max_restarts`` overrides the
    contract's torchrun restarts for this run only (chaos runs need at least one); ``hold``
    is a chaos run's `hold_env` (the local target adds the release file)."""
    env = run_env(max_restarts, checkpoint_dir, hold=hold)
    # The record names the spec smoke was given, not the CPU job derived from it.
    contract = launch_contract(cpu_spec(spec), port, run_env=env, record=RunRecord().of(spec))
    return _contract_nodes(contract, trainer_path, checkpoint_dir)
