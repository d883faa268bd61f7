"""A stand-in for the Kubeflow training operator's PyTorchJob controller (v1.9.x), for the e2e
cluster: training-operator cannot be built on this machine (no Go module proxy).

Written from what v1.9 does (pkg/controller.v1/pytorch, pkg/controller.v1/common, pkg/core,
pkg/util/status.go, pkg/webhooks/pytorch; see docs/ci.md), not from its code:

- defaults, in memory only: cleanPodPolicy None, replicas 1, restartPolicy OnFailure, the
  `pytorchjob-port` 23456 on the `pytorch` container, nprocPerNode "auto" unless the elastic
  policy sets nProcPerNode, elastic min/max from each other or the Worker replicas;
- per replica a pod and a headless Service, both `<job>-<type>-<index>`, labelled
  training.kubeflow.org/{operator-name,job-name,replica-type,replica-index} (+ job-role=master
  on the master role: Master, else worker 0), the job as their controller owner (deleting
  the job garbage-collects them);
- the env added to every container: PYTHONUNBUFFERED; with a Master, MASTER_ADDR/PORT,
  PET_MASTER_ADDR/PORT, WORLD_SIZE (replicas x nprocPerNode, x 1 for "auto"), RANK and
  PET_NODE_RANK (+1 on workers); PET_NPROC_PER_NODE; PET_NNODES, or for elastic jobs
  PET_RDZV_ENDPOINT, PET_RDZV_BACKEND, PET_NNODES=min:max, PET_MAX_RESTARTS, PET_RDZV_ID,
  PET_RDZV_CONF, PET_STANDALONE;
- on workers of a job with a Master, the init container `init-pytorch` that waits for the
  master's DNS name (getent in a local image instead of nslookup in alpine:3.10);
- restarts: the pod's restartPolicy is the replica's (ExitCode: Never); a Failed pod is
  deleted and made again (condition Restarting) under OnFailure/Always, or under ExitCode
  when the `pytorch` container exited with a code >= 128; ExitCode with 1-127 fails the
  job; Never: a failed replica fails the job; backoffLimit counts container restarts;
  activeDeadlineSeconds;
- conditions Created, Running, Restarting, Succeeded, Failed, Suspended as util/status.go
  sets them (Running and Restarting replace each other, Succeeded/Failed flip Running to
  False, nothing changes once Failed); success when the Master succeeds (all Workers
  without a Master, any Worker for elastic jobs);
- cleanPodPolicy (None/Running/All) and ttlSecondsAfterFinished once finished; suspend;
- the validating webhook's rules, served over HTTPS for the apiserver (--webhook);
- runPolicy.managedBy naming another controller: the job is left alone.

It also plays the local volume provisioner's one job here: a Released PersistentVolume of
the cluster's local volumes is wiped and made Available again (--volumes).

Run by .ci/cluster.sh; logs what it does, one line per action, to stdout (logs/operator.log).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import re
import shutil
import ssl
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # kubeloop; after the stdlib
from kubeloop import Obj, Watched, api_client, raw, status_of  # noqa: E402

log = logging.getLogger("e2e-operator")

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
API_VERSION = f"{GROUP}/{VERSION}"
CONTROLLER_NAME = "pytorchjob-controller"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
CONTAINER = "pytorch"
PORT_NAME = "pytorchjob-port"
DEFAULT_PORT = 23456
REPLICA_TYPES = ("Master", "Worker")  # the order this stand-in reconciles them in
MANAGED_BY = ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue")
INIT_MAX_TRIES = 100
NO_EXIT_CODE = 0xBEEF  # the operator's marker for "no terminated pytorch container"
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


# ------------------------------------------------------------------------------ defaults


def _default_container(pod_spec: Obj) -> Obj | None:
    """The `pytorch` container, else the first one (the operator's index lookup)."""
    containers = pod_spec.get("containers") or []
    for c in containers:
        if c.get("name") == CONTAINER:
            return c
    return containers[0] if containers else None


def defaulted(job: Obj) -> Obj:
    """A copy of ``job`` with the operator's defaults (never written back to the API)."""
    job = copy.deepcopy(job)
    spec = job.setdefault("spec", {})
    run = spec.setdefault("runPolicy", {})
    run.setdefault("cleanPodPolicy", "None")
    replicas = spec.get("pytorchReplicaSpecs") or {}
    for key in list(replicas):  # "master" -> "Master"
        for canon in REPLICA_TYPES:
            if key.lower() == canon.lower() and key != canon:
                replicas[canon] = replicas.pop(key)
    for rspec in replicas.values():
        if rspec.get("replicas") is None:
            rspec["replicas"] = 1
        if not rspec.get("restartPolicy"):
            rspec["restartPolicy"] = "OnFailure"
        container = _default_container(((rspec.get("template") or {}).get("spec")) or {})
        if container is not None and not any(
            p.get("name") == PORT_NAME for p in container.get("ports") or []
        ):
            container.setdefault("ports", []).append(
                {"name": PORT_NAME, "containerPort": DEFAULT_PORT}
            )
    policy = spec.get("elasticPolicy")
    if policy is not None:
        low, high = policy.get("minReplicas"), policy.get("maxReplicas")
        if low is None and high is None:
            low = high = (replicas.get("Worker") or {}).get("replicas")
        policy["minReplicas"] = high if low is None else low
        policy["maxReplicas"] = low if high is None else high
    if policy is None or policy.get("nProcPerNode") is None:
        spec.setdefault("nprocPerNode", "auto")
    return job


# ------------------------------------------------------------------------------ webhook rules


def validate(job: Obj, old: Obj | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the operator's validating webhook for ``job`` as submitted."""
    errors: list[str] = []
    warnings: list[str] = []
    name = (job.get("metadata") or {}).get("name", "")
    if len(name) > 63 or not DNS1035.match(name):
        errors.append(
            f'metadata.name: Invalid value: "{name}": should match: a lowercase RFC 1035 label'
        )
    spec = job.get("spec") or {}
    run = spec.get("runPolicy") or {}
    manager = run.get("managedBy")
    if manager is not None and manager not in MANAGED_BY:
        errors.append(f'spec.runPolicy.managedBy: Unsupported value: "{manager}"')
    if (
        old is not None
        and ((old.get("spec") or {}).get("runPolicy") or {}).get("managedBy") != manager
    ):
        # The real webhook compares the new object with itself here (a bug in v1.9: the
        # check never fires); the rule as meant is kept.
        errors.append("spec.runPolicy.managedBy: Invalid value: field is immutable")
    replicas = spec.get("pytorchReplicaSpecs")
    policy = spec.get("elasticPolicy")
    if policy is not None:
        if "Worker" not in (replicas or {}):
            errors.append(
                "spec.pytorchReplicaSpecs[Worker]: Required value: "
                "must be configured if elastic policy is used"
            )
        if policy.get("nProcPerNode") is not None:
            warnings.append("spec.elasticPolicy.nProcPerNode is deprecated, use spec.nprocPerNode")
            if spec.get("nprocPerNode") is not None:
                errors.append(
                    "spec.elasticPolicy.nProcPerNode: Forbidden: must not be used with "
                    "spec.nprocPerNode"
                )
    if replicas is None:
        errors.append("spec.pytorchReplicaSpecs: Required value: must be required")
    for rtype, rspec in (replicas or {}).items():
        path = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in REPLICA_TYPES:
            errors.append(f'{path}: Unsupported value: "{rtype}"')
        containers = (((rspec or {}).get("template") or {}).get("spec") or {}).get(
            "containers"
        ) or []
        if not containers:
            errors.append(f"{path}.template.spec.containers: Required value: must be specified")
        for i, c in enumerate(containers):
            if not c.get("image"):
                errors.append(f"{path}.template.spec.containers[{i}].image: Required value")
        if not any(c.get("name") == CONTAINER for c in containers):
            errors.append(
                f"{path}.template.spec.containers: Required value: must have at least one "
                f"container with name {CONTAINER}"
            )
        count = (rspec or {}).get("replicas")
        if rtype == "Master" and count != 1:
            errors.append(f"{path}.replicas: Forbidden: must be 1")
        elif rtype != "Master" and count is not None and count < 1:
            errors.append(f"{path}.replicas: Forbidden: must be at least 1")
    return errors, warnings


# ------------------------------------------------------------------------------ pods, services


def job_labels(name: str) -> dict[str, str]:
    return {OPERATOR_NAME_LABEL: CONTROLLER_NAME, JOB_NAME_LABEL: name.replace("/", "-")}


def replica_name(job_name: str, rtype: str, index: int) -> str:
    return f"{job_name}-{rtype.lower()}-{index}".replace("/", "-")


def owner_reference(job: Obj) -> Obj:
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _port_of(job: Obj, rtype: str) -> int:
    template = (job["spec"]["pytorchReplicaSpecs"][rtype].get("template") or {}).get("spec") or {}
    for c in template.get("containers") or []:
        if c.get("name") == CONTAINER:
            for p in c.get("ports") or []:
                if p.get("name") == PORT_NAME:
                    return int(p["containerPort"])
    raise ValueError(f"{rtype}: no {PORT_NAME} on the {CONTAINER} container")


def is_master_role(replicas: Obj, rtype: str, index: int) -> bool:
    if "Master" in replicas:
        return rtype == "Master"
    return rtype == "Worker" and index == 0


def operator_env(job: Obj, rtype: str, index: int) -> list[Obj]:
    """The env the operator appends to each container of pod <job>-<rtype>-<index>, in its
    order (``job`` defaulted)."""
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    name = job["metadata"]["name"]
    total = sum(int(r.get("replicas") or 0) for r in replicas.values())
    nproc = spec.get("nprocPerNode")
    nproc_int = int(nproc) if isinstance(nproc, str) and nproc.isdigit() else 1
    env = [("PYTHONUNBUFFERED", "1")]
    if "Master" in replicas:
        port = str(_port_of(job, "Master"))
        master = replica_name(name, "Master", 0)
        rank = index + 1 if rtype == "Worker" else index
        env += [
            ("MASTER_PORT", port),
            ("PET_MASTER_PORT", port),
            ("MASTER_ADDR", master),
            ("PET_MASTER_ADDR", master),
            ("WORLD_SIZE", str(total * nproc_int)),
            ("RANK", str(rank)),
            ("PET_NODE_RANK", str(rank)),
        ]
    if nproc is not None:
        env.append(("PET_NPROC_PER_NODE", str(nproc)))
    policy = spec.get("elasticPolicy")
    if policy is None:
        env.append(("PET_NNODES", str(total)))
    else:
        host = policy.get("rdzvHost") or f"{name}-worker-0"
        port = policy.get("rdzvPort") or _port_of(job, "Worker")
        env.append(("PET_RDZV_ENDPOINT", f"{host}:{port}"))
        env.append(("PET_RDZV_BACKEND", policy.get("rdzvBackend") or "c10d"))
        low, high = policy.get("minReplicas"), policy.get("maxReplicas")
        if low is None and high is None:
            env.append(("PET_NNODES", str(replicas["Worker"]["replicas"])))
        else:
            env.append(("PET_NNODES", f"{low}:{high}"))
        if policy.get("maxRestarts") is not None:
            env.append(("PET_MAX_RESTARTS", str(policy["maxRestarts"])))
        if policy.get("nProcPerNode") is not None:
            env.append(("PET_NPROC_PER_NODE", str(policy["nProcPerNode"])))
        if policy.get("rdzvId") is not None:
            env.append(("PET_RDZV_ID", policy["rdzvId"]))
        if policy.get("rdzvConf"):
            conf = ",".join(f"{c.get('key')}={c.get('value')}" for c in policy["rdzvConf"])
            env.append(("PET_RDZV_CONF", conf))
        if policy.get("standalone"):
            env.append(("PET_STANDALONE", ""))
    return [{"name": k, "value": v} for k, v in env]


def init_container(job_name: str, image: str, max_tries: int = INIT_MAX_TRIES) -> Obj:
    """The operator's init-pytorch, with getent (glibc, the image's) for busybox nslookup."""
    master = replica_name(job_name, "Master", 0)
    script = (
        f"err=1;for i in $(seq {max_tries}); do if getent hosts {master}; then err=0 && break;"
        " fi;echo waiting for master; sleep 2; done; exit $err"
    )
    return {
        "name": "init-pytorch",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {
            "limits": {"cpu": "100m", "memory": "20Mi"},
            "requests": {"cpu": "50m", "memory": "10Mi"},
        },
        "command": ["sh", "-c", script],
    }


def pod_for(job: Obj, rtype: str, index: int, init_image: str) -> tuple[Obj, list[str]]:
    """The pod of replica ``rtype`` ``index`` of ``job`` (defaulted), and warnings for events."""
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    rspec = replicas[rtype]
    name = job["metadata"]["name"]
    template = copy.deepcopy(rspec.get("template") or {})
    meta = template.get("metadata") or {}
    labels = {
        **(meta.get("labels") or {}),
        **job_labels(name),
        REPLICA_TYPE_LABEL: rtype.lower(),
        REPLICA_INDEX_LABEL: str(index),
    }
    if is_master_role(replicas, rtype, index):
        labels[JOB_ROLE_LABEL] = "master"
    pod_spec = template.get("spec") or {}
    env = operator_env(job, rtype, index)
    for c in pod_spec.get("containers") or []:
        c["env"] = [*(c.get("env") or []), *copy.deepcopy(env)]
    if "Master" in replicas and rtype == "Worker":
        pod_spec["initContainers"] = [
            *(pod_spec.get("initContainers") or []),
            init_container(name, init_image),
        ]
    warnings = []
    if pod_spec.get("restartPolicy"):
        warnings.append(
            "Restart policy in pod template will be overwritten by restart policy in replica spec"
        )
    policy = rspec["restartPolicy"]
    pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
    pod_meta = {
        **{k: v for k, v in meta.items() if k not in ("name", "namespace", "labels")},
        "name": replica_name(name, rtype, index),
        "namespace": job["metadata"].get("namespace", "default"),
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}, warnings


def service_for(job: Obj, rtype: str, index: int) -> Obj:
    """The headless Service of replica ``rtype`` ``index``: every named port of its
    `pytorch` container, no publishNotReadyAddresses."""
    name = job["metadata"]["name"]
    labels = {
        **job_labels(name),
        REPLICA_TYPE_LABEL: rtype.lower(),
        REPLICA_INDEX_LABEL: str(index),
    }
    template = (job["spec"]["pytorchReplicaSpecs"][rtype].get("template") or {}).get("spec") or {}
    ports = [
        {"name": p["name"], "port": p["containerPort"]}
        for c in template.get("containers") or []
        if c.get("name") == CONTAINER
        for p in c.get("ports") or []
        if p.get("name")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": replica_name(name, rtype, index),
            "namespace": job["metadata"].get("namespace", "default"),
            "labels": labels,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {"clusterIP": "None", "selector": dict(labels), "ports": ports},
    }


# ------------------------------------------------------------------------------ conditions


def has_condition(status: Obj, ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True" for c in status.get("conditions") or []
    )


def set_condition(
    status: Obj, ctype: str, cstatus: str, reason: str, message: str, now: datetime
) -> None:
    """util/status.go's setCondition: nothing changes once Failed; the same type, status and
    reason is kept as it is; Running and Restarting replace each other; Succeeded and Failed
    turn Running to False; the new condition goes last."""
    if has_condition(status, "Failed"):
        return
    conditions = status.get("conditions") or []
    current = next((c for c in conditions if c.get("type") == ctype), None)
    if current and current.get("status") == cstatus and current.get("reason") == reason:
        return
    new = {
        "type": ctype,
        "status": cstatus,
        "reason": reason,
        "message": message,
        "lastUpdateTime": stamp(now),
        "lastTransitionTime": stamp(now),
    }
    if current and current.get("status") == cstatus:
        new["lastTransitionTime"] = current.get("lastTransitionTime", new["lastTransitionTime"])
    kept = []
    for c in conditions:
        if c.get("type") == ctype:
            continue
        if {ctype, c.get("type")} == {"Running", "Restarting"}:
            continue
        if ctype in ("Succeeded", "Failed") and c.get("type") == "Running":
            c = {**c, "status": "False"}
        kept.append(c)
    status["conditions"] = [*kept, new]


# ------------------------------------------------------------------------------ the reconcile


@dataclass
class Plan:
    """What one reconcile of a job decides; ``Operator.apply`` carries it out."""

    status: Obj
    create: list[Obj] = field(default_factory=list)  # pods and services
    delete: list[tuple[str, str]] = field(default_factory=list)  # (Pod|Service, name)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, msg)
    delete_job: bool = False
    requeue_after: float | None = None


def _phase(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def _index(obj: Obj) -> int | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(REPLICA_INDEX_LABEL, "")
    return int(value) if value.isdigit() else None


def _of_type(objs: Iterable[Obj], rtype: str) -> list[Obj]:
    return [
        o
        for o in objs
        if ((o.get("metadata") or {}).get("labels") or {}).get(REPLICA_TYPE_LABEL) == rtype.lower()
    ]


def _slices(objs: list[Obj], count: int) -> list[list[Obj]]:
    indexes = [i for o in objs if (i := _index(o)) is not None]
    slices: list[list[Obj]] = [[] for _ in range(max([count, *[i + 1 for i in indexes]]))]
    for o in objs:
        i = _index(o)
        if i is not None:
            slices[i].append(o)
    return slices


def _exit_code(pod: Obj) -> int:
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (st.get("state") or {}).get("terminated")
        if st.get("name") == CONTAINER and term:
            return int(term.get("exitCode", 0))
    return NO_EXIT_CODE


def _active(pod: Obj) -> bool:
    return _phase(pod) not in ("Succeeded", "Failed") and not (pod.get("metadata") or {}).get(
        "deletionTimestamp"
    )


def _delete_pods_and_services(plan: Plan, run: Obj, pods: list[Obj]) -> None:
    """common/job.go DeletePodsAndServices: None keeps everything of a finished job, Running
    deletes its Running and Pending pods (with their Services), All every pod; a job that
    has not finished (suspended, past its limits) loses them all."""
    finished = has_condition(plan.status, "Succeeded") or has_condition(plan.status, "Failed")
    policy = run.get("cleanPodPolicy", "None")
    if finished and policy == "None":
        return
    for pod in pods:
        if finished and policy == "Running" and _phase(pod) not in ("Running", "Pending"):
            continue
        name = pod["metadata"]["name"]
        plan.delete += [("Pod", name), ("Service", name)]


def _ttl_cleanup(plan: Plan, run: Obj, now: datetime) -> None:
    ttl = run.get("ttlSecondsAfterFinished")
    if ttl is None or run.get("suspend"):
        return
    done = plan.status.get("completionTime")
    if not done:
        return  # the operator errors here ("job completion time is nil")
    expire = parse_stamp(done) + timedelta(seconds=int(ttl))
    if now >= expire:
        plan.delete_job = True
    else:
        plan.requeue_after = (expire - now).total_seconds()


def plan_reconcile(
    job: Obj, pods: list[Obj], services: list[Obj], now: datetime, init_image: str
) -> Plan:
    """One ReconcileJobs of the operator over ``job`` and its current pods and services."""
    job = defaulted(job)
    name = job["metadata"]["name"]
    spec = job["spec"]
    run = spec["runPolicy"]
    replicas = spec["pytorchReplicaSpecs"]
    status = copy.deepcopy(job.get("status") or {})
    plan = Plan(status=status)
    if not status.get("conditions"):  # the controller's create event
        set_condition(
            status, "Created", "True", "PyTorchJobCreated", f"PyTorchJob {name} is created.", now
        )

    if has_condition(status, "Succeeded") or has_condition(status, "Failed"):
        _delete_pods_and_services(plan, run, pods)
        _ttl_cleanup(plan, run, now)
        if has_condition(status, "Succeeded"):
            for rs in (status.get("replicaStatuses") or {}).values():
                rs["succeeded"] = rs.get("succeeded", 0) + rs.get("active", 0)
                rs.pop("active", None)
        return plan

    if run.get("suspend"):
        _delete_pods_and_services(plan, run, pods)
        for rs in (status.get("replicaStatuses") or {}).values():
            rs.pop("active", None)
        msg = f"PyTorchJob {name} is suspended."
        if has_condition(status, "Running"):
            set_condition(status, "Running", "False", "PyTorchJobSuspended", msg, now)
        if not has_condition(status, "Suspended"):
            set_condition(status, "Suspended", "True", "PyTorchJobSuspended", msg, now)
        plan.events.append(("Normal", "PyTorchJobSuspended", msg))
        return plan
    if has_condition(status, "Suspended"):
        msg = f"PyTorchJob {name} is resumed."
        set_condition(status, "Suspended", "False", "PyTorchJobResumed", msg, now)
        status["startTime"] = stamp(now)
        plan.events.append(("Normal", "PyTorchJobResumed", msg))

    active = [p for p in pods if _active(p)]
    failed = sum(1 for p in pods if _phase(p) == "Failed")
    total = sum(int(r["replicas"]) for r in replicas.values())
    before = sum(int(rs.get("failed", 0)) for rs in (status.get("replicaStatuses") or {}).values())
    failure = ""
    limit = run.get("backoffLimit")
    if limit is not None:
        # The controller also counts its own error requeues here; this one has none.
        exceeds = failed > before and len(active) != total and int(limit) < 1
        if exceeds or _past_backoff_limit(replicas, pods, int(limit)):
            failure = f"Job {name} has failed because it has reached the specified backoff limit"
    deadline = run.get("activeDeadlineSeconds")
    started = status.get("startTime")
    late = deadline is not None and started is not None
    if not failure and late and now - parse_stamp(started) >= timedelta(seconds=int(deadline)):
        failure = f"Job {name} has failed because it was active longer than specified deadline"
    if failure:
        status.setdefault("completionTime", stamp(now))
        plan.events.append(("Normal", "PyTorchJobFailed", failure))
        set_condition(status, "Failed", "True", "PyTorchJobFailed", failure, now)
        _delete_pods_and_services(plan, run, pods)
        _ttl_cleanup(plan, run, now)
        return plan

    statuses: Obj = {}
    for rtype in [t for t in REPLICA_TYPES if t in replicas]:
        statuses[rtype] = rs = {}
        _reconcile_pods(plan, job, _of_type(pods, rtype), rtype, rs, now, init_image)
        _reconcile_services(plan, job, _of_type(services, rtype), rtype)
    status["replicaStatuses"] = statuses
    if deadline is not None and status.get("startTime") is None:
        plan.requeue_after = float(deadline)
    _update_job_status(plan, job, now)
    return plan


def _past_backoff_limit(replicas: Obj, pods: list[Obj], limit: int) -> bool:
    restarts = 0
    for rtype, rspec in replicas.items():
        if rspec["restartPolicy"] not in ("OnFailure", "Always", "ExitCode"):
            continue
        for pod in _of_type(pods, rtype):
            if _phase(pod) != "Running":
                continue
            st = pod.get("status") or {}
            for cs in [
                *(st.get("initContainerStatuses") or []),
                *(st.get("containerStatuses") or []),
            ]:
                restarts += int(cs.get("restartCount") or 0)
    return restarts > 0 if limit == 0 else restarts >= limit


def _reconcile_pods(
    plan: Plan, job: Obj, pods: list[Obj], rtype: str, rs: Obj, now: datetime, init_image: str
) -> None:
    rspec = job["spec"]["pytorchReplicaSpecs"][rtype]
    count = int(rspec["replicas"])
    policy = rspec["restartPolicy"]
    name = job["metadata"]["name"]
    for index, same in enumerate(_slices(pods, count)):
        if len(same) > 1:
            log.warning("%s: more than one pod for %s %d", name, rtype, index)
            continue
        if not same:
            pod, warnings = pod_for(job, rtype, index, init_image)
            plan.create.append(pod)
            plan.events += [("Warning", "SettedPodTemplateRestartPolicy", w) for w in warnings]
            continue
        pod = same[0]
        pod_name = pod["metadata"]["name"]
        if index >= count:
            plan.delete.append(("Pod", pod_name))
        code = _exit_code(pod)
        if code != NO_EXIT_CODE:
            plan.events.append(
                ("Normal", "ExitedWithCode", f"Pod: {pod['metadata'].get('namespace')}."
                 f"{pod_name} exited with code {code}")
            )  # fmt: skip
        if _phase(pod) == "Failed":
            if policy in ("OnFailure", "Always") or (policy == "ExitCode" and code >= 128):
                plan.delete.append(("Pod", pod_name))
                msg = f"job {name} is restarting because {rtype} replica(s) failed."
                plan.events.append(("Warning", "PyTorchJobRestarting", msg))
                set_condition(plan.status, "Restarting", "True", "PyTorchJobRestarting", msg, now)
            elif policy == "ExitCode":
                msg = f'job "{name}" is failing because "{rtype}" replica(s) failed.'
                plan.events.append(("Warning", "PyTorchJobFailed", msg))
                set_condition(plan.status, "Failed", "True", "PyTorchJobFailed", msg, now)
        phase = _phase(pod)
        if phase == "Running":
            key = "failed" if (pod.get("metadata") or {}).get("deletionTimestamp") else "active"
            rs[key] = rs.get(key, 0) + 1
        elif phase == "Succeeded":
            rs["succeeded"] = rs.get("succeeded", 0) + 1
        elif phase == "Failed":
            rs["failed"] = rs.get("failed", 0) + 1


def _reconcile_services(plan: Plan, job: Obj, services: list[Obj], rtype: str) -> None:
    count = int(job["spec"]["pytorchReplicaSpecs"][rtype]["replicas"])
    for index, same in enumerate(_slices(services, count)):
        if not same:
            plan.create.append(service_for(job, rtype, index))
        elif len(same) == 1 and index >= count:
            plan.delete.append(("Service", same[0]["metadata"]["name"]))


def _selector(name: str, rtype: str) -> str:
    labels = {**job_labels(name), REPLICA_TYPE_LABEL: rtype.lower()}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _update_job_status(plan: Plan, job: Obj, now: datetime) -> None:
    """pytorchjob_controller.go UpdateJobStatus."""
    status = plan.status
    name = job["metadata"]["name"]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    elastic = job["spec"].get("elasticPolicy") is not None
    status.setdefault("startTime", stamp(now))
    rtypes = [t for t in REPLICA_TYPES if t in replicas]
    for rtype in rtypes:  # (the operator sets each in the loop below, which may end early)
        status["replicaStatuses"][rtype]["selector"] = _selector(name, rtype)
    for rtype in rtypes:
        rs = status["replicaStatuses"][rtype]
        succeeded, running, failed = (rs.get(k, 0) for k in ("succeeded", "active", "failed"))
        count = int(replicas[rtype]["replicas"])
        expected = count - succeeded
        if "Master" in replicas:
            if rtype == "Master":
                if running > 0:
                    msg = f"PyTorchJob {name} is running."
                    set_condition(status, "Running", "True", "PyTorchJobRunning", msg, now)
                if expected == 0:
                    msg = f"PyTorchJob {name} is successfully completed."
                    plan.events.append(("Normal", "PyTorchJobSucceeded", msg))
                    status.setdefault("completionTime", stamp(now))
                    set_condition(status, "Succeeded", "True", "PyTorchJobSucceeded", msg, now)
                    return
        elif rtype == "Worker":
            if expected == 0 or (elastic and succeeded > 0):
                ns = job["metadata"].get("namespace")
                msg = f"PyTorchJob {ns}/{name} successfully completed."
                plan.events.append(("Normal", "PyTorchJobSucceeded", msg))
                status.setdefault("completionTime", stamp(now))
                set_condition(status, "Succeeded", "True", "PyTorchJobSucceeded", msg, now)
            elif running > 0:
                msg = f"PyTorchJob {job['metadata'].get('namespace')}/{name} is running."
                set_condition(status, "Running", "True", "PyTorchJobRunning", msg, now)
        if failed > 0 and count > succeeded + running:
            if replicas[rtype]["restartPolicy"] != "Never":
                msg = f"PyTorchJob {name} is restarting because {failed} {rtype} replica(s) failed."
                plan.events.append(("Warning", "PyTorchJobRestarting", msg))
                set_condition(status, "Restarting", "True", "PyTorchJobRestarting", msg, now)
            else:
                msg = f"PyTorchJob {name} is failed because {failed} {rtype} replica(s) failed."
                plan.events.append(("Normal", "PyTorchJobFailed", msg))
                status.setdefault("completionTime", stamp(now))
                set_condition(status, "Failed", "True", "PyTorchJobFailed", msg, now)


# ------------------------------------------------------------------------------ the controller


class WorkQueue:
    """Job keys to reconcile, each at most once pending, each at its due time."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.due: dict[tuple[str, str], float] = {}

    def add(self, key: tuple[str, str], after: float = 0.0) -> None:
        with self.cond:
            at = time.monotonic() + after
            if key not in self.due or at < self.due[key]:
                self.due[key] = at
            self.cond.notify()

    def get(self, stop: threading.Event) -> tuple[str, str] | None:
        with self.cond:
            while not stop.is_set():
                if self.due:
                    key, at = min(self.due.items(), key=lambda kv: kv[1])
                    wait = at - time.monotonic()
                    if wait <= 0:
                        del self.due[key]
                        return key
                else:
                    wait = 1.0
                self.cond.wait(min(wait, 1.0))
        return None


class Operator:
    def __init__(self, kubeconfig: str, init_image: str) -> None:
        from kubernetes import client

        self.api = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.init_image = init_image
        self.queue = WorkQueue()
        self.stop = threading.Event()

    # -- triggers: every change of a job or of a pod/service it owns queues the job
    def _on_job(self, _kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        self.queue.add((meta.get("namespace", ""), meta.get("name", "")))

    def _on_owned(self, _kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        job = (meta.get("labels") or {}).get(JOB_NAME_LABEL)
        if job:
            self.queue.add((meta.get("namespace", ""), job))

    def start(self) -> None:
        selector = f"{OPERATOR_NAME_LABEL}={CONTROLLER_NAME}"
        Watched(
            "pytorchjobs",
            self.custom.list_cluster_custom_object,
            self._on_job,
            group=GROUP,
            version=VERSION,
            plural=PLURAL,
        ).start(self.stop)
        Watched(
            "pods", self.core.list_pod_for_all_namespaces, self._on_owned, label_selector=selector
        ).start(self.stop)
        Watched(
            "services",
            self.core.list_service_for_all_namespaces,
            self._on_owned,
            label_selector=selector,
        ).start(self.stop)
        threading.Thread(target=self._work, name="worker", daemon=True).start()

    def _work(self) -> None:
        while (key := self.queue.get(self.stop)) is not None:
            try:
                after = self.reconcile(*key)
            except Exception as exc:
                if status_of(exc) == 409:
                    log.info("%s/%s: conflict (%s); again", *key, str(exc).splitlines()[0])
                else:
                    log.exception("%s/%s: reconcile failed; again in 1s", *key)
                after = 1.0 if status_of(exc) != 409 else 0.2
            if after is not None:
                self.queue.add(key, after)

    def _owned(self, items: list[Obj], uid: str) -> list[Obj]:
        """Ours: controlled by this job (a same-named job's old pods are not), or orphans."""
        out = []
        for obj in items:
            refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
            if not refs or refs[0].get("uid") == uid:
                out.append(obj)
        return out

    def reconcile(self, ns: str, name: str) -> float | None:
        try:
            job = raw(self.custom.get_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name)
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise
        meta = job["metadata"]
        if meta.get("deletionTimestamp"):
            return None
        manager = ((job.get("spec") or {}).get("runPolicy") or {}).get("managedBy")
        if manager not in (None, MANAGED_BY[0]):
            log.info("%s/%s: managed by %s; left alone", ns, name, manager)
            return None
        selector = f"{JOB_NAME_LABEL}={name},{OPERATOR_NAME_LABEL}={CONTROLLER_NAME}"
        pods = raw(self.core.list_namespaced_pod, ns, label_selector=selector)["items"]
        services = raw(self.core.list_namespaced_service, ns, label_selector=selector)["items"]
        pods, services = self._owned(pods, meta["uid"]), self._owned(services, meta["uid"])
        plan = plan_reconcile(job, pods, services, now_utc(), self.init_image)
        self.apply(job, plan)
        return plan.requeue_after

    def apply(self, job: Obj, plan: Plan) -> None:
        ns, name = job["metadata"].get("namespace", "default"), job["metadata"]["name"]
        for obj in plan.create:
            kind = obj["kind"]
            create = (
                self.core.create_namespaced_pod
                if kind == "Pod"
                else self.core.create_namespaced_service
            )
            try:
                raw(create, ns, obj)
                log.info("%s/%s: created %s %s", ns, name, kind, obj["metadata"]["name"])
                if kind == "Pod":
                    msg = f"Created pod: {obj['metadata']['name']}"
                    plan.events.append(("Normal", "SuccessfulCreatePod", msg))
            except Exception as exc:
                if status_of(exc) != 409:  # exists already (the old one is still going)
                    raise
                log.info("%s/%s: %s %s exists still", ns, name, kind, obj["metadata"]["name"])
        for kind, obj_name in dict.fromkeys(plan.delete):
            delete = (
                self.core.delete_namespaced_pod
                if kind == "Pod"
                else self.core.delete_namespaced_service
            )
            try:
                raw(delete, obj_name, ns)
                log.info("%s/%s: deleted %s %s", ns, name, kind, obj_name)
            except Exception as exc:
                if status_of(exc) != 404:
                    raise
        for etype, reason, message in dict.fromkeys(plan.events):
            self.event(job, etype, reason, message)
        if plan.status != (job.get("status") or {}):
            body = {**job, "status": plan.status}
            raw(
                self.custom.replace_namespaced_custom_object_status,
                GROUP,
                VERSION,
                ns,
                PLURAL,
                name,
                body,
            )
            shown = ", ".join(f"{c['type']}={c['status']}" for c in plan.status["conditions"])
            counts = {
                rtype: {k: v for k, v in rs.items() if k != "selector"}
                for rtype, rs in (plan.status.get("replicaStatuses") or {}).items()
            }
            log.info("%s/%s: status %s; replicas %s", ns, name, shown, json.dumps(counts))
        if plan.delete_job:
            try:
                raw(
                    self.custom.delete_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    ns,
                    PLURAL,
                    name,
                    body={"propagationPolicy": "Background"},
                )
                log.info("%s/%s: deleted the job (ttlSecondsAfterFinished)", ns, name)
            except Exception as exc:
                if status_of(exc) != 404:
                    raise

    def event(self, job: Obj, etype: str, reason: str, message: str) -> None:
        meta = job["metadata"]
        t = stamp(now_utc())
        body = {
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}"},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta["uid"],
            },
            "type": etype,
            "reason": reason,
            "message": message,
            "source": {"component": CONTROLLER_NAME},
            "firstTimestamp": t,
            "lastTimestamp": t,
            "count": 1,
        }
        try:
            raw(self.core.create_namespaced_event, meta.get("namespace"), body)
        except Exception as exc:  # events are best effort, as the recorder's are
            log.warning("event %s on %s: %s", reason, meta["name"], exc)

    def resync(self) -> None:
        """Every job again every 30 s, as the controller's informer resync does."""
        while not self.stop.wait(30):
            try:
                jobs = raw(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
                for job in jobs.get("items") or []:
                    self._on_job("RESYNC", job)
            except Exception as exc:
                log.warning("resync: %s", exc)


# ------------------------------------------------------------------------------ webhook server


def admission_response(review: Obj) -> Obj:
    request = review.get("request") or {}
    errors, warnings = validate(request.get("object") or {}, request.get("oldObject"))
    response: Obj = {"uid": request.get("uid", ""), "allowed": not errors}
    if errors:
        message = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
        response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class WebhookHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        try:
            review = json.loads(self.rfile.read(length))
            body = json.dumps(admission_response(review)).encode()
        except Exception as exc:
            self.send_error(400, str(exc))
            return
        request = review.get("request") or {}
        allowed = json.loads(body)["response"]["allowed"]
        log.info(
            "webhook: %s %s/%s%s: %s",
            request.get("operation"),
            request.get("namespace"),
            (request.get("object") or {}).get("metadata", {}).get("name"),
            " (dry run)" if request.get("dryRun") else "",
            "allowed" if allowed else "denied",
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per review is logged in do_POST


def serve_webhook(address: str, cert: str, key: str) -> None:
    host, port = address.rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), WebhookHandler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="webhook", daemon=True).start()
    log.info("webhook: serving https://%s/validate-kubeflow-org-v1-pytorchjob", address)


# ------------------------------------------------------------------------------ local volumes


def recycle_volumes(op: Operator, root: Path) -> None:
    """Released local volumes under ``root``: wiped, then Available again (what the local
    static provisioner does by deleting and recreating the PV)."""
    while not op.stop.wait(3):
        try:
            pvs = raw(op.core.list_persistent_volume, label_selector="ddpdeploy.dev/e2e-volume")
            for pv in pvs.get("items") or []:
                if (pv.get("status") or {}).get("phase") != "Released":
                    continue
                path = Path(((pv.get("spec") or {}).get("local") or {}).get("path", ""))
                if root not in path.parents:
                    continue
                for child in path.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
                pv["spec"].pop("claimRef", None)
                raw(op.core.replace_persistent_volume, pv["metadata"]["name"], pv)
                log.info("volume %s: wiped and Available again", pv["metadata"]["name"])
        except Exception as exc:
            log.warning("volumes: %s", exc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--init-image", required=True, help="image of the init-pytorch container")
    parser.add_argument("--webhook", help="HOST:PORT to serve the validating webhook on")
    parser.add_argument("--webhook-cert")
    parser.add_argument("--webhook-key")
    parser.add_argument("--volumes", help="the local volumes' folder, to recycle released ones")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout
    )
    logging.getLogger("kubeloop").setLevel(logging.INFO)
    if args.webhook:
        serve_webhook(args.webhook, args.webhook_cert, args.webhook_key)
    op = Operator(args.kubeconfig, args.init_image)
    op.start()
    threading.Thread(target=op.resync, name="resync", daemon=True).start()
    if args.volumes:
        threading.Thread(
            target=recycle_volumes, args=(op, Path(args.volumes)), name="volumes", daemon=True
        ).start()
    log.info("PyTorchJob controller started (init image %s)", args.init_image)
    op.stop.wait()


if __name__ == "__main__":
    main()
