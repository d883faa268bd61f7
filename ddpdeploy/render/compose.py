"""JobSpec -> a docker-compose project (a plain dict): each node of the job as a service.

Pure: no network, no clock, no randomness; same spec, same dict. Every service is started
as its pod would be on the cluster, in the layout of the job's target: the same container
command, the env its pod gets there (from the launch contract, the operator's or Trainer's
injection included), the pod's hostname as both service name and hostname, and its address
(`<host>.<subdomain>` for TrainJob and Indexed Job) as a network alias, so MASTER_ADDR and
the rendezvous endpoint are the same strings as on the cluster and resolve through the
project network's DNS.

The keys used are those both the Compose Specification and docker-compose 1.29 (Debian 12)
accept; tests check the file against both.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING
from typing import Any

from ddpdeploy.contract import LaunchContract
from ddpdeploy.errors import UserError
from ddpdeploy.render.local import cpu_spec
from ddpdeploy.spec import JobSpec
from ddpdeploy.spec import quantity as spec_quantity
from ddpdeploy.targets import launch_contract

Obj = dict[str, Any]

NETWORK = "ddp"
CHECKPOINT_VOLUME = "checkpoints"
ROLE_LABEL = "ddpdeploy.role"  # "node" for a node of the job, "volume-init" for the helper


# Docker wants shm_size in bytes.
def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity (already validated by the spec) as whole bytes, rounded up,
    read by the spec's one quantity parser."""
    amount = spec_quantity(quantity)[1]
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def _escape(text: str) -> str:
    """Compose interpolates $VAR from the host's env; the command's shell variables ($i,
    $@, …) must reach the container as written."""
    return text.replace("$", "$$")


def compose_job(spec: JobSpec, cpu: bool | None = None) -> JobSpec:
    """The job as compose runs it: with ``cpu`` (the default when the spec has no GPUs) a
    CPU job on gloo with the same processes per node, as local smoke runs turn it."""
    if cpu is None:
        cpu = spec.gpus == 0
    return cpu_spec(spec) if cpu else spec


def _restart(spec: JobSpec) -> str:
    """Elastic jobs restart failed nodes, as the operator restarts their pods (bounded by
    backoffLimit when set); a static job's node is not restarted."""
    if not spec.elastic:
        return "no"
    limit = spec.run_policy.backoff_limit
    return "on-failure" if limit is None else f"on-failure:{limit}"


def _service(spec: JobSpec, contract: LaunchContract, node_index: int) -> Obj:
    node = contract.nodes[node_index]
    hostname = node.hostname
    # Peers reach a node by its address: the hostname itself (PyTorchJob) or
    # hostname.subdomain (TrainJob, Indexed Job), which a network alias resolves here.
    networks: Any = [NETWORK]
    if node.address != hostname:
        networks = {NETWORK: {"aliases": [node.address]}}
    service: Obj = {
        "image": _escape(spec.image or ""),
        "hostname": hostname,
        "labels": {ROLE_LABEL: "node"},
        # The pod's `command` replaces the image's ENTRYPOINT; compose's `command` would not.
        "entrypoint": [_escape(arg) for arg in contract.container_command()],
        # Unmapped: node hostnames (and a node's own address, PET_LOCAL_ADDR) resolve on
        # the project network as they do on the cluster.
        "environment": {k: _escape(v) for k, v in sorted(contract.node_env(node).items())},
        "networks": networks,
        "restart": _restart(spec),
        "stop_grace_period": f"{spec.termination_grace_period_seconds}s",
    }
    if spec.shm_size:
        service["shm_size"] = quantity_bytes(spec.shm_size)
    if spec.checkpoint:
        service["volumes"] = [_checkpoint_mount(spec)]
        service["depends_on"] = {
            volume_init_name(spec): {"condition": "service_completed_successfully"}
        }
    if spec.gpus:
        device = {"driver": "nvidia", "count": spec.gpus, "capabilities": ["gpu"]}
        service["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
    return service


def _checkpoint_mount(spec: JobSpec) -> Obj:
    assert spec.checkpoint is not None
    return {"type": "volume", "source": CHECKPOINT_VOLUME, "target": spec.checkpoint.mount_path}


def volume_init_name(spec: JobSpec) -> str:
    return f"{spec.name}-volume-init"


def _volume_init(spec: JobSpec) -> Obj:
    """A one-shot service that opens the new checkpoint volume to the nodes' user.

    Docker creates a named volume root-owned, and the image's trainer runs as a non-root
    user (the cluster's PVC has fsGroup or the storage's own permissions for this). The
    renderer does not know that user's uid, so the volume gets /tmp's mode: writable by
    anyone, files deletable by their owner."""
    assert spec.checkpoint is not None
    return {
        "image": _escape(spec.image or ""),
        "labels": {ROLE_LABEL: "volume-init"},
        "user": "0:0",
        "entrypoint": ["chmod", "1777", spec.checkpoint.mount_path],
        "network_mode": "none",
        "volumes": [_checkpoint_mount(spec)],
        "restart": "no",
    }


def render_compose(
    spec: JobSpec, cpu: bool | None = None, run_env: Mapping[str, str] | None = None
) -> Obj:
    """The compose project for ``spec``: one service per node, named like its pod.
    ``run_env``: env for one run only (a smoke run's), as the launch contract takes it."""
    if not spec.image:
        raise UserError(
            "image: required to render a compose file; set image in ddpdeploy.yaml or pass "
            "--image (ddpdeploy build prints one)"
        )
    job = compose_job(spec, cpu)
    contract = launch_contract(job, run_env=run_env)
    services = {node.hostname: _service(job, contract, i) for i, node in enumerate(contract.nodes)}
    project: Obj = {
        "services": services,
        "networks": {NETWORK: {"driver": "bridge"}},
    }
    if job.checkpoint:
        services[volume_init_name(job)] = _volume_init(job)
        project["volumes"] = {CHECKPOINT_VOLUME: {}}
    return project
