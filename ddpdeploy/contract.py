"""The launch contract: how torchrun starts on every node, computed once from a JobSpec.

Every target (PyTorchJob, TrainJob, Indexed Job, docker-compose, local processes) starts
training through this module, so a green smoke test starts training exactly as the cluster
does. The launch itself (the container command, our base env, procs per node, port and
rendezvous policy) is the same everywhere; the target's layout (ddpdeploy.targets) says how
nodes are named, where the rendezvous host is and where a node's rank comes from.
`node_env` gives the env a node's container sees on the cluster, platform injection
included, so targets with no operator reproduce it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from ddpdeploy.image_layout import RUNNER_NAME, TRAINER_IN_IMAGE  # where `build` puts them
from ddpdeploy.rules import (
    GIT_COMMIT_ENV,
    GIT_DIRTY_ENV,
    IMAGE_DIGEST_ENV,
    IMAGE_ENV,
    SPEC_SHA256_ENV,
)
from ddpdeploy.spec import JobSpec, spec_sha256

CONTAINER_NAME = "pytorch"  # the operator finds the training container by this name
PORT_NAME = "pytorchjob-port"  # ...and the rendezvous port by this one
DEFAULT_LAUNCHER = ("torchrun",)  # on the PATH of every training image

# Downward API field paths a pod's env may come from; non-cluster targets resolve them.
POD_IP = "status.podIP"
# The index an Indexed Job (and a JobSet's Job) gives each pod: a label (1.28+) and annotation.
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX = f"metadata.annotations['{COMPLETION_INDEX_KEY}']"
# Where the job's checkpoint volume is, in every process of a job that has one: the pod's
# mountPath (compose mounts its volume there too); a local run passes its own folder.
CHECKPOINT_DIR_ENV = "DDPDEPLOY_CHECKPOINT_DIR"
# torchrun options, read from the agent's env: tee each worker's stdout/stderr to the
# console (and to files under PET_LOG_DIR), each line prefixed with the global rank, so a
# smoke run's and a pod's log name the rank of every line alike.
RANK_OUTPUT_ENV = {"PET_TEE": "3", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}


@dataclass(frozen=True)
class Node:
    """One node (pod) of the job as the target lays it out."""

    hostname: str  # the pod's hostname; a local run's node name
    address: str  # the DNS name peers reach it by (hostname, or hostname.subdomain)
    rank: int  # its node rank (PET_NODE_RANK)
    index: int  # the index the platform gives the pod (replica or completion index)
    replica: str = ""  # PyTorchJob's replica type ("Master", "Worker"); "" elsewhere


class NodeLayout(Protocol):
    """What the launch needs of a target's layout (targets.base.Layout has it all)."""

    def nodes(self, spec: JobSpec) -> list[Node]: ...

    def rdzv_address(self, spec: JobSpec) -> str:
        """The DNS name of the node every other node rendezvouses with."""
        ...

    def port(self, spec: JobSpec) -> int: ...

    def pod_env(self, contract: LaunchContract, rdzv: str) -> dict[str, str]:
        """Env we render into the pod ourselves (same on every node)."""
        ...

    def field_env(self, spec: JobSpec) -> dict[str, str]:
        """Env from the downward API: name -> field path (POD_IP, COMPLETION_INDEX)."""
        ...

    def platform_env(self, contract: LaunchContract, node: Node, rdzv: str) -> dict[str, str]:
        """What the platform (an operator) injects into ``node``'s container."""
        ...


@dataclass(frozen=True)
class RunRecord:
    """What ddpdeploy knows of a run beyond its spec, handed to the launch as data (the
    renderers never look anything up): the image it built, and the spec a target derived
    its job from. Each unset field adds no env."""

    # The sha256 of the spec the run was asked for, when a target launches a job derived
    # from it (smoke's and compose --cpu's CPU job); unset: the launched spec's own.
    spec_sha256: str | None = None
    image_digest: str | None = None  # a repo digest (pushed) or an engine's image ID
    git_commit: str | None = None  # from the build's labels
    git_dirty: bool | None = None

    def of(self, spec: JobSpec) -> RunRecord:
        """This record with ``spec``'s sha256 as the one asked for, unless one is set:
        call it before deriving another job from ``spec``."""
        if self.spec_sha256 is not None:
            return self
        return RunRecord(spec_sha256(spec), self.image_digest, self.git_commit, self.git_dirty)


def record_env(spec: JobSpec, record: RunRecord | None = None) -> dict[str, str]:
    """The env ddpkit's run record reads: the spec's sha256, the image and its digest (a
    digest-pinned image names its own), the git commit and dirty flag of a build."""
    record = (record or RunRecord()).of(spec)
    assert record.spec_sha256 is not None
    env = {SPEC_SHA256_ENV: record.spec_sha256}
    if spec.image:
        env[IMAGE_ENV] = spec.image
        if record.image_digest is None and "@" in spec.image:
            record = replace(record, image_digest=spec.image.split("@", 1)[1])
    return env | facts_env(record)


def facts_env(record: RunRecord) -> dict[str, str]:
    """The record's own facts, what no spec says (the image's digest, a build's git commit
    and dirty flag), as the env the pods get; ``record_from_env`` reads them back."""
    env = {}
    if record.image_digest:
        env[IMAGE_DIGEST_ENV] = record.image_digest
    if record.git_commit:
        env[GIT_COMMIT_ENV] = record.git_commit
    if record.git_dirty is not None:
        env[GIT_DIRTY_ENV] = "1" if record.git_dirty else "0"
    return env


# What a build gives: `git rev-parse HEAD` (SHA-1 or SHA-256 object names) and a registry's
# manifest digest or an engine's image ID.
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_DIRTY = {"1": True, "0": False}


def record_from_env(
    env: Mapping[str, object], image: str | None = None
) -> tuple[RunRecord, list[str]]:
    """A record's facts back from env named as ``facts_env`` names them (text from outside,
    e.g. a live job's), and the names of the values dropped: each one that is not what a
    build gives (a 40- or 64-hex commit, dirty 0/1, a sha256:<64 hex> digest), and a digest
    other than the one ``image`` pins. The spec's sha256 and image are not read: a
    re-rendered spec gets its own."""
    dropped: list[str] = []

    def valid(name: str, ok: Callable[[str], bool]) -> str | None:
        value = env.get(name)
        if value is None:
            return None
        if isinstance(value, str) and ok(value):
            return value
        dropped.append(name)
        return None

    pinned = image.split("@", 1)[1] if image and "@" in image else None
    digest = valid(IMAGE_DIGEST_ENV, lambda v: bool(_DIGEST.fullmatch(v)) and pinned in (None, v))
    commit = valid(GIT_COMMIT_ENV, lambda v: bool(_COMMIT.fullmatch(v)))
    dirty = valid(GIT_DIRTY_ENV, lambda v: v in _DIRTY)
    record = RunRecord(image_digest=digest, git_commit=commit, git_dirty=_DIRTY.get(dirty or ""))
    return record, dropped


def diagnostics_env(spec: JobSpec) -> dict[str, str]:
    """ddpkit's diagnostics settings as the env it reads, only those the spec sets."""
    diag = spec.diagnostics
    env = {}
    if not diag.probe:
        env["DDPDEPLOY_PROBE"] = "0"
    if diag.probe_min_busbw is not None:
        env["DDPDEPLOY_PROBE_MIN_BUSBW"] = _number(diag.probe_min_busbw)
    if diag.hang_timeout_seconds is not None:
        # ddpkit reads 0 as "auto" and a negative value as "off"; the field's 0 is "off".
        seconds = diag.hang_timeout_seconds
        env["DDPDEPLOY_HANG_TIMEOUT_S"] = _number(seconds) if seconds else "-1"
    if diag.ranks_every is not None:
        env["DDPDEPLOY_RANKS_EVERY"] = str(diag.ranks_every)
    if diag.straggler_factor is not None:
        env["DDPDEPLOY_STRAGGLER_FACTOR"] = _number(diag.straggler_factor)
    if spec.network.rdma:
        env["DDPDEPLOY_RDMA"] = "1"  # the probe warns when NCCL fell back to sockets
    return env


def _number(value: float) -> str:
    return repr(int(value)) if value == int(value) else repr(value)


# Peers' DNS records appear only once their pods run; torchrun would fail on the first
# lookup, so every node waits (bounded) for the rendezvous host to resolve first.
_WAIT_FOR_HOST = (
    'i=0; until getent hosts "$DDPDEPLOY_RDZV_HOST" >/dev/null 2>&1; do '
    'i=$((i+1)); if [ "$i" -ge "$DDPDEPLOY_DNS_WAIT" ]; then '
    'echo "ddpdeploy: $DDPDEPLOY_RDZV_HOST did not resolve within ${i}s" >&2; exit 1; fi; '
    'sleep 1; done; exec "$@"'
)


@dataclass(frozen=True)
class LaunchContract:
    """The launch (argv, base env, procs, port, rendezvous policy) on one target's layout."""

    spec: JobSpec
    layout: NodeLayout
    nproc_per_node: int
    port: int
    base_env: dict[str, str] = field(default_factory=dict)  # ours and the user's, every node
    # ddpdeploy's own for one run (a smoke run's restarts, folder): over the target's and the
    # platform's env too, which carry the spec's PET_MAX_RESTARTS a --kill-at baseline unsets.
    run_env: dict[str, str] = field(default_factory=dict)

    @property
    def nodes(self) -> list[Node]:
        return self.layout.nodes(self.spec)

    @property
    def rdzv_host(self) -> str:
        """The rendezvous host's DNS name on the cluster; targets may map it to an address."""
        return self.layout.rdzv_address(self.spec)

    @property
    def field_env(self) -> dict[str, str]:
        """Env the pod takes from the downward API: name -> field path."""
        env = self.layout.field_env(self.spec)
        if self.spec.c10d:
            # The rank-0 agent's store host is its --local-addr: its pod IP, so no DNS.
            env = {**env, "PET_LOCAL_ADDR": POD_IP}
        return env

    def pod_env(self) -> dict[str, str]:
        """The literal env rendered into the pod (field_env aside)."""
        return {**self.base_env, **self.layout.pod_env(self, self.rdzv_host), **self.run_env}

    def entry_argv(
        self, trainer_path: str | None = None, checkpoint_dir: str | None = None
    ) -> list[str]:
        """What torchrun runs on each process: the built-in trainer, or the runner (ddprun.py,
        beside the trainer) with the user's script or module, plus the arguments.

        ``trainer_path``/``checkpoint_dir`` replace the in-image paths on targets that
        run outside the image (local processes)."""
        cmd = self.spec.command
        trainer = trainer_path or TRAINER_IN_IMAGE
        runner = posixpath.join(posixpath.dirname(trainer), RUNNER_NAME)
        if cmd.module:
            return [runner, "-m", cmd.module, *cmd.args]
        if cmd.script:
            return [runner, cmd.script, *cmd.args]
        args = [trainer, "--backend", self.spec.resolved_backend]
        if self.spec.checkpoint:
            args += ["--checkpoint-dir", checkpoint_dir or self.spec.checkpoint.mount_path]
        return [*args, *cmd.args]

    def torchrun_argv(
        self,
        trainer_path: str | None = None,
        checkpoint_dir: str | None = None,
        launcher: Sequence[str] = DEFAULT_LAUNCHER,
    ) -> list[str]:
        """torchrun with no topology flags: it reads them from the PET_* env (a flag would win
        over the operator's env, so none is passed).

        ``launcher`` is how torchrun is spelled on the target: the image's ``torchrun`` by
        default, ``python -m torch.distributed.run`` where a given interpreter must run it."""
        return [*launcher, *self.entry_argv(trainer_path, checkpoint_dir)]

    def container_command(
        self,
        trainer_path: str | None = None,
        checkpoint_dir: str | None = None,
        launcher: Sequence[str] = DEFAULT_LAUNCHER,
    ) -> list[str]:
        """The container's command: wait for the rendezvous host's DNS, then exec torchrun."""
        wait = ["/bin/sh", "-c", _WAIT_FOR_HOST, "ddpdeploy-wait"]
        return [*wait, *self.torchrun_argv(trainer_path, checkpoint_dir, launcher)]

    def node_env(self, node: Node, host_of: dict[str, str] | None = None) -> dict[str, str]:
        """Everything ``node``'s container sees on the cluster: our pod env, what the
        platform injects, and the downward-API fields resolved for this node.

        ``host_of`` maps node addresses to the ones a non-cluster target uses (127.0.0.1 for
        local processes); by default addresses stay as they are.
        """
        host_of = host_of or {}
        rdzv = host_of.get(self.rdzv_host, self.rdzv_host)
        env = {**self.base_env, **self.layout.pod_env(self, rdzv)}
        env |= self.layout.platform_env(self, node, rdzv) | self.run_env
        # Ours: in base_env with the cluster's name, mapped here.
        env["DDPDEPLOY_RDZV_HOST"] = rdzv
        for name, path in self.field_env.items():
            env[name] = _field_value(path, node, host_of)
        return env

    def rdzv_conf_items(self) -> dict[str, str]:
        return {"join_timeout": str(self.spec.rendezvous.join_timeout)}

    def rdzv_conf(self) -> str:
        """As torchrun's --rdzv-conf and the operator's PET_RDZV_CONF spell it."""
        return ",".join(f"{k}={v}" for k, v in self.rdzv_conf_items().items())


def _field_value(path: str, node: Node, host_of: dict[str, str]) -> str:
    if path == POD_IP:
        return host_of.get(node.address, node.address)
    if path == COMPLETION_INDEX:
        return str(node.index)
    raise ValueError(f"no local value for the downward API field {path}")


def launch_contract(
    spec: JobSpec,
    layout: NodeLayout,
    port: int | None = None,
    *,
    run_env: Mapping[str, str] | None = None,
    record: RunRecord | None = None,
) -> LaunchContract:
    """The single decision of how ``spec`` is launched on ``layout`` (its target's; see
    ``targets.launch_contract``). ``port`` replaces the target's rendezvous port (local runs
    take a free one). ``run_env`` is env ddpdeploy itself adds for one run (e.g. a smoke
    run's, whose local checkpoint folder replaces the mount path): set after the spec's and
    the target's env on every node, not checked as user env is. ``record``: what ddpdeploy
    knows of the run beyond the spec (``RunRecord``), in every node's env with the spec's sha256."""
    base_env = {
        # Bounded wait for peers' DNS, in seconds (the rendezvous join timeout).
        "DDPDEPLOY_DNS_WAIT": str(spec.rendezvous.join_timeout),
        "DDPDEPLOY_RDZV_HOST": layout.rdzv_address(spec),
        **RANK_OUTPUT_ENV,
    }
    if spec.checkpoint:
        base_env[CHECKPOINT_DIR_ENV] = spec.checkpoint.mount_path
    if spec.c10d:
        # By default agents share one TCPStore with their workers that outlives a restart;
        # restarted workers then read peers' stale addresses and fail ("Connection
        # refused"). Unshared, each round's rank-0 agent publishes a fresh port and rank 0's
        # worker hosts a fresh store.
        base_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    base_env |= record_env(spec, record) | diagnostics_env(spec)
    threads = spec.threads_per_proc
    if threads is not None and "OMP_NUM_THREADS" not in spec.secret_env:
        # torch sizes its thread pool by the node's cores, not the pod's request: with no
        # CPU limit (see render.pod), one process per node on a 64-core node ran 64
        # threads on a 1-CPU request. The spec's env overrides it.
        base_env["OMP_NUM_THREADS"] = str(threads)
    base_env.update(spec.env)
    return LaunchContract(
        spec=spec,
        layout=layout,
        nproc_per_node=spec.procs_per_node,
        port=port or layout.port(spec),
        base_env=base_env,
        run_env=dict(run_env or {}),
    )
