"""Which job a cluster verb acts on, and whether it is ours: the one preamble of `status`,
`logs`, `down`, `scale`, `resume` and `collect` (connect, namespace, find the job, the
"no job" line), and the ownership rule every change goes through."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpdeploy.adapters.kube import Kube, KubeApi
from ddpdeploy.cluster.labels import INSTANCE_LABEL, MANAGED_BY_LABEL, ours
from ddpdeploy.cluster.saved import saved_spec
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import MANAGED_BY
from ddpdeploy.spec import spec_with
from ddpdeploy.targets import DEFAULT_TARGET, JOB_KINDS, TARGETS, Layout
from ddpdeploy.targets.trainjob.objects import REPLICATED_JOB
from ddpdeploy.text import show

if TYPE_CHECKING:
    from ddpdeploy.spec import JobSpec


def ref(obj: Obj) -> str:
    """``Kind namespace/name``, as every line names an object."""
    return f"{obj['kind']} {obj['metadata'].get('namespace')}/{obj['metadata']['name']}"


# --- ownership -------------------------------------------------------------------------


def owner_of(obj: Obj) -> str:
    """Who the object's labels say made it, for the refusal line."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    manager, instance = labels.get(MANAGED_BY_LABEL), labels.get(INSTANCE_LABEL)
    if manager is None:
        return "no ddpdeploy labels"
    return f"{MANAGED_BY_LABEL}={manager}" + (f", instance={instance}" if instance else "")


def not_ours(obj: Obj, job: str) -> str | None:
    """Why ``obj`` is not an object ddpdeploy made for job ``job`` (None: it is ours).

    Ours: our managed-by and instance labels, and a saved spec naming this job and
    namespace (set when we created it; a spec that does not is refused, not trusted)."""

    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY or labels.get(INSTANCE_LABEL) != job:
        return f"owner: {owner_of(obj)}"
    try:
        spec = saved_spec(obj)
    except UserError as exc:
        return str(exc)
    if spec is None or spec.name != job:
        return f"ddpdeploy did not create it for job {job} (no saved spec naming the job)"
    return None


def require_ours(obj: Obj, job: str, verb: str) -> None:
    why = not_ours(obj, job)
    if why is not None:
        raise OperationError(f"{ref(obj)} is not ours ({why}); not {verb}")


def labelled_ours(obj: Obj) -> bool:
    """Labelled as ddpdeploy's: what a reading verb (status, logs, a wait) counts as ours."""

    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def made_for(pod: Obj, job: Obj) -> bool:
    """Whether ``pod`` is one of ``job``'s, the one rule every reader of a job's pods
    (`status`, `logs`, `logs -f`, a wait, `collect`) keeps: its labels say ddpdeploy made it
    for this job (the controllers copy them from our pod template), and its one controller
    is this job (kind, name and uid). A look-alike that the target's pod selector matches
    (another job's pod, one made by hand) is never read."""
    owner = _labelled_controller(pod, job)
    return owner is not None and (
        _trainjobs_job(owner, job) or (_names_job(owner, job) and owner.get("uid") == _uid(job))
    )


def holds_its_name(pod: Obj, job: Obj) -> bool:
    """Whether ``pod`` is an earlier run's pod of ``job``'s name, deleted but not gone: kept
    by finalizers, or still stopping in its grace period (`down` then `resume`). Our labels
    for the job, and its one controller an object of the job's kind and name with another
    uid (for a TrainJob: its JobSet's Job, as for ``made_for``). It holds the name the
    job's own pod needs, which is why that pod cannot start. A wait and `status` show it
    with the job's pods; another job's pod being deleted is not one."""
    if not (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    owner = _labelled_controller(pod, job)
    return owner is not None and (
        _trainjobs_job(owner, job) or (_names_job(owner, job) and owner.get("uid") != _uid(job))
    )


def _labelled_controller(pod: Obj, job: Obj) -> dict[str, Any] | None:
    """The pod's one controller reference when our labels for ``job`` are on it; None for
    none or several (the apiserver allows at most one; a pod made by hand names none)."""
    if not _labelled_for(pod, job):
        return None
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    controllers = [o for o in refs if isinstance(o, dict) and o.get("controller")]
    return controllers[0] if len(controllers) == 1 else None


def _uid(job: Obj) -> Any:
    return (job.get("metadata") or {}).get("uid")


def _names_job(owner: dict[str, Any], job: Obj) -> bool:
    """The reference is to an object of the job's kind and name (its uid aside)."""
    ref = (owner.get("apiVersion"), owner.get("kind"), owner.get("name"))
    return ref == (job.get("apiVersion"), job.get("kind"), (job.get("metadata") or {}).get("name"))


def _trainjobs_job(owner: dict[str, Any], job: Obj) -> bool:
    """A TrainJob's pods are its JobSet's Job's, a level down: our JobSet has one
    replicatedJob `node` with replicas 1 (objects.py; the torch runtimes'), so the one Job
    it makes is `<name>-node-0`, and that exact name is the rule (`<name>-node-01`,
    `-node-1` or a Unicode digit is someone else's). The Job's uid is the JobSet's to know."""
    name = (job.get("metadata") or {}).get("name")
    return (
        job.get("kind") == "TrainJob"
        and (owner.get("apiVersion"), owner.get("kind")) == ("batch/v1", "Job")
        and owner.get("name") == f"{name}-{REPLICATED_JOB}-0"
    )


def _labelled_for(pod: Obj, job: Obj) -> bool:
    """Our labels for ``job``'s name are on ``pod`` (the controllers copy the template's)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    name = (job.get("metadata") or {}).get("name")
    return all(labels.get(k) == v for k, v in ours(name).items())


# --- finding the job -------------------------------------------------------------------


def no_job(name: str, namespace: str, kinds: str = JOB_KINDS) -> str:
    return f"no job {name} ({kinds}) in namespace {namespace}"


def find_any_job(
    kube: KubeApi, name: str, namespace: str, layouts: Iterable[Layout] | None = None
) -> tuple[Layout, Obj | None]:
    """The job ``name`` of any kind the cluster serves, ours first, foreign otherwise (so
    that a command can refuse it by name rather than say there is none)."""
    foreign: tuple[Layout, Obj] | None = None
    for layout in TARGETS.values() if layouts is None else layouts:
        if not kube.has_kind(layout.api_version, layout.kind):
            continue
        job = kube.get(layout.api_version, layout.kind, name, namespace)
        if job is None:
            continue
        if not_ours(job, name) is None:
            return layout, job
        foreign = foreign or (layout, job)
    if foreign is not None:
        return foreign
    return TARGETS[DEFAULT_TARGET], None


@dataclass(frozen=True)
class Found:
    """The job a verb acts on: the connection, where, its target, and the object (None when
    there is none and the verb goes on without one)."""

    kube: KubeApi
    name: str
    namespace: str
    layout: Layout
    job: Obj | None


def find_job(
    kube: KubeApi,
    name: str,
    namespace: str | None,
    *,
    verb: str | None = None,
    layouts: tuple[Layout, ...] | None = None,
    required: bool = True,
    hint: str = "",
) -> Found:
    """The job ``name`` in ``namespace`` (default: the context's).

    ``verb`` None (reading: status, logs): only a job labelled as ours counts, a foreign one
    is as good as none. A verb ("deleted", "scaled", ...): a foreign job of that name is
    refused, naming its owner. ``required``: no job is the one "no job" line (+ ``hint``, in
    which ``{namespace}`` is the namespace)."""
    ns = namespace or kube.default_namespace
    layout, job = find_any_job(kube, name, ns, layouts)
    if job is not None and verb is None and not labelled_ours(job):
        layout, job = TARGETS[DEFAULT_TARGET], None
    if job is not None and verb is not None:
        require_ours(job, name, verb)
    if job is None and required:
        kinds = JOB_KINDS if layouts is None else " or ".join(t.kind for t in layouts)
        missing = no_namespace(kube, ns)  # a mistyped -n: said, not "no job" alone
        raise OperationError(no_job(name, ns, kinds) + (missing or hint.format(namespace=ns)))
    return Found(kube, name, ns, layout, job)


def no_namespace(kube: KubeApi, namespace: str) -> str:
    """What to add to a "no job" line when ``namespace`` does not exist (one that may not be
    read is not known not to): a mistyped -n looked like a job gone."""
    try:
        if kube.get("v1", "Namespace", namespace) is not None:
            return ""
    except OperationError:  # forbidden (a namespaced role), or the read failed
        return ""
    return ": the namespace does not exist; check -n (`kubectl get namespaces` lists them)"


def connect(kubeconfig: str | None, context: str | None) -> Kube:
    """A connected `Kube` adapter (imports the kubernetes client only now)."""
    return Kube(kubeconfig, context)


def in_context_namespace(spec: JobSpec, namespace: str) -> JobSpec:
    """``spec`` moved into the kubeconfig context's ``namespace`` (for a spec that names
    none): a context namespace the spec refuses is named as the context's."""

    try:
        return spec_with(spec, namespace=namespace)
    except UserError as exc:
        reason = str(exc).removeprefix("namespace: ")
        raise UserError(
            f"the kubeconfig context's namespace {show(namespace)} {reason}; fix it in the "
            "kubeconfig, or pass -n or set namespace: in the spec"
        ) from None


def open_job(
    kubeconfig: str | None,
    context: str | None,
    name: str,
    namespace: str | None,
    **how: Any,
) -> Found:
    """Connect (flag, then the context's namespace, then ``default``) and find the job."""
    return find_job(connect(kubeconfig, context), name, namespace, **how)
