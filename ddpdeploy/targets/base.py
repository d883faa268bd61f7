"""A target whole: how the launch contract's nodes appear on one platform, the objects
that run them there, and how cluster commands read such a job back.

The launch (contract.py) is the same everywhere; a layout says what differs per target:
the pods' names and the DNS names peers reach them by, which node hosts the rendezvous,
where a node learns its rank, the env the platform injects and the env we render into the
pod ourselves. What the spec must refuse for a target is data in rules.py (``rules``).
Pure: spec in, names and dicts out; live jobs are read from plain dicts.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from ddpdeploy.contract import COMPLETION_INDEX_KEY, CONTAINER_NAME, LaunchContract, Node
from ddpdeploy.errors import UserError
from ddpdeploy.obj import Obj
from ddpdeploy.rules import TargetRules

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


def c10d_env(contract: LaunchContract, rdzv: str) -> dict[str, str]:
    """torchrun's c10d rendezvous as PET_* env (torchrun reads each as its flag's default),
    for targets where no operator injects it: every node meets at ``rdzv``'s port, a fresh
    round after every restart (contract.py unshares the workers' store)."""
    spec = contract.spec
    env = {
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{rdzv}:{contract.port}",
        "PET_RDZV_ID": spec.name,
        "PET_RDZV_CONF": contract.rdzv_conf(),
    }
    if spec.rendezvous.max_restarts is not None:
        env["PET_MAX_RESTARTS"] = str(spec.rendezvous.max_restarts)
    return env


class Layout(ABC):
    """One target. Subclasses set the class attributes and the node layout."""

    name: ClassVar[str]  # the --target value
    rules: ClassVar[TargetRules]  # what the spec refuses for it (rules.TARGET_RULES)
    api_version: ClassVar[str]  # of the object that runs the job
    kind: ClassVar[str]
    container: ClassVar[str] = CONTAINER_NAME  # the training container's name in the pods

    # --- the layout (what the launch contract asks, contract.NodeLayout) ---

    @abstractmethod
    def nodes(self, spec: JobSpec) -> list[Node]: ...

    def rdzv_address(self, spec: JobSpec) -> str:
        """The DNS name of the node every other node rendezvouses with."""
        return self.nodes(spec)[0].address

    def port(self, spec: JobSpec) -> int:
        return spec.rendezvous.port

    def pod_env(self, contract: LaunchContract, rdzv: str) -> dict[str, str]:
        """Env we render into the pod ourselves (same on every node); ``rdzv`` is the
        rendezvous host as this target spells it (a local run maps it to 127.0.0.1)."""
        return {}

    def field_env(self, spec: JobSpec) -> dict[str, str]:
        """Env from the downward API: name -> field path (contract.POD_IP, COMPLETION_INDEX)."""
        return {}

    def platform_env(self, contract: LaunchContract, node: Node, rdzv: str) -> dict[str, str]:
        """What the platform (an operator) injects into ``node``'s container; non-cluster
        targets reproduce it."""
        return {}

    # --- the objects ---

    @abstractmethod
    def objects(self, spec: JobSpec, contract: LaunchContract) -> list[Obj]:
        """The Kubernetes objects that run the job (the checkpoint PVC and policy aside)."""

    # --- a live job read back (pure, on plain dicts as the API returns them) ---

    pod_label: ClassVar[str]  # the label its controller puts on the job's pods: job name
    succeeded: ClassVar[str]  # the job object's condition type once it succeeded
    failed: ClassVar[str] = "Failed"
    install_hint: ClassVar[str] = ""  # how to get the job's API into a cluster, if needed
    # Whether its pods are named like their hostnames (so a pod is named before it exists).
    pods_named_like_hosts: ClassVar[bool] = False
    replica_names: ClassVar[tuple[str, ...]] = ()  # what `logs --replica` may name
    can_scale: ClassVar[bool] = False  # `scale` may change its node count (elastic jobs)

    def pod_selector(self, job_name: str) -> dict[str, str]:
        return {self.pod_label: job_name}

    @abstractmethod
    def node_hostname(self, job_name: str, index: int, replica: str = "") -> str:
        """The hostname of a job's node: node ``index`` (of ``replica`` for PyTorchJob)."""

    def rank0_hostname(self, obj: Obj) -> str | None:
        """The hostname of the pod that hosts global rank 0 (static rendezvous: node 0);
        None when the rendezvous decides (c10d, elastic)."""
        if self.env_of(obj).get("PET_RDZV_BACKEND") == "c10d":
            return None
        return self.node_hostname(obj["metadata"]["name"], 0)

    def env_of(self, obj: Obj) -> dict[str, str]:
        """The literal env the job object gives its training container."""
        for pod in self.pod_templates(obj):
            for container in pod.get("containers") or []:
                if container.get("name") == self.container:
                    return env_values(container.get("env"))
        return {}

    def logs_hostname(self, job: Obj, replica: str | None, index: int | None) -> str | None:
        """The hostname `logs --replica/--index` names in ``job`` (the object); None when
        they name none."""
        if replica is not None:
            raise UserError(f"--replica: a {self.kind} has no replicas; pass --index N alone")
        return None if index is None else self.node_hostname(job["metadata"]["name"], index)

    def replica_counts(self, obj: Obj) -> dict[str, int]:
        """replica (as `logs --replica` names it) -> how many pods of it ``obj`` asks for;
        empty for a target without replicas."""
        return {}

    def pod_place(self, pod: Obj) -> tuple[str, int | None]:
        """(replica, index) of one of the job's pods: its completion index by default; None
        for an index that is missing or not a plain number (see ``parse_index``)."""
        meta = pod.get("metadata") or {}
        index = (meta.get("labels") or {}).get(COMPLETION_INDEX_KEY) or (
            meta.get("annotations") or {}
        ).get(COMPLETION_INDEX_KEY)
        return "node", parse_index(index)

    def companions(self, job_name: str) -> list[tuple[str, str, str]]:
        """(apiVersion, kind, name) of objects we render beside the job that deleting the
        job does not delete (its controller does not own them)."""
        return []

    @abstractmethod
    def pod_templates(self, obj: Obj) -> list[Obj]:
        """The pod specs inside the job object (for sizes, images, resources)."""

    def added_containers(self, obj: Obj) -> list[list[Obj]]:
        """Per pod template of ``obj`` (in pod_templates' order), the init containers its
        controller adds to the pods it makes from it: none by default."""
        return [[] for _ in self.pod_templates(obj)]

    # Who adds those containers, and where their resources are set, for a line about them.
    added_by = ""

    @abstractmethod
    def job_size(self, obj: Obj) -> tuple[int, int]:
        """(nodes, GPUs per node) of a job object of this target."""

    def elastic_range(self, obj: Obj) -> tuple[int, int] | None:
        """The job's elastic MIN:MAX nodes; None when it is not elastic."""
        return None


def env_values(env: Any) -> dict[str, str]:
    """name -> value of a container's env list (entries from a source aside)."""
    items = env if isinstance(env, list) else []
    return {
        str(e["name"]): str(e["value"])
        for e in items
        if isinstance(e, dict) and "name" in e and isinstance(e.get("value"), str)
    }


# A pod's index as its controller writes it: ASCII digits, no leading zero, bounded. An
# annotation is free text (str.isdigit takes "²" and "٣", int() then raises or reads 3, and
# refuses over 4300 digits), so anything else is no index rather than a crash or a node.
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)


def parse_index(value: Any) -> int | None:
    """A pod's replica or completion index from its label or annotation; None for none."""
    return int(value) if isinstance(value, str) and _INDEX.fullmatch(value) else None


def gpus_of(pod_specs: list[Obj]) -> int:
    gpus = 0
    for pod in pod_specs:
        for c in pod.get("containers") or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            gpus = max(gpus, int(limits.get("nvidia.com/gpu") or 0))
    return gpus
