"""JobSpec -> a batch/v1 Indexed Job and the headless Service its pods live under. Pure.

No operator: the pod from render/pod.py carries the whole torchrun env (the layout in
targets/indexed_job/__init__.py), its node rank comes from the completion index.
"""

from __future__ import annotations

from ddpdeploy.contract import LaunchContract
from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import (
    metadata,
    pod_template,
    require_image,
    selector_labels,
    workload_metadata,
)
from ddpdeploy.render.policy import POD_GROUP_ANNOTATION, pod_group
from ddpdeploy.spec import INT32_MAX, JobSpec

# A node failure under static rendezvous usually fails every pod of the round, and each
# failed pod counts against backoffLimit: the default allows about two retries of the job.
RETRIES_BY_DEFAULT = 2


def _default_backoff(nodes: int) -> int:
    return min(RETRIES_BY_DEFAULT * nodes, INT32_MAX)  # backoffLimit is an int32


def headless_service(spec: JobSpec, contract: LaunchContract) -> Obj:
    """DNS for `<job>-<i>.<job>`, published before pods are ready: peers resolve each other
    as soon as a pod has an address (rendezvous still waits for the host in the pod)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, spec.name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(spec),
            "ports": [
                {
                    "name": "rendezvous",
                    "port": contract.port,
                    "targetPort": contract.port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def objects(spec: JobSpec, contract: LaunchContract) -> list[Obj]:
    """The headless Service, a Volcano PodGroup when gang-scheduled (no operator makes one
    here), and the Job."""
    group = pod_group(spec, spec.name)
    return [
        headless_service(spec, contract),
        *([group] if group else []),
        indexed_job(spec, contract),
    ]


def indexed_job(spec: JobSpec, contract: LaunchContract) -> Obj:
    require_image(spec)
    template = pod_template(spec, contract)
    if spec.scheduling.scheduler == "volcano":
        template["metadata"]["annotations"][POD_GROUP_ANNOTATION] = spec.name
    template["spec"]["subdomain"] = spec.name  # the headless Service
    template["spec"]["restartPolicy"] = "Never"  # podFailurePolicy requires it
    policy = spec.run_policy
    backoff = policy.backoff_limit
    job_spec: Obj = {
        "completionMode": "Indexed",
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "backoffLimit": backoff if backoff is not None else _default_backoff(spec.nodes),
        # Preemption, eviction and node drains replace the pod without using up retries.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                }
            ]
        },
    }
    if policy.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = policy.active_deadline_seconds
    if policy.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = policy.ttl_seconds_after_finished
    if spec.queued:
        job_spec["suspend"] = True  # Kueue unsuspends the job when its queue admits it
    job_spec["template"] = template
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": workload_metadata(spec, spec.name),
        "spec": job_spec,
    }
