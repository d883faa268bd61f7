"""JobSpec -> a docker-compose project (a plain dict): each node of the job as a service.

Pure: no network, no clock, no randomness; same spec, same dict. Every service is started
as its pod would be on the cluster, in the layout of the job's target: the same container
command, the env its pod gets there (from the launch contract, the operator's or Trainer's
injection included), the pod's hostname as both service name and hostname, and its address
(`<host>.<subdomain>` for TrainJob and Indexed Job) as a network alias, so MASTER_ADDR and
the rendezvous endpoint are the same strings as on the cluster and resolve through the
project network's DNS. Each node also runs with the pod's security settings
(render.pod): its UID/GID and fsGroup, no capabilities, no privilege escalation, and unless
the spec loosens it (`--writable-rootfs`) a read-only root with tmpfs where the pod has its
emptyDirs; so a green compose run means a working pod.

The keys used are those both the Compose Specification and docker-compose 1.29 (Debian 12)
accept; tests check the file against both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING
from typing import Any

from ddpdeploy.contract import LaunchContract, RunRecord
from ddpdeploy.errors import UserError
from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import pod_only_env
from ddpdeploy.smoke.backend import Node
from ddpdeploy.smoke.launch import cpu_spec, nodes_of
from ddpdeploy.spec import HOME_DIR, LOG_DIR, TMP_DIR, JobSpec, spec_with
from ddpdeploy.spec import quantity as spec_quantity
from ddpdeploy.targets import launch_contract

NETWORK = "ddp"
CHECKPOINT_VOLUME = "checkpoints"
ROLE_LABEL = "ddpdeploy.role"  # "node" for a node of the job, "volume-init" for the helper
LOCAL_REPO = "ddpdeploy-smoke"  # where a smoke run's own build is tagged
# Every node is a container on this one Docker host: past a few hundred the host, not the
# job, is under test (and rendering 2**31 services took GBs first).
MAX_COMPOSE_NODES = 256


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
    """c10d (and elastic) jobs restart failed nodes, which rejoin the rendezvous, as the
    operator restarts their pods (bounded by backoffLimit when set); a static job's node is
    not restarted (it could not rejoin a fixed master's round)."""
    if not spec.c10d:
        return "no"
    limit = spec.run_policy.backoff_limit
    return "on-failure" if limit is None else f"on-failure:{limit}"


def _security(spec: JobSpec) -> Obj:
    """The pod's securityContext as compose keys (render.pod's container_security and
    pod_security). The working directory stays the image's, as in the pod."""
    sec = spec.security
    out: Obj = {
        "user": f"{sec.run_as_user}:{sec.run_as_group}",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
    }
    if sec.fs_group != sec.run_as_group:
        out["group_add"] = [str(sec.fs_group)]  # the pod's fsGroup is a supplementary group
    if spec.network.rdma:
        out["cap_add"] = ["IPC_LOCK"]
    # The pod's emptyDirs: writable by anyone (an emptyDir is 0777), and exec, which
    # Docker's tmpfs default (noexec) would refuse to compiled caches. torchrun's log volume
    # on every pod, the other two under a read-only root; unsized (a smoke run is short).
    dirs = [TMP_DIR, HOME_DIR] if sec.read_only_root_filesystem else []
    out["tmpfs"] = [f"{path}:exec,mode=1777" for path in (*dirs, LOG_DIR)]
    if sec.read_only_root_filesystem:
        out["read_only"] = True
    return out


def _environment(spec: JobSpec, contract: LaunchContract, node_index: int) -> Obj:
    """The pod's env: the launch contract's for this node and the pod's own (where temp
    files and caches go); secretEnv by name only, its value taken from the environment
    compose runs in (never written into the file)."""
    values = {**pod_only_env(spec), **contract.node_env(contract.nodes[node_index])}
    env: Obj = {k: _escape(v) for k, v in values.items()}
    for name in spec.secret_env:
        env[name] = None
    return {k: env[k] for k in sorted(env)}


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
        "environment": _environment(spec, contract, node_index),
        "networks": networks,
        "restart": _restart(spec),
        "stop_grace_period": f"{spec.termination_grace_period_seconds}s",
        **_security(spec),
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
    """A one-shot service that hands the new checkpoint volume to the nodes' user.

    Docker creates a named volume root-owned; the nodes run as the pod's UID, so the
    volume becomes that UID's, in the pod's fsGroup (the kubelet hands a PVC to it)."""
    assert spec.checkpoint is not None
    sec = spec.security
    return {
        "image": _escape(spec.image or ""),
        "labels": {ROLE_LABEL: "volume-init"},
        "user": "0:0",
        "entrypoint": ["chown", f"{sec.run_as_user}:{sec.fs_group}", spec.checkpoint.mount_path],
        "network_mode": "none",
        "volumes": [_checkpoint_mount(spec)],
        "restart": "no",
    }


def secret_env_note(spec: JobSpec, environ: Mapping[str, str] | None = None) -> str | None:
    """One line on what becomes of secretEnv off the cluster: no Kubernetes Secret to read,
    so each name is passed from the environment compose (or a local run) starts in. With
    ``environ`` (a run starting now), which of them are set there."""
    names = sorted(spec.secret_env)
    if not names:
        return None
    text = f"secretEnv {', '.join(names)}: not read from Kubernetes Secrets here; "
    if environ is None:
        return text + "compose passes each from the environment `docker compose up` runs in"
    unset = [n for n in names if n not in environ]
    if not unset:
        return text + "passed from this environment"
    return text + f"passed from this environment, where {', '.join(unset)} is not set"


def render_compose(
    spec: JobSpec,
    cpu: bool | None = None,
    run_env: Mapping[str, str] | None = None,
    record: RunRecord | None = None,
) -> Obj:
    """The compose project for ``spec``: one service per node, named like its pod.
    ``run_env``: env for one run only (a smoke run's), as the launch contract takes it;
    ``record``: what ddpdeploy knows of the run (the image that runs). The record names
    ``spec``'s sha256, not that of the CPU job compose may run."""
    if not spec.image:
        raise UserError(
            "image: required to render a compose file; set image in ddpdeploy.yaml or pass "
            "--image (ddpdeploy build prints one)"
        )
    if spec.nodes > MAX_COMPOSE_NODES:
        raise UserError(
            f"nodes: compose runs every node on this host, at most {MAX_COMPOSE_NODES} (got "
            f"{spec.nodes}); use fewer nodes (--nodes), or render the job for the cluster"
        )
    job = compose_job(spec, cpu)
    contract = launch_contract(job, run_env=run_env, record=(record or RunRecord()).of(spec))
    services = {node.hostname: _service(job, contract, i) for i, node in enumerate(contract.nodes)}
    project: Obj = {
        "services": services,
        "networks": {NETWORK: {"driver": "bridge"}},
    }
    if job.checkpoint:
        services[volume_init_name(job)] = _volume_init(job)
        project["volumes"] = {CHECKPOINT_VOLUME: {}}
    return project


# ---- the plan of a `smoke --docker` run -------------------------------------------------
# The command gets the image (the spec's, or one `ddpdeploy build` makes), checks the
# engine, and starts one fresh compose project per run from this plan (so a --kill-at run
# and its clean run share nothing, checkpoint volume included).


@dataclass(frozen=True)
class ComposePlan:
    name: str
    project: Obj  # the rendered compose file
    nodes: list[Node]  # the job's nodes, one service each


def compose_plan(
    spec: JobSpec, image: str, run_env: Mapping[str, str], record: RunRecord | None = None
) -> ComposePlan:
    """The job on CPU in ``image``, with ``run_env`` (the launch's `run_env`) on every node;
    ``record``: what is known of ``image`` (the engine's image ID)."""
    job = spec_with(spec, {"image": image})
    project = render_compose(job, cpu=True, run_env=run_env, record=record)
    nodes = nodes_of(launch_contract(compose_job(job, cpu=True), run_env=run_env))
    return ComposePlan(job.name, project, nodes)
