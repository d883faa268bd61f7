"""Every change a cluster verb makes: `up`, `scale` and `resume` through one apply
(preflight, a server-side dry run of every object, then the change), `down` through one
delete. Nothing is left half-applied:

- only objects ddpdeploy made for this job are changed or deleted (labels, and the saved
  spec naming the job: ddpdeploy.cluster.find); anything else is refused before anything
  changes;
- a new object is created create-only, so the API's own conflict decides between two `up`s
  of the same name; existing objects of ours are server-side applied;
- any failure, interrupt included, takes back what this run created, and the one line
  says the first error, then what was removed or could not be;
- a replace holds SIGINT/SIGTERM off from deleting the old job to creating the new one; an
  in-place change (`scale`) holds them off while the job is applied.

No printing: what happens is told through the ``say`` callback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ddpdeploy.adapters.kube import Conflict, Forbidden, KubeApi
from ddpdeploy.cluster.capacity import (
    FIT_RESOURCES,
    fit,
    gpu_nodes,
    gpu_nodes_free,
    limit_range_breaches,
    pod_quota_use,
    pod_requests,
    quota_shorts,
)
from ddpdeploy.cluster.capacity import shown as shown_amount
from ddpdeploy.cluster.find import (
    Found,
    labelled_ours,
    no_job,
    no_namespace,
    not_ours,
    owner_of,
    require_ours,
)
from ddpdeploy.cluster.find import ref as _ref
from ddpdeploy.cluster.jobstate import held_by, job_state
from ddpdeploy.cluster.labels import ours_selector
from ddpdeploy.cluster.saved import SPEC_ANNOTATION, saved_record, saved_spec, with_saved_spec
from ddpdeploy.contract import RunRecord
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.formats import duration
from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import checkpoint_claim_name
from ddpdeploy.report import Say
from ddpdeploy.signals import held_signals, interrupted
from ddpdeploy.spec import JobSpec, spec_with
from ddpdeploy.targets import Layout, layout_of, render_objects

DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
NETWORK_POLICY = ("networking.k8s.io/v1", "NetworkPolicy")
DELETE_TIMEOUT = 120.0  # seconds `up --replace` waits for the old job to go (--timeout)


@dataclass
class Checked:
    """The job's objects as preflight found the cluster for them: what `apply` and the dry
    run act on."""

    spec: JobSpec
    objects: list[Obj]
    create_namespace: bool = False  # the namespace is missing and may be created
    existing_job: Obj | None = None
    existing: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (kind, name) -> ours
    warnings: list[str] = field(default_factory=list)
    record: RunRecord | None = None  # saved beside the spec (on an adopted claim too)


def _terminating(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


# --- preflight -------------------------------------------------------------------------


def preflight(
    kube: KubeApi,
    spec: JobSpec,
    objects: list[Obj],
    create_namespace: bool,
) -> Checked:
    """Everything that can be known before the dry run; raises on what cannot work, and on
    anything of the same name that is not ours."""
    checked = Checked(spec, objects)
    layout = layout_of(spec.target)
    if not kube.has_kind(layout.api_version, layout.kind):
        raise OperationError(
            f"the {layout.kind} CRD ({layout.api_version}) is not installed in the cluster at "
            f"{kube.server}; {layout.install_hint}"
        )
    _check_schedulers(kube, spec)
    _check_namespace(kube, checked, create_namespace)
    if spec.gpus:
        _check_gpus(kube, checked)
    _check_fit(kube, checked, layout)
    _check_quota(kube, checked, layout)
    _check_limit_ranges(kube, checked, layout)
    _check_storage(kube, checked)
    if not checked.create_namespace:
        _check_existing(kube, checked, layout)
    return checked


# The kinds whose CRDs say Volcano and Kueue run in the cluster (every release since Volcano
# 1.0 and Kueue 0.3 serves these versions).
VOLCANO_POD_GROUP = ("scheduling.volcano.sh/v1beta1", "PodGroup")
KUEUE_LOCAL_QUEUE = ("kueue.x-k8s.io/v1beta1", "LocalQueue")


def _check_schedulers(kube: KubeApi, spec: JobSpec) -> None:
    """Volcano (--scheduler volcano) and Kueue (--queue) must be installed: without them the
    job's pods wait for a scheduler that is not there, or the job stays suspended, for good
    and without a word (no event, no condition)."""
    if spec.scheduling.scheduler == "volcano" and not kube.has_kind(*VOLCANO_POD_GROUP):
        raise OperationError(
            f"--scheduler volcano: Volcano is not installed in the cluster at {kube.server} "
            f"(no {VOLCANO_POD_GROUP[1]} kind, {VOLCANO_POD_GROUP[0]}): no pod of the job "
            "would ever be scheduled; install Volcano, or drop --scheduler volcano"
        )
    if spec.queued and not kube.has_kind(*KUEUE_LOCAL_QUEUE):
        raise OperationError(
            f"--queue {spec.scheduling.queue}: Kueue is not installed in the cluster at "
            f"{kube.server} (no {KUEUE_LOCAL_QUEUE[1]} kind, {KUEUE_LOCAL_QUEUE[0]}): the "
            "job would stay suspended; install Kueue, or drop --queue"
        )


def prepare(
    kube: KubeApi,
    spec: JobSpec,
    say: Say,
    create_namespace: bool = False,
    record: RunRecord | None = None,
) -> Checked:
    """The preflight of ``spec``'s objects (rendered with the saved spec, and ``record``:
    what `up --build` knows of its image, saved beside it; `scale` and `resume` pass the
    live one's, ``carried_record``), its warnings said: what `up`, `scale` and `resume` all
    start from."""

    objects = with_saved_spec(render_objects(spec, record), spec, record)
    checked = preflight(kube, spec, objects, create_namespace)
    checked.record = record
    for warning in checked.warnings:
        say(f"warning: {warning}")
    return checked


def _check_namespace(kube: KubeApi, checked: Checked, create: bool) -> None:
    ns = checked.spec.namespace
    try:
        got = kube.get("v1", "Namespace", ns)
    except Forbidden:
        return  # namespace-scoped users may not read Namespaces; the dry run will tell
    if got is not None and _terminating(got):
        raise OperationError(
            f"namespace {ns} is being deleted (Terminating); wait until it is gone, then "
            "run again (with --create-namespace), or use another namespace (-n)"
        )
    if got is not None:
        return
    if not create:
        raise OperationError(
            f"namespace {ns} does not exist; create it (kubectl create namespace {ns}) or pass "
            "--create-namespace"
        )
    checked.create_namespace = True


def _check_existing(kube: KubeApi, checked: Checked, layout: Layout) -> None:
    """Every object of ours-to-be that exists already must be ours and not dying."""
    spec = checked.spec
    for obj in checked.objects:
        meta = obj["metadata"]
        got = kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])
        if got is None:
            continue
        if obj["kind"] == layout.kind:
            require_ours(got, spec.name, "replaced")
            checked.existing_job = got
            continue
        why = not_ours(got, spec.name)
        if why is not None and obj["kind"] == "PersistentVolumeClaim":
            raise OperationError(
                f"{_ref(got)} exists and is not ours ({why}); "
                "to use it as is, name it as checkpoint.claimName or pass --adopt-pvc, or "
                "choose another --name"
            )
        if why is not None:
            raise OperationError(f"{_ref(got)} exists and is not ours ({why}); not changed")
        if _terminating(got):
            raise OperationError(
                f"{_ref(got)} is being deleted (Terminating); wait until it is gone "
                f"(kubectl get {got['kind'].lower()} -n {meta['namespace']} {meta['name']}), "
                "then run again"
            )
        checked.existing[(obj["kind"], meta["name"])] = got
    claim = spec.checkpoint.claim_name if spec.checkpoint else None
    if claim:
        got = kube.get("v1", "PersistentVolumeClaim", claim, spec.namespace)
        if got is None:
            checked.warnings.append(
                f"checkpoint.claimName: PersistentVolumeClaim {spec.namespace}/{claim} does "
                "not exist; the job's pods wait until it does"
            )
        elif _terminating(got):
            raise OperationError(
                f"checkpoint.claimName: {_ref(got)} is being deleted (Terminating); the job "
                "would lose its volume; wait until it is gone or name another claim"
            )
    _check_secrets(kube, checked)


def _check_secrets(kube: KubeApi, checked: Checked) -> None:
    """A secretEnv Secret (or key) that is not there: the kubelet cannot create the
    containers (CreateContainerConfigError) until it is; a warning, as for a missing claim,
    since it may be made next. Not checked when Secrets may not be read."""
    spec = checked.spec
    for var, ref in sorted(spec.secret_env.items()):
        try:
            got = kube.get("v1", "Secret", ref.secret, spec.namespace)
        except Forbidden:
            return
        if got is None:
            missing = f"Secret {spec.namespace}/{ref.secret} does not exist"
        elif ref.key not in (got.get("data") or {}) and ref.key not in (
            got.get("stringData") or {}
        ):
            missing = f"Secret {spec.namespace}/{ref.secret} has no key {ref.key}"
        else:
            continue
        checked.warnings.append(
            f"secretEnv.{var}: {missing}; the job's containers cannot be created "
            "(CreateContainerConfigError) until it does"
        )


def adopt_pvc(kube: KubeApi, spec: JobSpec, say: Say) -> JobSpec:
    """--adopt-pvc: the existing PVC <name>-checkpoints, used as is (as if named as
    checkpoint.claimName): never relabelled, never deleted by `down --purge`."""

    ckpt = spec.checkpoint
    if ckpt is None or not ckpt.size:
        raise UserError("--adopt-pvc: only with checkpoint.size (a claimName is used as is)")
    name = checkpoint_claim_name(spec) or ""
    got = kube.get("v1", "PersistentVolumeClaim", name, spec.namespace)
    if got is None:
        raise UserError(
            f"--adopt-pvc: there is no PersistentVolumeClaim {spec.namespace}/{name} to adopt; "
            "drop the flag to create it"
        )
    if not_ours(got, spec.name) is None:
        return spec  # ours already: nothing to adopt
    if _terminating(got):
        raise OperationError(f"--adopt-pvc: {_ref(got)} is being deleted (Terminating)")
    say(
        f"using {_ref(got)} as is (--adopt-pvc; its owner: {owner_of(got)}); ddpdeploy never "
        "relabels or deletes it, and keeps the job's saved spec on it in annotations of its own"
    )
    adopted = ckpt.model_dump(mode="json", by_alias=True, exclude={"size", "storage_class"})
    return spec_with(spec, checkpoint={**adopted, "claimName": name})


def _check_gpus(kube: KubeApi, checked: Checked) -> None:
    spec = checked.spec
    try:
        nodes = kube.list("v1", "Node")
    except Forbidden:
        checked.warnings.append("cannot list nodes (forbidden): GPU capacity not checked")
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
        checked.warnings.append(
            f"only {free} node(s) have {spec.gpus} GPUs free right now; the job's pods will "
            "wait for capacity"
        )


_FLAG = {"cpu": "--cpu", "memory": "--memory"}


def _check_fit(kube: KubeApi, checked: Checked, layout: Layout) -> None:
    """The job's pods, at their CPU and memory requests, must fit the nodes they may go to
    (as the GPU check: an error when the nodes' allocatable cannot hold them at all, a
    warning when what runs there now leaves too little)."""
    spec = checked.spec
    job = next((o for o in checked.objects if o["kind"] == layout.kind), None)
    templates = layout.pod_templates(job) if job is not None else []
    if not templates:
        return
    want = pod_requests(templates[0])
    try:
        nodes = kube.list("v1", "Node")
    except Forbidden:
        checked.warnings.append("cannot list nodes (forbidden): CPU and memory not checked")
        return
    if not nodes:
        return  # nothing to measure against (a cluster that adds nodes on demand)
    count = spec.nodes
    got = fit(nodes, want, count, dict(spec.node_selector))
    if spec.network.host_network and 0 < got.nodes < count:
        # The scheduler puts no two of them on one node: they ask for the same host ports.
        raise OperationError(
            f"--host-network: each of the job's {count} pods needs a node of its own (on the "
            f"host's network they listen on the same ports), and {got.nodes} schedulable "
            f"node(s) take them; lower --nodes to at most {got.nodes}, add nodes, or drop "
            "--host-network"
        )
    asked = ", ".join(f"{r} {shown_amount(r, want[r])}" for r in FIT_RESOURCES if want[r] > 0)
    if got.pods < count:
        where = "the schedulable nodes hold" if got.nodes != 1 else "the node holds"
        if not got.nodes and spec.node_selector:
            # Not a matter of size: lowering --cpu or --nodes places nothing.
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(spec.node_selector.items()))
            raise OperationError(
                f"no schedulable node matches the job's nodeSelector {wanted}: its "
                f"{count} pod(s) would stay Pending; fix nodeSelector in the spec, or label "
                "a node with it (kubectl label node NODE KEY=VALUE)"
            )
        if not got.nodes:
            why = "no schedulable node"
        else:
            has = ", ".join(f"{r} {shown_amount(r, v)}" for r, v in got.largest.items())
            largest = "its largest node has" if got.nodes > 1 else "it has"
            why = f"{where} {got.pods}; {largest} {has} allocatable"
        short = got.short or FIT_RESOURCES
        flags = " or ".join(f"{_FLAG[r]} (per node)" for r in short)
        raise OperationError(
            f"{count} pod(s) requesting {asked} each do not fit the cluster: {why}; lower "
            f"{flags} or --nodes, or add nodes"
        )
    try:
        now = fit(nodes, want, count, dict(spec.node_selector), kube.list("v1", "Pod"))
    except Forbidden:
        return
    if now.pods_now is not None and now.pods_now < count:
        checked.warnings.append(
            f"only {now.pods_now} of the {count} pod(s) requesting {asked} fit beside what "
            "runs on the nodes now; the others wait (Pending) until that frees up"
        )


def _check_quota(kube: KubeApi, checked: Checked, layout: Layout) -> None:
    """The namespace's ResourceQuotas must let the job's pods be created: a pod over quota is
    refused by the API server when the operator creates it, and the job waits with no pod
    and no word of why (the dry run of the job itself passes). An error when the quota can
    never hold them, a warning when what is used of it now leaves too little."""
    spec = checked.spec
    if checked.create_namespace:
        return  # a new namespace has no quota
    job = next((o for o in checked.objects if o["kind"] == layout.kind), None)
    templates = layout.pod_templates(job) if job is not None else []
    if not templates:
        return
    try:
        quotas = kube.list("v1", "ResourceQuota", spec.namespace)
    except Forbidden:
        return
    shorts = quota_shorts(quotas, pod_quota_use(templates[0]), spec.nodes)
    for short in shorts:
        where = f"ResourceQuota {spec.namespace}/{short.quota}"
        asked = f"the job's {spec.nodes} pod(s) ask for {short.key} {short.amount(short.asked)}"
        if short.never:
            raise OperationError(
                f"{where} allows {short.key} {short.amount(short.hard)}; {asked}: the "
                "operator could not create them; lower --cpu, --memory or --nodes, or ask "
                "for a larger quota"
            )
        checked.warnings.append(
            f"{where}: {short.key} {short.amount(short.used)} of {short.amount(short.hard)} "
            f"is used; {asked}: some wait uncreated until that frees up"
        )


def _check_limit_ranges(kube: KubeApi, checked: Checked, layout: Layout) -> None:
    """The namespace's LimitRanges must let the job's pods be created: one outside a
    bound (a max below --cpu or --memory, a min above, a limit/request ratio, a default CPU
    limit below the CPU request ours leave unlimited) is refused by the API server when
    the operator creates it, and the job waits with no pod and no word of why, as over a
    quota. Checked here whether or not the API server enforces them (its LimitRanger)."""
    spec = checked.spec
    if checked.create_namespace:
        return  # a new namespace has no LimitRange
    job = next((o for o in checked.objects if o["kind"] == layout.kind), None)
    if job is None or not layout.pod_templates(job):
        return
    try:
        ranges = kube.list("v1", "LimitRange", spec.namespace)
    except Forbidden:
        return
    # The pods as the operator creates them: a PyTorchJob's workers get its init container.
    for template, added in zip(
        layout.pod_templates(job), layout.added_containers(job), strict=True
    ):
        for breach in limit_range_breaches(ranges, template, added):
            raise OperationError(
                f"LimitRange {spec.namespace}/{breach.limit_range} "
                f"{breach.line(layout.added_by)}: the operator could not create the job's pods"
            )


def _check_storage(kube: KubeApi, checked: Checked) -> None:
    pvcs = [o for o in checked.objects if o["kind"] == "PersistentVolumeClaim"]
    if not pvcs:
        return
    wanted = pvcs[0]["spec"].get("storageClassName")
    try:
        classes = kube.list("storage.k8s.io/v1", "StorageClass")
    except Forbidden:
        checked.warnings.append("cannot list storage classes (forbidden): storageClass not checked")
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
        checked.warnings.append(
            "the cluster has no default StorageClass: the checkpoint PVC stays Pending until "
            "a volume is bound (set checkpoint.storageClass)"
        )


def _namespace_obj(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _refuse_existing(checked: Checked, replace: bool, in_place: bool = False) -> None:
    if in_place and checked.existing_job is None:
        spec = checked.spec
        raise OperationError(
            f"{layout_of(spec.target).kind} {spec.namespace}/{spec.name} no longer exists "
            "(deleted meanwhile?); nothing was changed"
        )
    if checked.existing_job is not None and not (replace or in_place):
        spec = checked.spec
        state = "Terminating" if _terminating(checked.existing_job) else None
        state = state or job_state(checked.existing_job, []).state
        raise OperationError(
            f"{checked.existing_job['kind']} {spec.name} already exists in namespace "
            f"{spec.namespace} ({state}); "
            "pass --replace to delete and recreate it, or choose another --name"
        )


# --- dry run and apply -----------------------------------------------------------------


def dry_run(kube: KubeApi, checked: Checked, replace: bool, say: Say) -> None:
    """The server validates every object (admission included); nothing is stored."""
    _refuse_existing(checked, replace)
    if checked.create_namespace:
        kube.create(_namespace_obj(checked.spec.namespace), dry_run=True)
        say(f"would create Namespace {checked.spec.namespace}")
        say("objects not checked by the server: their namespace does not exist yet")
        return
    for obj in checked.objects:
        kube.apply(obj, dry_run=True)
    for obj in checked.objects:
        job_kind = layout_of(checked.spec.target).kind
        verb = "replace" if obj["kind"] == job_kind and checked.existing_job else "apply"
        say(f"would {verb} {_ref(obj)} (server dry run passed)")


class _Run:
    """What one apply has done so far: for the take-back and the final line."""

    def __init__(self, kube: KubeApi, checked: Checked) -> None:
        self.kube, self.checked = kube, checked
        self.created: list[Obj] = []  # by this run (a create that succeeded), in order
        self.created_ns = False
        self.job_created = False
        self.job_applied = False  # an in-place change of the existing job went through
        self.kept: list[Obj] = []  # created meanwhile by a concurrent `up` of this job
        self.removed: list[str] = []  # what the take-back deleted ("Kind ns/name")

    def take_back(self) -> str:
        """Delete what this run created, newest first; a summary of what went and what
        could not (signals held: a second Ctrl-C must not stop the cleanup half-way)."""
        removed, kept = [], []
        with held_signals():
            items = [(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in self.created]
            if self.created_ns:
                items.append(("v1", "Namespace", self.checked.spec.namespace))
            for api, kind, name in reversed(items):
                ns = None if kind == "Namespace" else self.checked.spec.namespace
                ref = f"{kind} {ns}/{name}" if ns else f"{kind} {name}"
                try:
                    if self.kube.delete(api, kind, name, ns):
                        removed.append(ref)
                        self.removed.append(ref)
                except OperationError as exc:
                    kept.append(f"{ref} ({str(exc)[:160]})")
        if not removed and not kept:
            return "nothing was changed"
        text = f"took back what it had created: deleted {', '.join(removed) or 'nothing'}"
        return text + (f"; could NOT delete {', '.join(kept)}" if kept else "")


def apply(
    kube: KubeApi,
    checked: Checked,
    replace: bool,
    say: Say,
    *,
    in_place: bool = False,
    delete_timeout: float = DELETE_TIMEOUT,
) -> list[Obj]:
    """Create (or, when ours already, apply) the PVC and companions, then the job; a
    replace deletes the old job and creates the new one with signals held off, waiting at
    most ``delete_timeout`` seconds for the old one to go (an old job being deleted already
    is waited for first, before anything changes); ``in_place`` (`scale`) server-side
    applies the existing job, as the same field manager, so that only what the spec
    changed changes. Returns the objects this run created."""
    spec = checked.spec
    layout = layout_of(spec.target)
    _refuse_existing(checked, replace, in_place)
    if checked.existing_job is not None and _terminating(checked.existing_job) and not in_place:
        # Being deleted already (a finalizer holds it): wait for it before changing anything,
        # so that a wait that ends in a timeout or a Ctrl-C has changed nothing.
        try:
            _wait_deleted(kube, checked.existing_job, delete_timeout, say, "nothing was changed")
        except KeyboardInterrupt as exc:
            ref = _ref(checked.existing_job)
            raise interrupted(
                exc, f"stopped waiting for {ref} to go; nothing was changed"
            ) from None
        checked.existing_job = None  # gone: the new job is a plain create
    run = _Run(kube, checked)
    job = next(o for o in checked.objects if o["kind"] == layout.kind)
    ref = _ref(job)
    try:
        if checked.create_namespace:
            kube.create(_namespace_obj(spec.namespace))
            run.created_ns = True
            say(f"created Namespace {spec.namespace}")
        for obj in checked.objects:
            kube.apply(obj, dry_run=True)
        for obj in checked.objects:  # rendered with the PVC first, the job last
            if obj is not job:
                _put(kube, checked, run, obj, say)
        if checked.existing_job is not None and in_place:
            with held_signals():  # one apply: done, or an error
                kube.apply(job)
            run.job_applied = True
            say(f"applied {ref}")
        elif checked.existing_job is not None:
            _replace(kube, checked, run, job, layout, say, delete_timeout)
        else:
            try:
                _create(kube, run, job)
            except Conflict:
                # Another `up` of this name created it since our read: it won, and the
                # objects beside it are its own now, so nothing is taken back (not even
                # what this run created beside it first: the winner applies those).
                run.created = []
                raise OperationError(
                    f"{ref} was just created by someone else (another `up` at the same "
                    "moment?); this run changed nothing of it and kept the objects beside it"
                ) from None
            run.job_created = True
            say(f"created {ref}")
            for obj in run.kept:  # we won: what the other `up` made beside it is ours to set
                kube.apply(obj)
                say(f"applied {_ref(obj)}")
        _check_still_there(kube, checked)
        created = list(run.created)
    except _ReplaceLost:
        raise
    except KeyboardInterrupt as exc:
        if run.job_applied or (run.job_created and checked.existing_job is not None):
            raise interrupted(exc, _complete(ref, run, checked)) from None
        old = "; the old job is untouched" if checked.existing_job is not None else ""
        back = run.take_back()
        # The job may have been made (a create that went through, the interrupt during its
        # answer): then it was created and deleted again, not "not created".
        made = "was created" if run.job_created or ref in run.removed else "was not created"
        raise interrupted(exc, f"{ref} {made}; {back}{old}") from None
    except OperationError as exc:
        if run.job_created and checked.existing_job is not None:
            run.created = [job]  # the replace happened: only the new job can go
            run.created_ns = False
        raise OperationError(f"{exc}; {run.take_back()}", exc.exit_code) from None
    except BaseException:
        # E.g. stderr is full: nothing may stay behind unreported; but a replace that
        # happened stays (taking the new job back would leave less than there was).
        if not (run.job_created and checked.existing_job is not None):
            run.take_back()
        raise
    try:
        with held_signals():  # one request; the job is there either way
            _save_on_adopted_claim(kube, checked, say)
    except KeyboardInterrupt as exc:  # held off until the save was done
        raise interrupted(exc, _complete(ref, run, checked)) from None
    return created


def _complete(ref: str, run: _Run, checked: Checked) -> str:
    """What an interrupt after the job's change went through says was done."""
    if run.job_applied:
        done = "was changed"
    elif checked.existing_job is not None:
        done = "was replaced"
    else:
        done = "was submitted"
    return f"{ref} {done} (the change is complete)"


# --- a claim the job mounts that ddpdeploy did not make ----------------------------------


def _adopted_with_spec(kube: KubeApi, name: str, namespace: str) -> Obj | None:
    """The adopted claim when it carries a saved spec of job ``name`` (`down` names it,
    and with --purge takes that spec off); a spec there that does not read is not ours to
    touch."""
    claim = adopted_claim(kube, name, namespace)
    if claim is None or not ((claim["metadata"].get("annotations") or {}).get(SPEC_ANNOTATION)):
        return None
    try:
        spec = saved_spec(claim)
    except UserError:
        return None
    return claim if spec is not None and spec.name == name else None


def adopted_claim(kube: KubeApi, name: str, namespace: str) -> Obj | None:
    """The claim named as job ``name``'s own (<name>-checkpoints) when ddpdeploy did not
    make it (no labels of ours): one adopted with --adopt-pvc, or named so as
    checkpoint.claimName. Never relabelled or deleted; it carries the job's saved spec and
    run record as annotations of ours, so that `resume` finds them after `down`."""
    claim = kube.get("v1", "PersistentVolumeClaim", f"{name}-checkpoints", namespace)
    if claim is None or labelled_ours(claim):
        return None
    return claim


def _save_on_adopted_claim(kube: KubeApi, checked: Checked, say: Say) -> None:
    """The spec (and run record) as annotations of ours on the adopted claim the job mounts,
    through a server-side apply that holds those annotations only (the claim's labels, spec
    and other annotations stay as they are); a refusal is a warning: the job is there."""
    spec = checked.spec
    ckpt = spec.checkpoint
    if ckpt is None or ckpt.claim_name != f"{spec.name}-checkpoints":
        return
    claim = adopted_claim(kube, spec.name, spec.namespace)
    if claim is None:
        return
    bare: Obj = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": ckpt.claim_name, "namespace": spec.namespace},
    }
    (noted,) = with_saved_spec([bare], spec, checked.record)
    try:
        kube.apply(noted)
    except OperationError as exc:
        say(
            f"warning: could not save the spec on {_ref(claim)} ({exc}); `ddpdeploy resume` "
            "after `down` will not find it"
        )
        return
    say(
        f"saved the spec on {_ref(claim)} (annotations of ddpdeploy's; the claim is not "
        "ours and is otherwise untouched), for `ddpdeploy resume` after `down`"
    )


def _forget_on_adopted_claim(kube: KubeApi, claim: Obj) -> None:
    """Our annotations off the adopted claim (`down --purge`): an apply that holds none of
    them removes those this field manager set, and nothing else."""
    meta = claim["metadata"]
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        }
    )


def _put(kube: KubeApi, checked: Checked, run: _Run, obj: Obj, say: Say) -> None:
    """Create ``obj`` create-only, or apply it when an object of ours is there already."""
    key = (obj["kind"], obj["metadata"]["name"])
    if key not in checked.existing:
        try:
            _create(kube, run, obj)
            say(f"created {_ref(obj)}")
            return
        except Conflict:
            meta = obj["metadata"]
            got = kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])
            if got is None:
                raise
            # Made since preflight, by another `up` of this job right now: left as it made
            # it; whichever of us creates the job applies it afterwards (its saved spec).
            require_ours(got, checked.spec.name, "changed")
            run.kept.append(obj)
            return
    kube.apply(obj)
    say(f"applied {_ref(obj)}")


def _create(kube: KubeApi, run: _Run, obj: Obj) -> None:
    """Create-only: a 409 Conflict if it exists, so the API decides who made it first."""
    run.created.append(obj)  # taken back on any failure, even one after the create
    try:
        kube.create_as_applier(obj)
    except Conflict:
        run.created.pop()
        raise


class _ReplaceLost(OperationError):
    """The old job is gone and the new one could not be created."""


def _replace(
    kube: KubeApi, checked: Checked, run: _Run, job: Obj, layout: Layout, say: Say, timeout: float
) -> None:
    spec, ref = checked.spec, _ref(job)
    with held_signals():  # from here the new job is created even if interrupted
        delete_job_and_wait(kube, spec.name, spec.namespace, layout, timeout, say)
        try:
            kube.create_as_applier(job)
        except OperationError as exc:
            if _exists(kube, job):  # created; only recording it as applied failed
                run.created.append(job)
                run.job_created = True
                raise OperationError(f"replaced {ref}, but then: {exc}") from None
            raise _ReplaceLost(
                f"deleted the old {ref}, then creating the new one failed ({exc}); no job "
                f"{spec.name} exists now (its PVC and companions are kept); run `ddpdeploy "
                f"resume {spec.name} -n {spec.namespace}` or `up --replace` again"
            ) from None
        run.created.append(job)
        run.job_created = True
    say(f"replaced {ref} (deleted the old one, created the new one)")


def _exists(kube: KubeApi, obj: Obj) -> bool:
    meta = obj["metadata"]
    try:
        return kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"]) is not None
    except OperationError:
        return False


def _check_still_there(kube: KubeApi, checked: Checked) -> None:
    """A PVC deleted while we applied (`down --purge` at the same moment) leaves the job
    bound to a dying claim: refuse that rather than report success."""
    for obj in checked.objects:
        if obj["kind"] != "PersistentVolumeClaim":
            continue
        meta = obj["metadata"]
        got = kube.get("v1", "PersistentVolumeClaim", meta["name"], meta["namespace"])
        if got is None or _terminating(got):
            raise OperationError(
                f"{_ref(obj)} was deleted while `up` ran (a `down --purge` at the same "
                "moment?); the job cannot keep its checkpoints"
            )


_POLL = 0.5


def delete_job_and_wait(
    kube: KubeApi,
    name: str,
    namespace: str,
    layout: Layout,
    timeout: float = DELETE_TIMEOUT,
    say: Say | None = None,
) -> None:
    api, kind = layout.api_version, layout.kind
    kube.delete(api, kind, name, namespace)
    got = kube.get(api, kind, name, namespace)
    if got is not None:
        what = "the new one is created once it is gone, even after Ctrl-C"
        _wait_deleted(kube, got, timeout, say, "the new job was not created", what)


def _wait_deleted(
    kube: KubeApi, obj: Obj, timeout: float, say: Say | None, left: str, meanwhile: str = ""
) -> None:
    """Wait until ``obj`` (being deleted) is gone, at most ``timeout`` seconds, saying once
    what it waits for (the finalizers that hold it); ``left``: what a timeout leaves, for
    its line."""
    meta = obj["metadata"]
    api, kind, name, ns = obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")
    deadline = time.monotonic() + timeout

    def holding(got: Obj) -> str:
        m = got.get("metadata") or {}
        since = f"Terminating since {m['deletionTimestamp']}" if m.get("deletionTimestamp") else ""
        finalizers = ", ".join(str(f) for f in m.get("finalizers") or [])
        held = f"finalizers: {finalizers}" if finalizers else ""
        return "; ".join(p for p in (since, held) if p) or "being deleted"

    if say is not None:
        also = f"; {meanwhile}" if meanwhile else ""
        say(
            f"waiting for {_ref(obj)} to be deleted ({holding(obj)}), at most "
            f"{duration(timeout)} (--timeout){also}"
        )
    got: Obj | None = obj
    while got is not None:
        if time.monotonic() >= deadline:
            raise OperationError(
                f"{kind} {ns}/{name} is still being deleted after {duration(timeout)} "
                f"({holding(got)}: whoever set them must remove them, or wait longer with "
                f"--timeout); {left}; run `ddpdeploy up --replace` again once it is gone "
                f"(kubectl get {kind.lower()} -n {ns} {name})"
            )
        time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))
        got = kube.get(api, kind, name, ns)
        if got is not None and (got.get("metadata") or {}).get("uid") != meta.get("uid"):
            # Gone, and another object of the name made meanwhile: not the one waited for,
            # so no wait or finalizer advice applies to it.
            why = not_ours(got, name)
            whose = f"not ours: {why}" if why else "ours: another `up` at the same moment?"
            raise OperationError(
                f"{kind} {ns}/{name} was deleted, but a new {kind} {name} was created "
                f"meanwhile ({whose}); {left}"
            )


# --- the saved spec --------------------------------------------------------------------


def carried_record(obj: Obj, spec: JobSpec, say: Say) -> RunRecord | None:
    """The run record saved on ``obj`` (ours: found with a verb), for ``spec`` re-rendered
    from it to keep (`scale`, `resume`); what is malformed in it is dropped, in one warning."""
    record, warning = saved_record(obj, spec.image)
    if warning is not None:
        say(f"warning: {warning}")
    return record


def resumable(found: Found, say: Say) -> tuple[JobSpec, RunRecord | None]:
    """The spec to resume and the run record saved with it: the job (found with verb
    "resumed") must have ended, or be gone."""
    job = found.job
    if job is not None:
        state = job_state(job, [])
        if not state.done:
            raise OperationError(
                f"{job['kind']} {found.namespace}/{found.name} is {state.state}; nothing to "
                "resume (`ddpdeploy down` it first to restart it)"
            )
    spec, source = _saved(found)
    # The saved spec is plain text on the cluster, editable by whoever may edit the
    # object: say what is resubmitted, so that an edit shows before the job runs.
    gpus = f", {spec.gpus} GPU(s) each" if spec.gpus else ""
    say(
        f"resubmitting from the spec saved on {_ref(source)}: image {spec.image}, "
        f"{spec.nodes} node(s) x {spec.procs_per_node} process(es){gpus}"
    )
    return spec, carried_record(source, spec, say)


def saved_spec_of(found: Found) -> JobSpec:
    """The spec `up` last submitted: from the job (found with a verb, so ours), else from
    its checkpoint PVC (which outlives `down`); either must name this job in this
    namespace."""
    return _saved(found)[0]


def _saved(found: Found) -> tuple[JobSpec, Obj]:
    """``saved_spec_of`` and the object it was saved on."""
    name, namespace = found.name, found.namespace
    spec = saved_spec(found.job) if found.job is not None else None
    if spec is not None and found.job is not None:
        return spec, found.job
    claims = found.kube.list("v1", "PersistentVolumeClaim", namespace, labels=ours_selector(name))
    adopted = adopted_claim(found.kube, name, namespace)
    for claim in [*claims, *([adopted] if adopted is not None else [])]:
        spec = saved_spec(claim)  # strict: it must name this job, namespace and claim
        if spec is not None and spec.name == name:
            return spec, claim
    if missing := no_namespace(found.kube, namespace):
        raise OperationError(f"no saved spec for {name} in namespace {namespace}{missing}")
    raise OperationError(
        f"no saved spec for {name} in namespace {namespace}: neither a job nor a "
        "checkpoint PVC that `ddpdeploy up` made is there; run `ddpdeploy up` again"
    )


# --- delete ----------------------------------------------------------------------------


def delete(found: Found, purge: bool, say: Say) -> None:
    """`down`: the job (its pods and Services go with it), the objects we made beside it
    that deleting it does not delete, and with ``purge`` the checkpoint PVC. Everything is
    checked to be ours before anything is deleted (``found`` was found with a verb); an
    object beside the job that is not ours is kept and named, not a reason to refuse."""
    kube, name, ns, layout, job = found.kube, found.name, found.namespace, found.layout, found.job
    done: list[str] = []
    try:
        beside = [*layout.companions(name), (*NETWORK_POLICY, name)]
        gone_with_job, foreign = [], []
        for api, kind, other in beside:
            got = kube.get(api, kind, other, ns)
            if got is None:
                continue
            why = not_ours(got, name)
            if why is None:
                gone_with_job.append((api, kind, other))  # also one an interrupted `up` left
            else:
                # Someone else's object of the job's name (e.g. after `up
                # --no-network-policy`): kept, and no reason to keep our job running.
                foreign.append(f"kept {_ref(got)}: not ours ({why})")
        claims = []
        for claim in kube.list("v1", "PersistentVolumeClaim", ns, labels=ours_selector(name)):
            # Our labels are copied easily: a claim without our saved spec is not this
            # job's checkpoints, and neither deleted nor called so.
            why = not_ours(claim, name)
            if why is None:
                claims.append(claim)
            else:
                foreign.append(f"kept {_ref(claim)}: not ours ({why})")
        adopted = _adopted_with_spec(kube, name, ns)
        if job is None and not gone_with_job and not (purge and claims) and adopted is None:
            raise OperationError(no_job(name, ns) + (no_namespace(kube, ns) or "; nothing deleted"))
        if job is not None and kube.delete(layout.api_version, layout.kind, name, ns):
            # Read again only for a job that had finalizers: a delete costs the same request
            # count at any size and in the common case (tests/kube/test_scale.py).
            held = bool(job["metadata"].get("finalizers"))
            got = kube.get(layout.api_version, layout.kind, name, ns) if held else None
            uid = job["metadata"].get("uid")
            same = got is not None and got["metadata"].get("uid") == uid
            if same and (holds := held_by(got or {})):
                # Not gone, and it will not go by itself: its pods run on meanwhile.
                done.append(f"asked to delete {layout.kind} {ns}/{name}")
                say(f"{layout.kind} {ns}/{name} is being deleted but {holds}")
            else:
                done.append(f"deleted {layout.kind} {ns}/{name}")
                say(done[-1])
        for api, kind, other in gone_with_job:
            if kube.delete(api, kind, other, ns):
                done.append(f"deleted {kind} {ns}/{other}")
                say(done[-1])
        for line in foreign:
            say(line)
        for claim in claims:
            pvc = claim["metadata"]["name"]
            if purge:
                kube.delete("v1", "PersistentVolumeClaim", pvc, ns)
                done.append(f"deleted PersistentVolumeClaim {ns}/{pvc}")
                say(done[-1])
            else:
                say(
                    f"kept PersistentVolumeClaim {ns}/{pvc} (checkpoints; `ddpdeploy resume "
                    f"{name}` restarts from them, --purge deletes them)"
                )
        if adopted is not None and purge:
            _forget_on_adopted_claim(kube, adopted)
            done.append(f"removed the saved spec from {_ref(adopted)}")
            say(f"kept {_ref(adopted)} (adopted: never deleted); removed ddpdeploy's saved spec")
        elif adopted is not None:
            say(
                f"kept {_ref(adopted)} (adopted: never deleted; `ddpdeploy resume {name}` "
                "restarts from it, its saved spec; --purge removes that)"
            )
    except KeyboardInterrupt as exc:
        what = "; ".join(done) if done else "nothing was deleted"
        raise interrupted(exc, f"{what}; run `ddpdeploy down {name} -n {ns}` again") from None
