"""A target's layout: how the launch contract's nodes appear on one platform.

The launch (contract.py) is the same everywhere; a layout says what differs per target:
the pods' names and the DNS names peers reach them by, which node hosts the rendezvous,
where a node learns its rank, the env the platform injects and the env we render into the
pod ourselves, and the target's name rules. Pure: spec in, names and dicts out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ddpdeploy.contract import LaunchContract
    from ddpdeploy.spec import JobSpec

MAX_DNS_LABEL = 63  # a pod hostname and a Service name are DNS labels

# Downward API field paths a pod's env may come from; non-cluster targets resolve them.
POD_IP = "status.podIP"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


@dataclass(frozen=True)
class Node:
    """One node (pod) of the job as the target lays it out."""

    hostname: str  # the pod's hostname; a local run's node name
    address: str  # the DNS name peers reach it by (hostname, or hostname.subdomain)
    rank: int  # its node rank (PET_NODE_RANK)
    index: int  # the index the platform gives the pod (replica or completion index)
    replica: str = ""  # PyTorchJob's replica type ("Master", "Worker"); "" elsewhere


class Layout(ABC):
    """One target. Subclasses set the class attributes and the node layout."""

    name: ClassVar[str]  # the --target value
    api_version: ClassVar[str]  # of the object that runs the job
    kind: ClassVar[str]
    container: ClassVar[str] = "pytorch"  # the training container's name in the pods

    @abstractmethod
    def nodes(self, spec: JobSpec) -> list[Node]: ...

    @abstractmethod
    def longest_hostname(self, spec: JobSpec) -> str:
        """The longest DNS label the target derives from the job name."""

    def rdzv_address(self, spec: JobSpec) -> str:
        """The DNS name of the node every other node rendezvouses with."""
        return self.nodes(spec)[0].address

    def port(self, spec: JobSpec) -> int:
        return spec.rendezvous.port

    def check(self, spec: JobSpec) -> None:
        """Refuse (ValueError, one line) what the target cannot run; the name rule first."""
        longest = self.longest_hostname(spec)
        if len(longest) > MAX_DNS_LABEL:
            budget = MAX_DNS_LABEL - (len(longest) - len(spec.name))
            raise ValueError(
                f"name is too long: pod and Service names like {longest[:60]!r} must stay "
                f"within {MAX_DNS_LABEL} characters; shorten name to at most {budget} "
                "characters"
            )

    def pod_env(self, contract: LaunchContract, rdzv: str) -> dict[str, str]:
        """Env we render into the pod ourselves (same on every node); ``rdzv`` is the
        rendezvous host as this target spells it (a local run maps it to 127.0.0.1)."""
        return {}

    def field_env(self, spec: JobSpec) -> dict[str, str]:
        """Env from the downward API: name -> field path (see POD_IP, COMPLETION_INDEX)."""
        return {}

    def platform_env(self, contract: LaunchContract, node: Node, rdzv: str) -> dict[str, str]:
        """What the platform (an operator) injects into ``node``'s container; non-cluster
        targets reproduce it."""
        return {}

    def objects(self, spec: JobSpec, contract: LaunchContract) -> list[dict[str, Any]]:
        """The Kubernetes objects that run the job (the checkpoint PVC aside)."""
        raise NotImplementedError

    # What cluster commands need to read a job of this target back (pure, on plain dicts).
    pod_label: ClassVar[str]  # the label its controller puts on the job's pods: job name
    succeeded: ClassVar[str]  # the job object's condition type once it succeeded
    failed: ClassVar[str] = "Failed"

    install_hint: ClassVar[str] = ""  # how to get the job's API into a cluster, if needed

    def pod_selector(self, job_name: str) -> dict[str, str]:
        return {self.pod_label: job_name}

    @abstractmethod
    def node_hostname(self, job_name: str, index: int, replica: str = "") -> str:
        """The hostname of a job's node: node ``index`` (of ``replica`` for PyTorchJob)."""

    def rank0_hostname(self, obj: dict[str, Any]) -> str | None:
        """The hostname of the pod that hosts global rank 0 (static rendezvous: node 0);
        None when the rendezvous decides (elastic)."""
        return self.node_hostname(obj["metadata"]["name"], 0)

    def companions(self, job_name: str) -> list[tuple[str, str, str]]:
        """(apiVersion, kind, name) of objects we render beside the job that deleting the
        job does not delete (its controller does not own them)."""
        return []

    def pod_templates(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """The pod specs inside the job object (for sizes, images, resources)."""
        raise NotImplementedError

    def job_size(self, obj: dict[str, Any]) -> tuple[int, int]:
        """(nodes, GPUs per node) of a job object of this target."""
        raise NotImplementedError


def gpus_of(pod_specs: list[dict[str, Any]]) -> int:
    gpus = 0
    for pod in pod_specs:
        for c in pod.get("containers") or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            gpus = max(gpus, int(limits.get("nvidia.com/gpu") or 0))
    return gpus


def refuse_elastic(spec: JobSpec, target: str, why: str) -> None:
    if spec.elastic:
        raise ValueError(
            f"target {target}: {why}; drop --elastic (rendezvous.mode: elastic) or use "
            "--target pytorchjob"
        )
