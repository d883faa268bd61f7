"""JobSpec -> a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1). Pure.

The pod comes from render/pod.py like every target's; its parts go where a TrainJob takes
them: image, command, env and resources into `trainer`, the rest of the pod (volumes,
mounts, scheduling, pull secrets, security context, pod metadata) into a `runtimePatches`
entry that patches the runtime's `node` Job. Trainer injects the rendezvous env itself.
"""

from __future__ import annotations

from ddpdeploy.contract import LaunchContract
from ddpdeploy.errors import UserError
from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import pod_template, require_image, workload_metadata
from ddpdeploy.spec import JobSpec

REPLICATED_JOB = "node"  # the torch runtimes' replicated Job, and its training container

PATCH_MANAGER = "ddpdeploy"
# Pod fields a runtime patch may set (the CRD's trainingRuntimeSpec ... template.spec).
_POD_PATCHABLE = (
    "affinity",
    "imagePullSecrets",
    "initContainers",
    "nodeSelector",
    "schedulingGates",
    "securityContext",
    "serviceAccountName",
    "terminationGracePeriodSeconds",
    "tolerations",
    "volumes",
)
_CONTAINER_PATCHABLE = ("securityContext", "volumeMounts")
# Pod fields of our default pod that no runtime patch can carry, left to the runtime: the
# service account token (set automountServiceAccountToken: false in the runtime to keep it
# out) and Service links (noise). Anything else we cannot carry is refused in one line.
_RUNTIME_DECIDES = ("automountServiceAccountToken", "enableServiceLinks")
# The container's fields that `trainer` holds, or that the runtime owns (its port 29400; the
# pull policy and where a failure's message comes from stay the runtime's).
_CONTAINER_ELSEWHERE = (
    "name",
    "image",
    "command",
    "env",
    "resources",
    "ports",
    "imagePullPolicy",
    "terminationMessagePolicy",
)


def _refuse(spec: JobSpec, what: str) -> UserError:
    return UserError(
        f"target trainjob: a TrainJob cannot set the pod's {what}; set it in the "
        f"ClusterTrainingRuntime {spec.runtime!r} or use --target pytorchjob"
    )


def _pod_patch(spec: JobSpec, pod: Obj, container: Obj) -> Obj:
    """The runtime patch's pod spec: every pod field of ours, or one line naming the field
    a TrainJob cannot carry (never silently dropped: it may be a security setting)."""
    out: Obj = {}
    for key, value in pod.items():
        if key == "containers" or key in _RUNTIME_DECIDES:
            continue
        if key not in _POD_PATCHABLE:
            raise _refuse(spec, key)
        out[key] = value
    patch: Obj = {"name": REPLICATED_JOB}
    for key, value in container.items():
        if key in _CONTAINER_PATCHABLE:
            patch[key] = value
        elif key not in _CONTAINER_ELSEWHERE:
            raise _refuse(spec, f"container {key}")
    if len(patch) > 1:
        out["containers"] = [patch]
    return out


def trainjob(spec: JobSpec, contract: LaunchContract) -> Obj:
    require_image(spec)
    template = pod_template(spec, contract)
    (container,) = template["spec"]["containers"]
    command = container["command"]
    entry = contract.entry_argv()
    trainer: Obj = {
        "image": container["image"],
        "command": command[: len(command) - len(entry)],  # the DNS wait, then torchrun
        "args": entry,
        "env": container["env"],
        "numNodes": spec.nodes,
        "numProcPerNode": contract.nproc_per_node,
    }
    if container.get("resources"):
        trainer["resourcesPerNode"] = container["resources"]
    job_spec: Obj = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
            "name": spec.runtime,
        },
        "trainer": trainer,
    }
    if spec.run_policy.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.run_policy.active_deadline_seconds
    if spec.queued:
        job_spec["suspend"] = True  # Kueue unsuspends the job when its queue admits it
    pod = {"metadata": template["metadata"], "spec": _pod_patch(spec, template["spec"], container)}
    job_template = {"spec": {"template": pod}}
    job_spec["runtimePatches"] = [
        {
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {"replicatedJobs": [{"name": REPLICATED_JOB, "template": job_template}]}
                }
            },
        }
    ]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": workload_metadata(spec, spec.name),
        "spec": job_spec,
    }
