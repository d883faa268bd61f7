"""Objects beside the job that every Kubernetes target can add: the NetworkPolicy and, for
targets whose operator makes none, a Volcano PodGroup. Pure: spec and selector in, dicts out.

``selector`` is the set of labels the job's pods carry (``pod.selector_labels(spec)``).
"""

from __future__ import annotations

from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import metadata

# Pods name their PodGroup with POD_GROUP_ANNOTATION (Volcano's scheduler reads it).
from ddpdeploy.spec import POD_GROUP_ANNOTATION, JobSpec

__all__ = ["POD_GROUP_ANNOTATION", "beside_job", "network_policy", "pod_group"]


def network_policy(spec: JobSpec, selector: dict[str, str]) -> Obj | None:
    """Ingress to the job's pods from the job's own pods only, on every port.

    torchrun's TCPStore and NCCL/gloo accept unauthenticated connections: anyone who can
    reach them can join the rendezvous or corrupt a collective. Egress stays open (DNS,
    registries, data, metrics)."""
    if not spec.network.policy:
        return None
    peers = {"podSelector": {"matchLabels": dict(selector)}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(spec, spec.name),
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [peers]}],
        },
    }


def beside_job(spec: JobSpec, selector: dict[str, str]) -> list[Obj]:
    """Every policy object the job's pods need, whatever the target."""
    policy = network_policy(spec, selector)
    return [policy] if policy else []


def pod_group(spec: JobSpec, name: str) -> Obj | None:
    """A Volcano PodGroup for targets without an operator that makes one (the PyTorchJob
    operator makes its own from runPolicy.schedulingPolicy). Pods join it through the
    POD_GROUP_ANNOTATION annotation set to ``name``."""
    if spec.scheduling.scheduler != "volcano":
        return None
    group: Obj = {"minMember": spec.min_available}
    if spec.scheduling.queue:
        group["queue"] = spec.scheduling.queue
    if spec.priority_class:
        group["priorityClassName"] = spec.priority_class
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": metadata(spec, name),
        "spec": group,
    }
