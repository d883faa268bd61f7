"""Reading a job's checkpoint volume on the cluster, for `collect --from cluster`.

From a running pod of the job when there is one (the volume is mounted there), else from a
short-lived helper pod (`collect_helper_pod`, below) that mounts the claim
read-only and is deleted afterwards, on failure and Ctrl-C too. Entries are listed and files
read by small POSIX `sh` programs through the exec API; the reader refuses anything but a
regular file, and checksums are checked by ddpdeploy.collect like for any other source.
"""

from __future__ import annotations

import contextlib
import posixpath
import secrets
import string
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

from ddpdeploy import fs
from ddpdeploy.adapters.kube import Forbidden, KubeApi
from ddpdeploy.cluster.capacity import fitted_resources, limit_range_breaches
from ddpdeploy.cluster.find import made_for
from ddpdeploy.cluster.labels import selector
from ddpdeploy.collect.source import FILE, FOLDER, SPECIAL, SYMLINK, Unreadable, plain_name, shown
from ddpdeploy.errors import OperationError, UserError
from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import (
    CHECKPOINT_VOLUME,
    checkpoint_claim_name,
    container_security,
    metadata,
    placement,
    pod_security,
    require_image,
)
from ddpdeploy.signals import interrupted
from ddpdeploy.spec import ISTIO_INJECT_ANNOTATION, OWN_DOMAIN, JobSpec
from ddpdeploy.targets import layout_of
from ddpdeploy.text import clip, plain

# `sh -c` programs, POSIX only (busybox runs them too). The listing tests each entry without
# following symlinks; NUL-separated, so any name survives.
LIST = r"""cd -- "$1" || exit 3
for f in * .[!.]* ..?*; do
  if [ -L "$f" ]; then k=l; elif [ -f "$f" ]; then k=f; elif [ -d "$f" ]; then k=d
  elif [ -e "$f" ]; then k=o; else continue; fi
  printf '%s %s\000' "$k" "$f"
done"""
# The reader refuses anything but a regular file. GNU dd opens with O_NOFOLLOW (and
# O_NONBLOCK: a FIFO cannot hang it), so a symlink swapped in after the test is refused at
# open time too; an image without that dd (busybox) gets the test just before `cat`. A second
# argument N sends at most N MiB (collect --debug's bound), so a huge file never crosses.
READ = r"""f=$1
no() { echo "ddpdeploy-refused: $1" >&2; exit 3; }
[ -L "$f" ] && no "a symlink, not a regular file"
[ -e "$f" ] || no "vanished (no such file)"
[ -f "$f" ] || no "not a regular file"
if dd if=/dev/null of=/dev/null iflag=nofollow status=none 2>/dev/null; then
  dd if="$f" iflag=nofollow,nonblock bs=1048576 ${2:+count=$2} status=none ||
    no "not readable as a regular file"
elif [ -n "$2" ]; then
  dd if="$f" bs=1048576 count="$2" 2>/dev/null || no "not readable"
else
  cat -- "$f" || no "not readable"
fi"""
_REFUSED = "ddpdeploy-refused: "
Note = Callable[[str], None]  # one line on stderr, as the wait goes on
_KINDS = {"f": FILE, "l": SYMLINK, "d": FOLDER, "o": SPECIAL}


COLLECT_CONTAINER = "reader"
COLLECT_ROLE = "collect"  # the helper's {OWN_DOMAIN}/role label: how it is found again

# A pod name is a DNS-1123 label here (63 characters): the job's name, cut if need be, then
# `-collect-` and a random suffix, so two collects at once, or one just after another whose
# helper is still Terminating, never ask for the same name.
_SUFFIX = 5
_LABEL_MAX = 63


def helper_pod_name(job: str) -> str:
    """A fresh name for one collect's helper pod: ``JOB-collect-xxxxx``."""
    tail = "-collect-" + "".join(
        secrets.choice(string.ascii_lowercase + string.digits) for _ in range(_SUFFIX)
    )
    return job[: _LABEL_MAX - len(tail)] + tail


def collect_helper_pod(spec: JobSpec, image: str | None = None) -> Obj:
    """The short-lived pod `collect --from cluster` reads the checkpoint volume through: it
    mounts the job's claim read-only and idles until deleted. Hardened like the job's pods
    (same securityContext, no service account token, no service links, resources) with a
    read-only root always, as it writes nothing; the job's image unless ``image`` is given
    (it needs `sh`, `cat` and `sleep`)."""
    claim = checkpoint_claim_name(spec)
    if spec.checkpoint is None or claim is None:
        raise UserError(f"job {spec.name} has no checkpoint volume (checkpoint: in the spec)")
    security = {**container_security(spec), "readOnlyRootFilesystem": True}
    security["capabilities"] = {"drop": ["ALL"]}  # no IPC_LOCK: it does no RDMA
    pod: Obj = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": 3600,  # a safety net should the delete never come
        "terminationGracePeriodSeconds": 1,  # `sleep` as PID 1 ignores SIGTERM
        "securityContext": pod_security(spec),
        "containers": [
            {
                "name": COLLECT_CONTAINER,
                "image": image or require_image(spec),
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"memory": "256Mi"},
                },
                "securityContext": security,
                "volumeMounts": [
                    {
                        "name": CHECKPOINT_VOLUME,
                        "mountPath": spec.checkpoint.mount_path,
                        "readOnly": True,
                    }
                ],
            }
        ],
        "volumes": [
            {
                "name": CHECKPOINT_VOLUME,
                "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
            }
        ],
    }
    # Where the job's pods may run (and the claim can attach), the reader may too.
    pod |= placement(spec)
    meta = metadata(spec, helper_pod_name(spec.name))
    meta["labels"][f"{OWN_DOMAIN}/role"] = COLLECT_ROLE
    meta["annotations"] = {**meta.get("annotations", {}), ISTIO_INJECT_ANNOTATION: "false"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod}


def _refusals_as_unreadable(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The pod's chunks, with the reader's refusal (a non-regular file) as Unreadable."""
    try:
        yield from chunks
    except OperationError as exc:
        text = str(exc)
        if _REFUSED not in text:
            raise
        raise Unreadable(text.split(_REFUSED, 1)[1].splitlines()[0][:100]) from None


class ContainerGone(OperationError):
    """An exec into the job's pod failed: its container ended under us (a run ending as
    collect read). collect leaves --to as it was on any failure, so the helper pod can read
    the volume instead."""


class PodSource:
    """The checkpoint folder as seen from inside one pod (``job_pod``: one of the job's,
    whose container may end under us, rather than the helper pod)."""

    def __init__(
        self,
        kube: KubeApi,
        pod: str,
        namespace: str,
        container: str,
        folder: str,
        job_pod: bool = False,
    ):
        self.kube, self.pod, self.namespace, self.container = kube, pod, namespace, container
        self.folder, self.job_pod = folder, job_pod
        self.where = f"pod {pod}:{folder}"

    def entries(self) -> dict[str, str]:
        out = b"".join(self.run(LIST, self.folder))
        entries: dict[str, str] = {}
        for record in out.split(b"\0"):
            kind, _, name = record.decode(errors="surrogateescape").partition(" ")
            if kind in _KINDS and plain_name(name):
                entries[name] = _KINDS[kind]
        return entries

    def open(
        self, name: str, limit: int | None = None
    ) -> contextlib.AbstractContextManager[BinaryIO]:
        if not plain_name(name):
            raise Unreadable(f"{shown(name)} is not a plain file name")
        path = posixpath.join(self.folder, name)
        mib = [] if limit is None else [str(-(-limit // (1 << 20)))]  # whole MiB, rounded up
        return fs.chunk_reader(_refusals_as_unreadable(self.run(READ, path, *mib)))

    def run(self, program: str, *args: str) -> Iterator[bytes]:
        argv = ["sh", "-c", program, "sh", *args]
        chunks = self.kube.exec_stream(self.pod, self.namespace, self.container, argv)
        return self._gone_if_ended(chunks) if self.job_pod else chunks

    def _gone_if_ended(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """A failed exec in the job's pod is its container ending under us (exit 126 as it
        stops, 137 when it is killed, 'container not running'): ContainerGone."""
        try:
            yield from chunks
        except OperationError as exc:
            if _REFUSED in str(exc):  # the program's own refusal: a file it cannot read
                raise
            raise ContainerGone(str(exc)) from None


def _running_pod(kube: KubeApi, spec: JobSpec) -> str | None:
    """A pod of the job (``made_for``: a look-alike with our labels, whose name may sort
    first, is never exec'd into) whose training container runs now: exec needs the
    container, not just a Running pod (one between two restarts of its container answers
    'container not running'), and a pod being deleted is about to lose it."""
    layout = layout_of(spec.target)
    job = kube.get(layout.api_version, layout.kind, spec.name, spec.namespace)
    if job is None:
        return None
    pods = kube.list("v1", "Pod", spec.namespace, labels=selector(layout.pod_selector(spec.name)))
    pods = [p for p in pods if made_for(p, job)]

    def runs(pod: Obj) -> bool:
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return False
        return any(
            c.get("name") == layout.container and (c.get("state") or {}).get("running") is not None
            for c in status.get("containerStatuses") or []
        )

    return min((p["metadata"]["name"] for p in pods if runs(p)), default=None)


@contextlib.contextmanager
def pod_source(
    kube: KubeApi,
    spec: JobSpec,
    timeout: float,
    image: str | None = None,
    job_pods: bool = True,
    note: Note | None = None,
) -> Iterator[PodSource]:
    """A source reading the job's checkpoint folder from a running pod of the job (unless
    not ``job_pods``) or a helper pod (run with ``image``, default the job's own)."""
    if spec.checkpoint is None:
        raise OperationError(f"job {spec.name} has no checkpoint volume (checkpoint: in the spec)")
    folder = spec.checkpoint.mount_path
    pod = _running_pod(kube, spec) if job_pods else None
    if pod is not None:
        container = layout_of(spec.target).container  # the training container
        try:
            yield PodSource(kube, pod, spec.namespace, container, folder, job_pod=True)
        except KeyboardInterrupt as exc:
            # Read through the job's own pod: nothing was made on the cluster to undo, and
            # checkpoint.collect has already put --to back as it was.
            raise interrupted(
                exc, f"it was reading the job's pod {pod}, nothing was made; --to is as it was"
            ) from None
        return
    if not (image or spec.image):
        raise UserError(
            f"--image: job {spec.name}'s saved spec names no image to read its volume with; "
            "pass --image IMAGE (any image with sh, cat and sleep)"
        )
    body = _fitted(kube, spec, collect_helper_pod(spec, image))
    name = body["metadata"]["name"]
    try:
        kube.create(body)
        _wait_running(kube, spec, name, timeout, note)
        yield PodSource(kube, name, spec.namespace, COLLECT_CONTAINER, folder)
    except KeyboardInterrupt as exc:
        # A helper pod was (maybe) made: say what became of it, not "nothing was done".
        # checkpoint.collect has already put --to back as it was.
        gone = _delete_helper(kube, name, spec.namespace)
        raise interrupted(exc, f"{gone}; --to is as it was") from None
    except BaseException:
        kube.delete("v1", "Pod", name, spec.namespace)
        raise
    kube.delete("v1", "Pod", name, spec.namespace)


def _fitted(kube: KubeApi, spec: JobSpec, body: Obj) -> Obj:
    """The helper pod with its small resources moved inside the namespace's LimitRanges
    (a min memory above its 64Mi request, a max below its limit, a limit/request ratio), so
    that the API server takes it; one line naming a LimitRange no resources can keep."""
    try:
        ranges = kube.list("v1", "LimitRange", spec.namespace)
    except Forbidden:
        return body  # the API server's refusal, if one comes, names the bound
    (container,) = body["spec"]["containers"]
    container["resources"] = fitted_resources(ranges, container["resources"])
    for breach in limit_range_breaches(ranges, body["spec"]):
        got = "none" if breach.got is None else breach.amount(breach.got)
        raise OperationError(
            f"LimitRange {spec.namespace}/{breach.limit_range} bounds {breach.resource} per "
            f"{breach.type.lower()} ({breach.bound} {breach.amount(breach.allowed)}), which "
            f"collect's helper pod that reads the checkpoint volume breaks even fitted to the "
            f"namespace's bounds ({breach.resource} {breach.what} {got}); the namespace's "
            "admin can change the LimitRange, or collect while a pod of the job runs (it "
            "reads through that pod)"
        )
    return body


def _delete_helper(kube: KubeApi, name: str, namespace: str) -> str:
    """Delete the helper pod after an interrupt; what became of it, for the one line."""
    try:
        existed = kube.delete("v1", "Pod", name, namespace)
    except OperationError as exc:
        return (
            f"the helper pod {name} could not be deleted ({exc}); "
            f"delete it: kubectl delete pod {name} -n {namespace}"
        )
    # Not there: the interrupt came before the create reached the API server.
    return f"the helper pod {name} was deleted" if existed else "no helper pod was created"


# A container waiting for one of these reasons will not start without a change (another
# image, a fixed registry or pull secret): waiting the whole --timeout for it only hides why.
# CreateContainerError and CreateContainerConfigError are not among them: the kubelet
# retries those (a runtime's passing failure, a ConfigMap or Secret that appears), so the
# wait goes on to --timeout, saying the reason once and at its end.
_HOPELESS = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
)
_RETRIED = ("CreateContainerConfigError", "CreateContainerError")


def _waiting(pod: Obj, reasons: tuple[str, ...] | None = None) -> str | None:
    """The helper container's waiting reason and message (only ``reasons``, if given)."""
    for box in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (box.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason and reason != "ContainerCreating" and (reasons is None or reason in reasons):
            message = plain(waiting.get("message") or "").strip()
            return f"{plain(reason)}: {clip(message, 300)}" if message else plain(reason)
    return None


def _hopeless(pod: Obj) -> str | None:
    """Why the helper's container can never start (its waiting reason and message), or None."""
    why = _waiting(pod, _HOPELESS)
    if why is not None:
        return why
    for box in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = (box.get("state") or {}).get("terminated") or {}
        if ended:  # restartPolicy Never: an ended container stays ended (no sleep in it...)
            why = ended.get("reason") or f"exit code {ended.get('exitCode')}"
            message = plain(ended.get("message") or "").strip()
            return f"it ended ({why}{': ' + clip(message, 300) if message else ''})"
    return None


def _unscheduled(pod: Obj) -> str | None:
    """The scheduler's reason the helper pod is not placed (PodScheduled False), or None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            message = plain(cond.get("message") or "").strip().rstrip(".")  # no ".;"
            reason = plain(cond.get("reason") or "not scheduled")
            return f"{reason}: {clip(message, 300)}" if message else reason
    return None


def _wait_running(
    kube: KubeApi, spec: JobSpec, name: str, timeout: float, note: Note | None = None
) -> None:
    namespace = spec.namespace
    deadline = time.monotonic() + timeout
    phase, pod = "Pending", {}
    told: str | None = None
    while time.monotonic() < deadline:
        pod = kube.get("v1", "Pod", name, namespace) or {}
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase == "Running":
            return
        why = _hopeless(pod)
        if why is not None:
            boxes: list[Obj] = (pod.get("spec") or {}).get("containers") or [{}]
            image = boxes[0].get("image")
            raise OperationError(
                f"the helper pod {name} that reads the checkpoint volume cannot start its "
                f"container: {why} (image {image}; --image names another, any image with sh, "
                "cat and sleep); it has been deleted"
            )
        retried = _waiting(pod, _RETRIED)
        if retried is not None and note is not None and retried != told:
            told = retried
            note(
                f"the helper pod {name} cannot create its container yet ({retried}); the "
                f"kubelet retries it: waiting up to --timeout {timeout:g}s"
            )
        if phase in ("Failed", "Succeeded"):
            break
        time.sleep(1)
    why = _waiting(pod) or _unscheduled(pod)
    if why is not None:
        raise OperationError(
            f"the helper pod {name} that reads the checkpoint volume is {phase} after "
            f"{timeout:g}s: {why}; it has been deleted"
        )
    raise OperationError(
        f"the helper pod {name} that reads the checkpoint volume is {phase} after "
        f"{timeout:g}s: {_not_started(kube, spec, pod)}; it has been deleted"
    )


def _not_started(kube: KubeApi, spec: JobSpec, pod: Obj) -> str:
    """What is known of a helper that neither started nor said why by --timeout: where it
    got to, and a job's pod on another node only when there is one (a ReadWriteOnce volume
    attaches to one node at a time), never a guess."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return "no node was chosen for it yet; give it longer with --timeout"
    started = f"placed on {plain(node)}, its container had not started"
    holders: list[str] = []
    mode = "ReadWriteMany"
    with contextlib.suppress(OperationError):  # an unread claim or pods: nothing more known
        # The claim's own modes: an adopted claim's are not the spec's.
        claim = kube.get(
            "v1", "PersistentVolumeClaim", checkpoint_claim_name(spec) or "", spec.namespace
        )
        modes = ((claim or {}).get("spec") or {}).get("accessModes") or []
        mode = "ReadWriteMany" if not modes or "ReadWriteMany" in modes else str(modes[0])
    if mode != "ReadWriteMany":
        layout = layout_of(spec.target)
        with contextlib.suppress(OperationError):
            pods = kube.list(
                "v1", "Pod", spec.namespace, labels=selector(layout.pod_selector(spec.name))
            )
            holders = sorted(
                f"{plain(p['metadata']['name'])} (on {plain(p['spec']['nodeName'])})"
                for p in pods
                if (p.get("spec") or {}).get("nodeName") not in (None, node)
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            )
    if holders:
        return (
            f"{started}; the job's pods {', '.join(holders[:3])} run on another node and its "
            f"{mode} volume attaches to one node at a time (`ddpdeploy down` removes the "
            "job's pods and keeps the claim)"
        )
    return f"{started} (pulling its image or mounting the volume); give it longer with --timeout"
