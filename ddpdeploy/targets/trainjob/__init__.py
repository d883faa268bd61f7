"""Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1): the layout its runtime makes.

A TrainJob runs as a JobSet from a ClusterTrainingRuntime (`torch-distributed` by default):
one replicated Job `node` whose pods are `<job>-node-0-<i>` under a headless Service named
`<job>`. Trainer's torch plugin injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the
completion index), PET_MASTER_ADDR (`<job>-node-0-0.<job>`) and PET_MASTER_PORT (29400, the
runtime's port); `platform_env` reproduces that for targets with no Trainer. For a c10d job
(the default) the trainer's env adds torchrun's c10d rendezvous at that master address,
which torchrun then uses instead of the static master. Trainer v2 has no elastic training.
The object itself is built in objects.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpdeploy.contract import LaunchContract, Node
from ddpdeploy.rules import TARGET_RULES, TRAINER_PORT
from ddpdeploy.targets.base import Layout, c10d_env, env_values, gpus_of
from ddpdeploy.targets.trainjob.objects import REPLICATED_JOB, trainjob

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


class TrainJob(Layout):
    name = "trainjob"
    rules = TARGET_RULES[name]
    api_version = "trainer.kubeflow.org/v1alpha1"
    kind = "TrainJob"
    container = REPLICATED_JOB
    pod_label = "jobset.sigs.k8s.io/jobset-name"  # a TrainJob runs as a JobSet of its name
    succeeded = "Complete"

    install_hint = (
        "install Kubeflow Trainer v2 and its torch-distributed runtime (see "
        "https://www.kubeflow.org/docs/components/trainer/), or use --target indexed-job"
    )

    def node_hostname(self, job_name: str, index: int, replica: str = "") -> str:
        # JobSet pod hostnames: <jobset>-<replicatedJob>-<job index>-<pod index>.
        return f"{job_name}-{REPLICATED_JOB}-0-{index}"

    def nodes(self, spec: JobSpec) -> list[Node]:
        hosts = [self.node_hostname(spec.name, i) for i in range(spec.nodes)]
        return [Node(h, f"{h}.{spec.name}", i, i) for i, h in enumerate(hosts)]

    def port(self, spec: JobSpec) -> int:
        return TRAINER_PORT

    def pod_env(self, contract: LaunchContract, rdzv: str) -> dict[str, str]:
        env = {"PYTHONUNBUFFERED": "1"}  # the operator's default, which Trainer does not set
        return env | c10d_env(contract, rdzv) if contract.spec.c10d else env

    def platform_env(self, contract: LaunchContract, node: Node, rdzv: str) -> dict[str, str]:
        return {
            "PET_NNODES": str(contract.spec.nodes),
            "PET_NPROC_PER_NODE": str(contract.nproc_per_node),
            "PET_NODE_RANK": str(node.index),
            "PET_MASTER_ADDR": rdzv,
            "PET_MASTER_PORT": str(contract.port),
        }

    def objects(self, spec: JobSpec, contract: LaunchContract) -> list[dict[str, Any]]:
        return [trainjob(spec, contract)]

    def pod_templates(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        trainer = (obj.get("spec") or {}).get("trainer") or {}
        return [{"containers": [{"resources": trainer.get("resourcesPerNode") or {}}]}]

    def env_of(self, obj: dict[str, Any]) -> dict[str, str]:
        trainer = (obj.get("spec") or {}).get("trainer") or {}
        return env_values(trainer.get("env"))

    def replica_counts(self, obj: dict[str, Any]) -> dict[str, int]:
        # One replica, as pod_place names it: the node Job's pods, one per node.
        return {"node": self.job_size(obj)[0]}

    def job_size(self, obj: dict[str, Any]) -> tuple[int, int]:
        trainer = (obj.get("spec") or {}).get("trainer") or {}
        return int(trainer.get("numNodes") or 1), gpus_of(self.pod_templates(obj))
