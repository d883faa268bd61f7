"""`up` and `resume` against a cluster: preflight, a server-side dry run of every object,
then server-side apply, PVC first. Nothing is left half-applied: a failed dry run applies
nothing, and a failed job apply takes back the PVC and namespace it had just created.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddpdeploy.adapters.kube import Forbidden, Kube
from ddpdeploy.clusterplan import gpu_nodes, gpu_nodes_free
from ddpdeploy.errors import OperationError
from ddpdeploy.jobstate import job_state
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import Layout, layout_of

Obj = dict[str, Any]
Say = Callable[[str], None]
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"


@dataclass
class Plan:
    spec: JobSpec
    objects: list[Obj]
    create_namespace: bool = False  # the namespace is missing and may be created
    existing_job: Obj | None = None
    warnings: list[str] = field(default_factory=list)


def _ref(obj: Obj) -> str:
    return f"{obj['kind']} {obj['metadata'].get('namespace')}/{obj['metadata']['name']}"


def preflight(kube: Kube, spec: JobSpec, objects: list[Obj], create_namespace: bool) -> Plan:
    """Everything that can be known before the dry run; raises on what cannot work."""
    plan = Plan(spec, objects)
    layout = layout_of(spec.target)
    if not kube.has_kind(layout.api_version, layout.kind):
        raise OperationError(
            f"the {layout.kind} CRD ({layout.api_version}) is not installed in the cluster at "
            f"{kube.server}; {layout.install_hint}"
        )
    _check_namespace(kube, plan, create_namespace)
    if spec.gpus:
        _check_gpus(kube, plan)
    _check_storage(kube, plan)
    if not plan.create_namespace:
        plan.existing_job = kube.get(layout.api_version, layout.kind, spec.name, spec.namespace)
    return plan


def _check_namespace(kube: Kube, plan: Plan, create: bool) -> None:
    ns = plan.spec.namespace
    try:
        exists = kube.get("v1", "Namespace", ns) is not None
    except Forbidden:
        return  # namespace-scoped users may not read Namespaces; the dry run will tell
    if exists:
        return
    if not create:
        raise OperationError(
            f"namespace {ns} does not exist; create it (kubectl create namespace {ns}) or pass "
            "--create-namespace"
        )
    plan.create_namespace = True


def _check_gpus(kube: Kube, plan: Plan) -> None:
    spec = plan.spec
    try:
        nodes = kube.list("v1", "Node")
    except Forbidden:
        plan.warnings.append("cannot list nodes (forbidden): GPU capacity not checked")
        return
    fit, _ = gpu_nodes(nodes, spec.gpus)
    if fit < spec.nodes:
        raise OperationError(
            f"the cluster cannot hold {spec.nodes} × {spec.gpus} GPUs: {fit} node(s) have "
            f"{spec.gpus} or more allocatable nvidia.com/gpu; lower --nodes or --gpus, or add "
            "GPU nodes (and the NVIDIA device plugin)"
        )
    try:
        free = gpu_nodes_free(nodes, kube.list("v1", "Pod"), spec.gpus)
    except Forbidden:
        return
    if free < spec.nodes:
        plan.warnings.append(
            f"only {free} node(s) have {spec.gpus} GPUs free right now; the job's pods will "
            "wait for capacity"
        )


def _check_storage(kube: Kube, plan: Plan) -> None:
    pvcs = [o for o in plan.objects if o["kind"] == "PersistentVolumeClaim"]
    if not pvcs:
        return
    wanted = pvcs[0]["spec"].get("storageClassName")
    try:
        classes = kube.list("storage.k8s.io/v1", "StorageClass")
    except Forbidden:
        plan.warnings.append("cannot list storage classes (forbidden): storageClass not checked")
        return
    names = {c["metadata"]["name"] for c in classes}
    if wanted and wanted not in names:
        known = ", ".join(sorted(names)) or "none"
        raise OperationError(
            f"checkpoint.storageClass: StorageClass {wanted} does not exist in the cluster "
            f"(it has: {known})"
        )
    default = any(
        (c["metadata"].get("annotations") or {}).get(DEFAULT_CLASS) == "true" for c in classes
    )
    if not wanted and not default:
        plan.warnings.append(
            "the cluster has no default StorageClass: the checkpoint PVC stays Pending until "
            "a volume is bound (set checkpoint.storageClass)"
        )


def _namespace_obj(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _refuse_existing(plan: Plan, replace: bool) -> None:
    if plan.existing_job is not None and not replace:
        spec = plan.spec
        state = job_state(plan.existing_job, []).state
        raise OperationError(
            f"{plan.existing_job['kind']} {spec.name} already exists in namespace "
            f"{spec.namespace} ({state}); "
            "pass --replace to delete and recreate it, or choose another --name"
        )


def dry_run(kube: Kube, plan: Plan, replace: bool, say: Say) -> None:
    """The server validates every object (admission included); nothing is stored."""
    _refuse_existing(plan, replace)
    if plan.create_namespace:
        kube.create(_namespace_obj(plan.spec.namespace), dry_run=True)
        say(f"would create Namespace {plan.spec.namespace}")
        say("objects not checked by the server: their namespace does not exist yet")
        return
    for obj in plan.objects:
        kube.apply(obj, dry_run=True)
    for obj in plan.objects:
        job_kind = layout_of(plan.spec.target).kind
        verb = "replace" if obj["kind"] == job_kind and plan.existing_job else "apply"
        say(f"would {verb} {_ref(obj)} (server dry run passed)")


def apply(kube: Kube, plan: Plan, replace: bool, say: Say) -> None:
    """Dry run first; then replace the old job if asked, then apply PVC, then the job."""
    spec = plan.spec
    _refuse_existing(plan, replace)
    created_ns = False
    if plan.create_namespace:
        kube.create(_namespace_obj(spec.namespace))
        created_ns = True
        say(f"created Namespace {spec.namespace}")
    created: list[Obj] = []
    try:
        for obj in plan.objects:
            kube.apply(obj, dry_run=True)
        if plan.existing_job is not None:
            layout = layout_of(spec.target)
            delete_job_and_wait(kube, spec.name, spec.namespace, layout)
            say(f"deleted the old {layout.kind} {spec.namespace}/{spec.name}")
        for obj in plan.objects:  # rendered with the PVC first
            meta = obj["metadata"]
            existed = kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])
            kube.apply(obj)
            if existed is None:
                created.append(obj)
            say(f"applied {_ref(obj)}")
    except OperationError:
        _take_back(kube, created, spec.namespace if created_ns else None)
        raise


def _take_back(kube: Kube, created: list[Obj], namespace: str | None) -> None:
    for obj in reversed(created):
        meta = obj["metadata"]
        kube.delete(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])
    if namespace:
        kube.delete("v1", "Namespace", namespace, None)


def delete_job_and_wait(
    kube: Kube, name: str, namespace: str, layout: Layout, timeout: float = 120
) -> None:
    api, kind = layout.api_version, layout.kind
    kube.delete(api, kind, name, namespace)
    deadline = time.monotonic() + timeout
    while kube.get(api, kind, name, namespace) is not None:
        if time.monotonic() > deadline:
            raise OperationError(
                f"{kind} {namespace}/{name} is still being deleted after {timeout:.0f}s "
                "(a finalizer?); try again later"
            )
        time.sleep(0.5)


def find_saved_spec(kube: Kube, name: str, namespace: str) -> JobSpec:
    """The spec to resume: the job must have ended (or be gone)."""
    from ddpdeploy.jobwatch import find_job

    _, job = find_job(kube, name, namespace)
    if job is not None:
        state = job_state(job, [])
        if not state.done:
            raise OperationError(
                f"{job['kind']} {namespace}/{name} is {state.state}; nothing to resume "
                "(`ddpdeploy down` it first to restart it)"
            )
    return saved_spec_of(kube, name, namespace, job)


def saved_spec_of(kube: Kube, name: str, namespace: str, job: Obj | None = None) -> JobSpec:
    """The spec `up` last submitted: from the job, else from its checkpoint PVC (which
    outlives `down`)."""
    from ddpdeploy.clusterplan import saved_spec
    from ddpdeploy.render.pod import MANAGED_BY

    if job is None:
        from ddpdeploy.jobwatch import find_job

        _, job = find_job(kube, name, namespace)
    spec = saved_spec(job) if job is not None else None
    if spec is not None:
        return spec
    ours = f"app.kubernetes.io/instance={name},app.kubernetes.io/managed-by={MANAGED_BY}"
    for claim in kube.list("v1", "PersistentVolumeClaim", namespace, labels=ours):
        spec = saved_spec(claim)
        if spec is not None:
            return spec
    raise OperationError(
        f"no saved spec for {name} in namespace {namespace}: neither a job nor a "
        "checkpoint PVC that `ddpdeploy up` made is there; run `ddpdeploy up` again"
    )
