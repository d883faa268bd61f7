"""The launch contract: how torchrun starts on every node, computed once from a JobSpec.

Every target (PyTorchJob, docker-compose, local processes) starts training through this
module, so a green smoke test starts training exactly as the cluster does.

For the cluster, the Kubeflow training operator (v1.9) injects the per-pod env; `node_env`
reproduces that injection for targets with no operator. The container command and our own
env (`base_env`) are the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpdeploy.image_layout import TRAINER_IN_IMAGE  # where `ddpdeploy build` puts it
from ddpdeploy.spec import JobSpec

CONTAINER_NAME = "pytorch"  # the operator finds the training container by this name
PORT_NAME = "pytorchjob-port"  # ...and the rendezvous port by this one
DEFAULT_LAUNCHER = ("torchrun",)  # on the PATH of every training image

# Peers' DNS records appear only once their pods run; torchrun would fail on the first
# lookup, so every node waits (bounded) for the rendezvous host to resolve first.
_WAIT_FOR_HOST = (
    'i=0; until getent hosts "$DDPDEPLOY_RDZV_HOST" >/dev/null 2>&1; do '
    'i=$((i+1)); if [ "$i" -ge "$DDPDEPLOY_DNS_WAIT" ]; then '
    'echo "ddpdeploy: $DDPDEPLOY_RDZV_HOST did not resolve within ${i}s" >&2; exit 1; fi; '
    'sleep 1; done; exec "$@"'
)


@dataclass(frozen=True)
class Node:
    """One node ("pod") of the job: its replica type, index and hostname."""

    replica: str  # "Master" or "Worker"
    index: int  # index within the replica type
    rank: int  # node rank as the operator counts it (master 0, worker-i -> i+1)

    def hostname(self, job: str) -> str:
        return f"{job}-{self.replica.lower()}-{self.index}"


@dataclass(frozen=True)
class LaunchContract:
    spec: JobSpec
    replicas: dict[str, int]
    nproc_per_node: int
    port: int
    rdzv_host: str  # a node hostname; targets may map it to an address
    base_env: dict[str, str] = field(default_factory=dict)
    # Env vars that hold the pod's own address: the downward API's status.podIP in the
    # cluster, the node's mapped address elsewhere.
    own_address_env: tuple[str, ...] = ()

    @property
    def nodes(self) -> list[Node]:
        out: list[Node] = []
        if self.replicas.get("Master"):
            out.append(Node("Master", 0, 0))
        offset = len(out)
        out += [Node("Worker", i, i + offset) for i in range(self.replicas.get("Worker", 0))]
        return out

    def entry_argv(
        self, trainer_path: str | None = None, checkpoint_dir: str | None = None
    ) -> list[str]:
        """What torchrun runs on each process: script or module plus its arguments.

        ``trainer_path``/``checkpoint_dir`` replace the in-image paths on targets that
        run outside the image (local processes)."""
        cmd = self.spec.command
        if cmd.module:
            return ["-m", cmd.module, *cmd.args]
        if cmd.script:
            return [cmd.script, *cmd.args]
        args = [trainer_path or TRAINER_IN_IMAGE, "--backend", self.spec.resolved_backend]
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
        """The env the training operator gives ``node``'s container, plus ``base_env``.

        ``host_of`` maps node hostnames to the addresses a non-cluster target uses
        (127.0.0.1 for local processes); by default hostnames stay as they are.
        """
        host_of = host_of or {}
        job = self.spec.name
        env = dict(self.base_env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PET_NPROC_PER_NODE"] = str(self.nproc_per_node)
        total = sum(self.replicas.values())
        if "Master" in self.replicas:
            master = Node("Master", 0, 0).hostname(job)
            addr = host_of.get(master, master)
            env |= {
                "MASTER_ADDR": addr,
                "PET_MASTER_ADDR": addr,
                "MASTER_PORT": str(self.port),
                "PET_MASTER_PORT": str(self.port),
                "WORLD_SIZE": str(total * self.nproc_per_node),
                "RANK": str(node.rank),
                "PET_NODE_RANK": str(node.rank),
            }
        rdzv = self.spec.rendezvous
        if self.spec.elastic:
            host = host_of.get(self.rdzv_host, self.rdzv_host)
            env |= {
                "PET_RDZV_ENDPOINT": f"{host}:{self.port}",
                "PET_RDZV_BACKEND": "c10d",
                "PET_NNODES": f"{rdzv.min_nodes}:{rdzv.max_nodes}",
                "PET_RDZV_ID": job,
                "PET_RDZV_CONF": self.rdzv_conf(),
            }
            if rdzv.max_restarts is not None:
                env["PET_MAX_RESTARTS"] = str(rdzv.max_restarts)
        else:
            env["PET_NNODES"] = str(total)
        # Ours, not the operator's: in base_env with the cluster hostname, mapped here.
        env["DDPDEPLOY_RDZV_HOST"] = host_of.get(self.rdzv_host, self.rdzv_host)
        hostname = node.hostname(job)
        for name in self.own_address_env:
            env[name] = host_of.get(hostname, hostname)
        return env

    def rdzv_conf_items(self) -> dict[str, str]:
        return {"join_timeout": str(self.spec.rendezvous.join_timeout)}

    def rdzv_conf(self) -> str:
        """As torchrun's --rdzv-conf and the operator's PET_RDZV_CONF spell it."""
        return ",".join(f"{k}={v}" for k, v in self.rdzv_conf_items().items())


def launch_contract(spec: JobSpec) -> LaunchContract:
    """The single decision of how ``spec`` is launched on every target."""
    job = spec.name
    if spec.elastic:
        # The operator requires Worker replicas for elastic jobs; rendezvous on worker-0.
        replicas = {"Worker": spec.nodes}
        rdzv_host = f"{job}-worker-0"
    else:
        # Static: global rank 0 lands on master-0, where torchrun's store runs.
        replicas = {"Master": 1}
        if spec.nodes > 1:
            replicas["Worker"] = spec.nodes - 1
        rdzv_host = f"{job}-master-0"
    base_env = {
        # Bounded wait for peers' DNS, in seconds (the rendezvous join timeout).
        "DDPDEPLOY_DNS_WAIT": str(spec.rendezvous.join_timeout),
        "DDPDEPLOY_RDZV_HOST": rdzv_host,
    }
    own_address_env: tuple[str, ...] = ()
    if spec.elastic:
        # By default agents share one TCPStore with their workers that outlives a restart;
        # restarted workers then read peers' stale addresses and fail ("Connection
        # refused"). Unshared, each round's rank-0 agent publishes a fresh port and rank 0's
        # worker hosts a fresh store.
        base_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        # That store's host is the rank-0 agent's --local-addr: its pod IP, so no DNS.
        own_address_env = ("PET_LOCAL_ADDR",)
    base_env.update(spec.env)
    return LaunchContract(
        spec=spec,
        replicas=replicas,
        nproc_per_node=spec.procs_per_node,
        port=spec.rendezvous.port,
        rdzv_host=rdzv_host,
        base_env=base_env,
        own_address_env=own_address_env,
    )
