"""Kubeflow PyTorchJob (kubeflow.org/v1): the training operator's layout and env.

The operator (v1.9.x, pkg/controller.v1/pytorch/envvar.go and elastic.go) names pods
`<job>-master-0` and `<job>-worker-<i>`, gives each a headless Service of the same name,
and injects the rendezvous env; `platform_env` reproduces that injection for targets with
no operator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpdeploy.targets.base import Layout, Node, gpus_of

if TYPE_CHECKING:
    from ddpdeploy.contract import LaunchContract
    from ddpdeploy.spec import JobSpec


class PyTorchJob(Layout):
    name = "pytorchjob"
    api_version = "kubeflow.org/v1"
    kind = "PyTorchJob"
    pod_label = "training.kubeflow.org/job-name"
    succeeded = "Succeeded"

    install_hint = (
        "install the Kubeflow training operator (v1.9): kubectl apply --server-side -k "
        '"github.com/kubeflow/trainer.git/manifests/overlays/standalone?ref=v1.9.4"'
    )

    def node_hostname(self, job_name: str, index: int, replica: str = "") -> str:
        return f"{job_name}-{(replica or 'master').lower()}-{index}"

    def rank0_hostname(self, obj: dict[str, Any]) -> str | None:
        if "Master" in ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}):
            return self.node_hostname(obj["metadata"]["name"], 0, "master")
        return None  # elastic: c10d puts rank 0 on any pod

    def replicas(self, spec: JobSpec) -> dict[str, int]:
        if spec.elastic:
            return {"Worker": spec.nodes}  # the operator requires Worker replicas for elastic
        # Static: global rank 0 lands on master-0, where torchrun's store runs.
        return {"Master": 1, **({"Worker": spec.nodes - 1} if spec.nodes > 1 else {})}

    def nodes(self, spec: JobSpec) -> list[Node]:
        out: list[Node] = []
        for replica, count in self.replicas(spec).items():
            for i in range(count):
                host = self.node_hostname(spec.name, i, replica)
                out.append(Node(host, host, len(out), i, replica))
        return out

    def longest_hostname(self, spec: JobSpec) -> str:
        return f"{spec.name}-worker-{spec.max_nodes - 1}"

    def rdzv_address(self, spec: JobSpec) -> str:
        return f"{spec.name}-worker-0" if spec.elastic else f"{spec.name}-master-0"

    def platform_env(self, contract: LaunchContract, node: Node, rdzv: str) -> dict[str, str]:
        spec = contract.spec
        env = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": str(contract.nproc_per_node)}
        if not spec.elastic:
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
            "PET_NNODES": f"{rdzv_spec.min_nodes}:{rdzv_spec.max_nodes}",
            "PET_RDZV_ID": spec.name,
            "PET_RDZV_CONF": contract.rdzv_conf(),
        }
        if rdzv_spec.max_restarts is not None:
            env["PET_MAX_RESTARTS"] = str(rdzv_spec.max_restarts)
        return env

    def objects(self, spec: JobSpec, contract: LaunchContract) -> list[dict[str, Any]]:
        from ddpdeploy.render.k8s import pytorchjob

        return [pytorchjob(spec, contract)]

    def pod_templates(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        replicas = ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()
        return [(r.get("template") or {}).get("spec") or {} for r in replicas]

    def job_size(self, obj: dict[str, Any]) -> tuple[int, int]:
        replicas = ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values()
        return sum(int(r.get("replicas") or 0) for r in replicas), gpus_of(self.pod_templates(obj))
