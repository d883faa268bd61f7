"""Kubeflow PyTorchJob (kubeflow.org/v1): the training operator's layout, env and job.

The operator (v1.9.x, pkg/controller.v1/pytorch/envvar.go and elastic.go) names pods
`<job>-master-0` and `<job>-worker-<i>`, gives each a headless Service of the same name,
and injects the rendezvous env; `platform_env` reproduces that injection for targets with
no operator. The object itself is built in objects.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddpdeploy.contract import LaunchContract, Node
from ddpdeploy.obj import Obj
from ddpdeploy.rules import TARGET_RULES
from ddpdeploy.targets.base import Layout, gpus_of, parse_index
from ddpdeploy.targets.pytorchjob.objects import pytorchjob

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


# The init container the training operator (v1.9, initcontainer.go) adds to each Worker pod
# of a job with a Master: it waits for the master's DNS name. Only its resources matter here
# (a LimitRange can refuse them); the operator's flags can change them, this is its default.
OPERATOR_INIT_CONTAINER: Obj = {
    "name": "init-pytorch",
    "resources": {
        "limits": {"cpu": "100m", "memory": "20Mi"},
        "requests": {"cpu": "50m", "memory": "10Mi"},
    },
}

# Labels the training operator (v1.9) puts on each replica's pod.
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


class PyTorchJob(Layout):
    name = "pytorchjob"
    rules = TARGET_RULES[name]
    api_version = "kubeflow.org/v1"
    kind = "PyTorchJob"
    pod_label = "training.kubeflow.org/job-name"
    succeeded = "Succeeded"
    pods_named_like_hosts = True  # the operator names each pod like its hostname
    replica_names = ("master", "worker")
    can_scale = True  # elastic: the operator resizes the Worker replicas in MIN:MAX

    install_hint = (
        "install the Kubeflow training operator (v1.9): kubectl apply --server-side -k "
        '"github.com/kubeflow/trainer.git/manifests/overlays/standalone?ref=v1.9.4"'
    )

    def node_hostname(self, job_name: str, index: int, replica: str = "") -> str:
        return f"{job_name}-{(replica or 'master').lower()}-{index}"

    def rank0_hostname(self, obj: Obj) -> str | None:
        if "Master" in ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}):
            return self.node_hostname(obj["metadata"]["name"], 0, "master")
        return None  # c10d (and elastic): the rendezvous puts rank 0 on any pod

    def logs_hostname(self, job: Obj, replica: str | None, index: int | None) -> str | None:
        name = job["metadata"]["name"]
        if replica is not None:
            return self.node_hostname(name, index or 0, replica)
        if index is None:
            return None
        # --index alone is node N, numbered as `logs` numbers nodes: under static rendezvous
        # master-0 is node 0 and worker-i node i+1; under c10d (Worker replicas only)
        # worker-i is node i.
        if self.rank0_hostname(job) is None:
            return self.node_hostname(name, index, "worker")
        return self.node_hostname(name, index - 1, "worker") if index else f"{name}-master-0"

    def replica_counts(self, obj: Obj) -> dict[str, int]:
        specs = (obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}
        return {
            str(kind).lower(): int((spec or {}).get("replicas") or 0)
            for kind, spec in specs.items()
        }

    def pod_place(self, pod: Obj) -> tuple[str, int | None]:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        replica = labels.get(REPLICA_TYPE_LABEL, "").lower()
        if not replica:
            return super().pod_place(pod)
        return replica, parse_index(labels.get(REPLICA_INDEX_LABEL) or "0")

    def replicas(self, spec: JobSpec) -> dict[str, int]:
        if spec.c10d:
            # An elasticPolicy (c10d): the operator requires Worker replicas only.
            return {"Worker": spec.nodes}
        # Static: global rank 0 lands on master-0, where torchrun's store runs.
        return {"Master": 1, **({"Worker": spec.nodes - 1} if spec.nodes > 1 else {})}

    def nodes(self, spec: JobSpec) -> list[Node]:
        out: list[Node] = []
        for replica, count in self.replicas(spec).items():
            for i in range(count):
                host = self.node_hostname(spec.name, i, replica)
                out.append(Node(host, host, len(out), i, replica))
        return out

    def rdzv_address(self, spec: JobSpec) -> str:
        return f"{spec.name}-worker-0" if spec.c10d else f"{spec.name}-master-0"

    def platform_env(self, contract: LaunchContract, node: Node, rdzv: str) -> dict[str, str]:
        spec = contract.spec
        env = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": str(contract.nproc_per_node)}
        if not spec.c10d:
            port = str(contract.port)
            env |= {
                "MASTER_ADDR": rdzv,
                "PET_MASTER_ADDR": rdzv,
                "MASTER_PORT": port,
                "PET_MASTER_PORT": port,
                "WORLD_SIZE": str(spec.nodes * contract.nproc_per_node),
                "RANK": str(node.rank),
                "PET_NODE_RANK": str(node.rank),
                "PET_NNODES": str(spec.nodes),
            }
            return env
        rdzv_spec = spec.rendezvous
        env |= {
            "PET_RDZV_ENDPOINT": f"{rdzv}:{contract.port}",
            "PET_RDZV_BACKEND": "c10d",
            "PET_NNODES": f"{spec.min_available}:{spec.max_nodes}",
            "PET_RDZV_ID": spec.name,
            "PET_RDZV_CONF": contract.rdzv_conf(),
        }
        if rdzv_spec.max_restarts is not None:
            env["PET_MAX_RESTARTS"] = str(rdzv_spec.max_restarts)
        return env

    def objects(self, spec: JobSpec, contract: LaunchContract) -> list[Obj]:
        return [pytorchjob(spec, contract, self.replicas(spec))]

    def pod_templates(self, obj: Obj) -> list[Obj]:
        replicas = ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()
        return [(r.get("template") or {}).get("spec") or {} for r in replicas]

    added_by = (
        "the training operator's init container on the workers (its "
        "--pytorch-init-container-template-file sets it, not ddpdeploy)"
    )

    def added_containers(self, obj: Obj) -> list[list[Obj]]:
        specs = (obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}
        init = "Master" in specs
        return [[OPERATOR_INIT_CONTAINER] if init and kind == "Worker" else [] for kind in specs]

    def job_size(self, obj: Obj) -> tuple[int, int]:
        replicas = ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()
        return sum(int(r.get("replicas") or 0) for r in replicas), gpus_of(self.pod_templates(obj))

    def elastic_range(self, obj: Obj) -> tuple[int, int] | None:
        policy = (obj.get("spec") or {}).get("elasticPolicy")
        if not policy:
            return None
        low, high = int(policy.get("minReplicas") or 1), int(policy.get("maxReplicas") or 1)
        return (low, high) if low < high else None  # min = max: a c10d job of fixed size
