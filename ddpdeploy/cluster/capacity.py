"""What the cluster's nodes can hold, from node and pod objects (pure): whole GPUs free for
the job's pods, for `up`'s preflight."""

from __future__ import annotations

from typing import Any

from ddpdeploy.obj import Obj
from ddpdeploy.spec import quantity

GPU = "nvidia.com/gpu"


def _quantity_int(value: Any) -> int:
    """A count the API reports as a quantity ("8"), whole; 0 when it is none."""
    try:
        return int(quantity(value)[1])
    except (ValueError, OverflowError):  # OverflowError: an infinite amount
        return 0


def gpu_nodes(nodes: list[Obj], gpus: int) -> tuple[int, int]:
    """(nodes whose allocatable GPUs hold ``gpus`` at all, schedulable ones among them)."""
    fit = ready = 0
    for node in nodes:
        alloc = _quantity_int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
        if alloc < gpus:
            continue
        fit += 1
        if not (node.get("spec") or {}).get("unschedulable"):
            ready += 1
    return fit, ready


def gpu_requests_by_node(pods: list[Obj]) -> dict[str, int]:
    """GPUs that running or pending-but-bound pods hold, per node name."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in (pod.get("spec") or {}).get("containers") or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            used[node] = used.get(node, 0) + _quantity_int(limits.get(GPU, 0))
    return used


def gpu_nodes_free(nodes: list[Obj], pods: list[Obj], gpus: int) -> int:
    """Nodes that have ``gpus`` free right now."""
    used = gpu_requests_by_node(pods)
    free = 0
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        alloc = _quantity_int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
        if alloc - used.get(name, 0) >= gpus and not (node.get("spec") or {}).get("unschedulable"):
            free += 1
    return free
