"""Reading a job's checkpoint volume on the cluster, for `collect --from cluster`.

From a running pod of the job when there is one (the volume is mounted there), else from a
short-lived helper pod that mounts the claim read-only and is deleted afterwards, on
failure and Ctrl-C too. Files are listed with `ls` and read with `cat` through the exec
API; checksums are checked by ddpdeploy.checkpoints like for any other source.
"""

from __future__ import annotations

import contextlib
import posixpath
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from ddpdeploy.adapters.kube import Kube
from ddpdeploy.errors import OperationError
from ddpdeploy.render.pod import checkpoint_claim_name, labels
from ddpdeploy.spec import JobSpec
from ddpdeploy.streams import ChunkReader
from ddpdeploy.targets import layout_of

Obj = dict[str, Any]
HELPER_CONTAINER = "reader"


class PodSource:
    """The checkpoint folder as seen from inside one pod."""

    def __init__(self, kube: Kube, pod: str, namespace: str, container: str, folder: str):
        self.kube, self.pod, self.namespace, self.container = kube, pod, namespace, container
        self.folder = folder
        self.where = f"pod {pod}:{folder}"

    def names(self) -> list[str]:
        out = b"".join(self._run(["ls", "-1", self.folder]))
        return sorted(line for line in out.decode().splitlines() if line)

    def open(self, name: str) -> contextlib.AbstractContextManager[BinaryIO]:
        path = posixpath.join(self.folder, posixpath.basename(name))
        return contextlib.closing(ChunkReader(self._run(["cat", path])))  # type: ignore[arg-type]

    def _run(self, argv: list[str]) -> Iterator[bytes]:
        return self.kube.exec_stream(self.pod, self.namespace, self.container, argv)


def helper_pod(spec: JobSpec, image: str) -> Obj:
    """A pod that mounts the job's claim read-only and idles until deleted."""
    claim = checkpoint_claim_name(spec)
    mount = spec.checkpoint.mount_path if spec.checkpoint else "/checkpoints"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{spec.name}-collect",
            "namespace": spec.namespace,
            "labels": {**labels(spec), "ddpdeploy.dev/role": "collect"},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 3600,  # a safety net should the delete never come
            "containers": [
                {
                    "name": HELPER_CONTAINER,
                    "image": image,
                    "command": ["sleep", "3600"],
                    "volumeMounts": [{"name": "ckpt", "mountPath": mount, "readOnly": True}],
                }
            ],
            "volumes": [
                {"name": "ckpt", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
            ],
        },
    }


def _running_pod(kube: Kube, spec: JobSpec) -> str | None:
    selector = layout_of(spec.target).pod_selector(spec.name)
    labels = ",".join(f"{k}={v}" for k, v in selector.items())
    pods = kube.list("v1", "Pod", spec.namespace, labels=labels)
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    return min((p["metadata"]["name"] for p in running), default=None)


@contextlib.contextmanager
def pod_source(kube: Kube, spec: JobSpec, timeout: float) -> Iterator[PodSource]:
    """A source reading the job's checkpoint folder from a running or a helper pod."""
    if spec.checkpoint is None:
        raise OperationError(f"job {spec.name} has no checkpoint volume (checkpoint: in the spec)")
    folder = spec.checkpoint.mount_path
    pod = _running_pod(kube, spec)
    if pod is not None:
        container = layout_of(spec.target).container  # the training container
        yield PodSource(kube, pod, spec.namespace, container, folder)
        return
    body = helper_pod(spec, spec.image or "busybox")
    name = body["metadata"]["name"]
    kube.create(body)
    try:
        _wait_running(kube, name, spec.namespace, timeout)
        yield PodSource(kube, name, spec.namespace, HELPER_CONTAINER, folder)
    finally:
        kube.delete("v1", "Pod", name, spec.namespace)


def _wait_running(kube: Kube, name: str, namespace: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    phase = "Pending"
    while time.monotonic() < deadline:
        pod = kube.get("v1", "Pod", name, namespace)
        phase = ((pod or {}).get("status") or {}).get("phase") or "Pending"
        if phase == "Running":
            return
        if phase in ("Failed", "Succeeded"):
            break
        time.sleep(1)
    raise OperationError(
        f"the helper pod {name} that reads the checkpoint volume is {phase} after "
        f"{timeout:g}s (a ReadWriteOnce volume attaches to one node at a time: are the job's "
        "pods gone? `ddpdeploy down` removes them); it has been deleted"
    )
