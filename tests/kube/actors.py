"""The tests' stand-ins for the training operator and the kubelet, which the test cluster
lacks: they create a job's pods and write the statuses those components would write (the
kubelet's log endpoint is kubelet.py's)."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MERGE = "application/merge-patch+json"


def res(admin: Any, api_version: str, kind: str) -> Any:
    return admin.resources.get(api_version=api_version, kind=kind)


def get_job(admin: Any, ns: str, name: str) -> dict | None:
    jobs = res(admin, "kubeflow.org/v1", "PyTorchJob")
    items = jobs.get(namespace=ns).to_dict()["items"]
    return next((j for j in items if j["metadata"]["name"] == name), None)


def pod_spec(job: dict) -> dict:
    """The pod spec of the job's rank-0 replica: Master under static rendezvous, Worker under
    c10d (the default, no Master)."""
    replicas = job["spec"]["pytorchReplicaSpecs"]
    return dict(replicas.get("Master", replicas.get("Worker"))["template"]["spec"])


def wait_for_job(admin: Any, ns: str, name: str, proc: subprocess.Popen | None = None) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (job := get_job(admin, ns, name)) is not None:
            return job
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"up exited early: {proc.communicate()}")
        time.sleep(0.2)
    raise AssertionError(f"PyTorchJob {ns}/{name} never appeared")


def create_pods(admin: Any, job: dict, node: str | None = None) -> list[str]:
    """One pod per replica, named and labelled as the operator (v1.9) does: the template's
    labels (ours) and its own, the job as its controller; ``node``: the Node they run on
    (the kubelet stand-in's, so that their logs can be read)."""
    meta = job["metadata"]
    names = []
    owner = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": meta["name"],
             "uid": meta["uid"], "controller": True}  # fmt: skip
    for replica, rspec in job["spec"]["pytorchReplicaSpecs"].items():
        for index in range(rspec["replicas"]):
            name = f"{meta['name']}-{replica.lower()}-{index}"
            labels = {
                **((rspec["template"].get("metadata") or {}).get("labels") or {}),
                "training.kubeflow.org/job-name": meta["name"],
                "training.kubeflow.org/replica-type": replica.lower(),
                "training.kubeflow.org/replica-index": str(index),
            }
            template = rspec["template"]["spec"]
            body = {
                "metadata": {"name": name, "labels": labels, "ownerReferences": [owner]},
                "spec": {"containers": template["containers"], "volumes": template.get("volumes")},
            }
            if node is not None:
                body["spec"]["nodeName"] = node
            res(admin, "v1", "Pod").create(namespace=meta["namespace"], body=body)
            names.append(name)
    return names


def set_pod_status(admin: Any, ns: str, pod: str, status: dict) -> None:
    pods = res(admin, "v1", "Pod")
    pods.status.patch(body={"status": status}, name=pod, namespace=ns, content_type=MERGE)


def set_running(admin: Any, ns: str, pod: str, image: str, restarts: int = 0) -> None:
    """The pod Running, its container started (``restarts`` times restarted before)."""
    state = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    status = {"phase": "Running", "containerStatuses": [container_status(image, state, restarts)]}
    set_pod_status(admin, ns, pod, status)


def container_status(image: str, state: dict, restarts: int = 0, last: dict | None = None) -> dict:
    out = {
        "name": "pytorch",
        "image": image,
        "imageID": "",
        "ready": "running" in state,
        "restartCount": restarts,
        "state": state,
    }
    if last:
        out["lastState"] = last
    return out


def set_job_conditions(admin: Any, ns: str, name: str, *conditions: tuple[str, str]) -> None:
    """Conditions as the operator writes them, through the status subresource."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conds = [
        {
            "type": kind,
            "status": "True",
            "reason": f"PyTorchJob{kind}",
            "message": message or f"PyTorchJob {name} is {kind.lower()}.",
            "lastUpdateTime": now,
            "lastTransitionTime": now,
        }
        for kind, message in conditions
    ]
    jobs = res(admin, "kubeflow.org/v1", "PyTorchJob")
    jobs.status.patch(
        body={"status": {"conditions": conds}}, name=name, namespace=ns, content_type=MERGE
    )


def start_cli(kubeconfig: Path, *args: str) -> subprocess.Popen[str]:
    """`python -m ddpdeploy ARGS` in the background (for `up --wait`)."""
    import os

    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "XDG_CACHE_HOME": str(kubeconfig.parent)}
    return subprocess.Popen(
        [sys.executable, "-m", "ddpdeploy", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 90) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the CLI did not finish: {out} {err}") from None
    return proc.returncode, out, err


class Lines:
    """A process's stderr lines as they come (read on a thread)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.seen, self._q = proc, [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.05)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"exited before {text!r}: {self.seen}")
            self.seen.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} in {self.seen}")

    def finish(self, timeout: float = 90) -> tuple[int, list[str]]:
        code = self.proc.wait(timeout=timeout)
        while (line := self._q.get(timeout=10)) is not None:
            self.seen.append(line)
        return code, self.seen


def make_pod(
    admin: Any,
    job: dict,
    name: str,
    labels: dict[str, str],
    node: str,
    owner: dict | None = None,
) -> dict:
    """One pod of ``job``'s rank-0 template with exactly ``labels`` (and ``owner`` as its
    controller), on Node ``node``: a replacement the operator makes, or a look-alike."""
    meta = job["metadata"]
    template = pod_spec(job)
    body: dict = {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": template["containers"],
            "volumes": template.get("volumes"),
            "nodeName": node,
        },
    }
    if owner is not None:
        body["metadata"]["ownerReferences"] = [{**owner, "controller": True}]
    return res(admin, "v1", "Pod").create(namespace=meta["namespace"], body=body).to_dict()


def operator_pod(admin: Any, job: dict, replica: str, index: int, node: str) -> dict:
    """A pod as the operator makes it: its labels and the template's (ddpdeploy's), and the
    job as its controller (by uid)."""
    meta = job["metadata"]
    rspec = job["spec"]["pytorchReplicaSpecs"][replica]
    labels = {
        **(rspec["template"].get("metadata") or {}).get("labels", {}),
        "training.kubeflow.org/job-name": meta["name"],
        "training.kubeflow.org/replica-type": replica.lower(),
        "training.kubeflow.org/replica-index": str(index),
    }
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": meta["name"],
             "uid": meta["uid"]}  # fmt: skip
    name = f"{meta['name']}-{replica.lower()}-{index}"
    return make_pod(admin, job, name, labels, node, owner)


def delete_pod_now(admin: Any, ns: str, pod: str) -> None:
    """Delete a pod at once (grace 0: no kubelet here confirms a graceful end)."""
    pods = res(admin, "v1", "Pod")
    pods.delete(name=pod, namespace=ns, body={"gracePeriodSeconds": 0})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        names = [p["metadata"]["name"] for p in pods.get(namespace=ns).to_dict()["items"]]
        if pod not in names:
            return
        time.sleep(0.1)
    raise AssertionError(f"pod {ns}/{pod} was never deleted")
