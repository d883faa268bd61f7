"""The local target: each node of the launch contract as a process on this host.

Pure: from a contract, the argv and env every node's torchrun agent gets on the job's
target (its layout's names, node ranks and injected env), with node addresses mapped to
127.0.0.1. The same container command the cluster runs, with the
in-image paths swapped for this checkout's and this interpreter's torchrun as the
launcher.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ddpdeploy.contract import LaunchContract
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import launch_contract

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LocalNode:
    hostname: str
    argv: list[str]
    env: dict[str, str]


def cpu_spec(spec: JobSpec, port: int) -> JobSpec:
    """The job as a CPU smoke run: no GPUs, gloo, rendezvous on ``port``."""
    rdzv = spec.rendezvous.model_copy(update={"port": port})
    return spec.model_copy(
        update={"gpus": 0, "procs": spec.procs_per_node, "backend": "gloo", "rendezvous": rdzv}
    )


def local_nodes(
    contract: LaunchContract,
    trainer_path: str,
    checkpoint_dir: str | None = None,
    python: str = sys.executable,
) -> list[LocalNode]:
    hosts = {n.address: LOOPBACK for n in contract.nodes}
    # This interpreter's torchrun, so the smoke run uses the torch it was installed with.
    launcher = [python, "-m", "torch.distributed.run"]
    argv = contract.container_command(trainer_path, checkpoint_dir, launcher)
    return [LocalNode(n.hostname, argv, contract.node_env(n, hosts)) for n in contract.nodes]


def plan(
    spec: JobSpec,
    port: int,
    trainer_path: str,
    checkpoint_dir: str | None = None,
    max_restarts: int | None = None,
) -> list[LocalNode]:
    """Every node of ``spec`` as a local torchrun agent. ``max_restarts`` overrides the
    contract's torchrun restarts for this run only (chaos runs need at least one)."""
    contract = launch_contract(cpu_spec(spec, port), port)
    nodes = local_nodes(contract, trainer_path, checkpoint_dir)
    if max_restarts is None:
        return nodes
    extra = {"PET_MAX_RESTARTS": str(max_restarts)}
    return [LocalNode(n.hostname, n.argv, {**n.env, **extra}) for n in nodes]
