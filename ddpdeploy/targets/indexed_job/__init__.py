"""A plain batch/v1 Indexed Job plus a headless Service: no operator needed.

Pods are `<job>-<i>` (the Job controller's hostnames for an Indexed Job) in the subdomain of
the headless Service `<job>`, so peers reach node i at `<job>-<i>.<job>`. Nothing injects
the rendezvous env, so the pod carries it itself: PET_NNODES, PET_NPROC_PER_NODE and either
c10d's endpoint at `<job>-0.<job>` (the default) or, for a static job, the master there and
the node rank from the completion index (downward API). Elastic rendezvous is refused: a
Job's parallelism is fixed, and replacing or adding nodes between min and max is what the
operator's elastic support is for. The objects themselves are built in objects.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddpdeploy.contract import COMPLETION_INDEX, LaunchContract, Node
from ddpdeploy.rules import TARGET_RULES
from ddpdeploy.targets.base import Layout, c10d_env, gpus_of
from ddpdeploy.targets.indexed_job.objects import objects as job_objects

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


class IndexedJob(Layout):
    name = "indexed-job"
    rules = TARGET_RULES[name]
    api_version = "batch/v1"
    kind = "Job"
    pod_label = "batch.kubernetes.io/job-name"  # set by the Job controller (1.27+)
    succeeded = "Complete"

    def node_hostname(self, job_name: str, index: int, replica: str = "") -> str:
        return f"{job_name}-{index}"  # the Job controller's hostname for an Indexed Job

    def companions(self, job_name: str) -> list[tuple[str, str, str]]:
        return [("v1", "Service", job_name)]  # the headless Service is ours, not the Job's

    def nodes(self, spec: JobSpec) -> list[Node]:
        hosts = [self.node_hostname(spec.name, i) for i in range(spec.nodes)]
        return [Node(h, f"{h}.{spec.name}", i, i) for i, h in enumerate(hosts)]

    def pod_env(self, contract: LaunchContract, rdzv: str) -> dict[str, str]:
        env = {
            "PYTHONUNBUFFERED": "1",
            "PET_NNODES": str(contract.spec.nodes),
            "PET_NPROC_PER_NODE": str(contract.nproc_per_node),
        }
        if contract.spec.c10d:
            return env | c10d_env(contract, rdzv)
        return env | {"PET_MASTER_ADDR": rdzv, "PET_MASTER_PORT": str(contract.port)}

    def field_env(self, spec: JobSpec) -> dict[str, str]:
        # c10d numbers the nodes itself; a static node's rank is its completion index.
        return {} if spec.c10d else {"PET_NODE_RANK": COMPLETION_INDEX}

    def objects(self, spec: JobSpec, contract: LaunchContract) -> list[dict[str, Any]]:
        return job_objects(spec, contract)

    def pod_templates(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        return [((obj.get("spec") or {}).get("template") or {}).get("spec") or {}]

    def job_size(self, obj: dict[str, Any]) -> tuple[int, int]:
        nodes = int((obj.get("spec") or {}).get("completions") or 1)
        return nodes, gpus_of(self.pod_templates(obj))
