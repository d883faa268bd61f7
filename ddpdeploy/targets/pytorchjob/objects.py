"""JobSpec -> the kubeflow.org/v1 PyTorchJob (a plain dict). Pure.

The pod comes from render/pod.py like every target's; the container command and env from
the launch contract; the operator injects the per-pod rendezvous env.
"""

from __future__ import annotations

from ddpdeploy.contract import LaunchContract
from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import pod_template, require_image, workload_metadata
from ddpdeploy.spec import JobSpec


def pytorchjob(spec: JobSpec, contract: LaunchContract, replicas: dict[str, int]) -> Obj:
    """The kubeflow.org/v1 PyTorchJob for ``spec``, with the layout's replica counts."""
    require_image(spec)
    template = pod_template(spec, contract)
    replica_specs = {
        replica: {"replicas": count, "restartPolicy": "OnFailure", "template": template}
        for replica, count in replicas.items()
    }
    job_spec: Obj = {"nprocPerNode": str(contract.nproc_per_node)}
    rdzv = spec.rendezvous
    if spec.c10d:
        # The operator's c10d rendezvous: elastic between min and max, or min = max (c10d).
        elastic: Obj = {
            "rdzvBackend": "c10d",
            "rdzvPort": contract.port,
            "rdzvId": spec.name,
            "minReplicas": spec.min_available,
            "maxReplicas": spec.max_nodes,
            "rdzvConf": [{"key": k, "value": v} for k, v in contract.rdzv_conf_items().items()],
        }
        if rdzv.max_restarts is not None:
            elastic["maxRestarts"] = rdzv.max_restarts
        job_spec["elasticPolicy"] = elastic
    run_policy = {**spec.run_policy.model_dump(by_alias=True, exclude_none=True)}
    run_policy.update(_scheduling_policy(spec))
    if run_policy:
        job_spec["runPolicy"] = run_policy
    job_spec["pytorchReplicaSpecs"] = replica_specs
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": workload_metadata(spec, spec.name),
        "spec": job_spec,
    }


def _scheduling_policy(spec: JobSpec) -> Obj:
    """runPolicy fields for gang scheduling (Volcano) and queueing (Kueue)."""
    out: Obj = {}
    if spec.scheduling.scheduler == "volcano":
        # The operator (started with --gang-scheduler-name=volcano) makes the PodGroup.
        policy: Obj = {"minAvailable": spec.min_available}
        if spec.scheduling.queue:
            policy["queue"] = spec.scheduling.queue
        if spec.priority_class:
            policy["priorityClass"] = spec.priority_class
        out["schedulingPolicy"] = policy
    if spec.queued:
        out["suspend"] = True  # Kueue unsuspends the job when its queue admits it
    return out
