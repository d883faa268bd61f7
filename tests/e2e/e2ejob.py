"""A job on the e2e cluster as the tests see it (a plain module the test files import): the
spec file, `ddpdeploy up`, the pods and their logs through the real kubelet (with the
kubelet's timestamps), the event lines in them, and the three ways the tests break a
running job (a worker process, a container, a pod) with the time to the next training step.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from realcluster import Cluster

RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
SHA_LINE = re.compile(r"^weights_sha256\s+([0-9a-f]{64})\s*$", re.M)
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
CONTAINER = "pytorch"


def apis(cluster: Cluster) -> tuple[Any, Any]:
    from kubernetes import client

    api = cluster.api()
    return client.CoreV1Api(api), client.CustomObjectsApi(api)


def write_spec(folder: Path, spec: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ddpdeploy.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def event_of(text: str) -> dict[str, Any] | None:
    """The event of one log line (torchrun's `[rankN]:` prefix taken off), or None."""
    text = RANK_PREFIX.sub("", text).strip()
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "event" in obj else None


def events(log: str) -> list[dict[str, Any]]:
    """The JSON event lines of a pod's log."""
    return [e for line in log.splitlines() if (e := event_of(line)) is not None]


def stamp_of(text: str) -> float:
    """The kubelet's RFC 3339 timestamp (nanoseconds) as seconds since the epoch."""
    whole, _, frac = text.rstrip("Z").partition(".")
    base = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=None)
    epoch = (base - datetime(1970, 1, 1)).total_seconds()
    return epoch + (float(f"0.{frac}") if frac else 0.0)


@dataclass(frozen=True)
class Line:
    at: float  # the kubelet's timestamp
    pod: str
    text: str

    @property
    def event(self) -> dict[str, Any] | None:
        return event_of(self.text)


def pod_lines(core: Any, ns: str, pod: str, previous: bool = False) -> list[Line]:
    """The pod's `pytorch` log, each line with the kubelet's timestamp ([] when unreadable)."""
    try:
        log = core.read_namespaced_pod_log(
            pod, ns, container=CONTAINER, timestamps=True, previous=previous, _request_timeout=20
        )
    except Exception:
        return []
    out = []
    for raw in (log or "").splitlines():  # an empty log comes back as None
        stamp, _, text = raw.partition(" ")
        try:
            out.append(Line(stamp_of(stamp), pod, text))
        except ValueError:
            continue
    return out


def job_pods(core: Any, ns: str, name: str) -> list[Any]:
    pods = core.list_namespaced_pod(ns, label_selector=f"{JOB_NAME_LABEL}={name}").items
    return sorted(pods, key=lambda p: p.metadata.name)


def job_lines(core: Any, ns: str, name: str, previous: bool = False) -> list[Line]:
    """Every current container's log lines of the job's pods (and the previous ones'), by
    timestamp."""
    lines: list[Line] = []
    for pod in job_pods(core, ns, name):
        lines += pod_lines(core, ns, pod.metadata.name)
        if previous:
            lines += pod_lines(core, ns, pod.metadata.name, previous=True)
    return sorted(lines, key=lambda line: line.at)


def job_events(core: Any, ns: str, name: str, kind: str) -> list[tuple[Line, dict[str, Any]]]:
    return [(ln, e) for ln in job_lines(core, ns, name) if (e := ln.event) and e["event"] == kind]


def done_event(core: Any, ns: str, name: str) -> dict[str, Any] | None:
    """Rank 0's last `done` event, on whichever pod rank 0 ran last."""
    done = job_events(core, ns, name, "done")
    return done[-1][1] if done else None


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def job_condition(custom: Any, ns: str, name: str) -> str | None:
    """Succeeded or Failed once the job has ended, else None."""
    job = custom.get_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", name)
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond["type"] in ("Succeeded", "Failed") and cond["status"] == "True":
            return str(cond["type"])
    return None


def smoke_weights(run_cli: Any, spec_file: Path, cwd: Path) -> str:
    """`smoke --local` of the spec: its weights_sha256."""
    smoke = run_cli("smoke", "--local", "-f", str(spec_file), cwd=cwd)
    assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-3000:]
    found = SHA_LINE.search(smoke.stdout)
    assert found, smoke.stdout
    return found.group(1)


def cli_process(env: dict[str, str], *args: str, cwd: Path) -> subprocess.Popen[str]:
    """`python -m ddpdeploy ARGS` started in the background (stdout and stderr to pipes)."""
    import os

    return subprocess.Popen(
        [sys.executable, "-m", "ddpdeploy", *args],
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---- breaking a running job ----------------------------------------------------------------

# Inside the training container (as its user): SIGKILL the worker of local rank 0, one child
# of torchrun (PID 1 there); prints its PID.
KILL_WORKER = r"""
import os, signal
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        stat = open(f"/proc/{pid}/stat").read()
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        continue
    if stat.rsplit(")", 1)[1].split()[1] == "1" and b"LOCAL_RANK=0" in env:
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
        break
else:
    raise SystemExit("no worker of local rank 0 under PID 1")
"""


def kill_worker(cluster: Cluster, ns: str, pod: str) -> None:
    """One worker process killed inside the running container (torchrun sees it die)."""
    res = cluster_kubectl(cluster, "exec", "-n", ns, pod, "-c", CONTAINER, "--",
                          "python3", "-c", KILL_WORKER)  # fmt: skip
    assert res.returncode == 0 and res.stdout.strip(), res.stdout + res.stderr


def kill_container(ns: str, pod: str) -> None:
    """The pod's training container killed from the host (SIGKILL to its PID 1, through
    Docker): the kubelet sees it exit 137 and starts it again."""
    import docker

    engine = docker.from_env()
    labels = [
        f"io.kubernetes.pod.name={pod}",
        f"io.kubernetes.pod.namespace={ns}",
        f"io.kubernetes.container.name={CONTAINER}",
    ]
    (container,) = engine.containers.list(filters={"label": labels})
    container.kill()


def delete_pod(core: Any, ns: str, pod: str) -> None:
    """The pod deleted through the API (graceful: SIGTERM first); the operator makes it
    again."""
    core.delete_namespaced_pod(pod, ns)


def cluster_kubectl(cluster: Cluster, *args: str, timeout: float = 60) -> Any:
    from realcluster import cluster_sh

    return cluster_sh("kubectl", *args, env=cluster.env, timeout=timeout)


@dataclass
class Trial:
    """One kill and what followed: seconds from the kill to the first training step of
    the run that started after it (None: none came within the wait)."""

    kind: str
    rendezvous: str
    script: str
    pod: str
    killed_at_step: int  # the last step logged before the kill
    seconds: float | None = None
    resumed_from: int | None = None
    note: str = ""

    def row(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Breaker:
    """Kills parts of one running job, one trial at a time, and times the recovery."""

    cluster: Cluster
    ns: str
    name: str
    rendezvous: str
    script: str
    trials: list[Trial] = field(default_factory=list)

    @property
    def core(self) -> Any:
        return apis(self.cluster)[0]

    def last_step(self) -> int:
        steps = job_events(self.core, self.ns, self.name, "step")
        return int(steps[-1][1]["step"]) if steps else 0

    def steps_after(self, since: float) -> Iterator[tuple[Line, dict[str, Any]]]:
        for line, event in job_events(self.core, self.ns, self.name, "step"):
            if line.at > since:
                yield line, event

    def wait_steps(self, count: int, since: float, timeout: float = 180) -> None:
        """Until ``count`` step lines came after ``since``."""
        wait_for(
            f"{count} steps of {self.name}",
            lambda: len(list(self.steps_after(since))) >= count,
            timeout,
        )

    def trial(self, kind: str, pod: str, timeout: float) -> Trial:
        core = self.core
        step = self.last_step()
        t0 = time.time()
        if kind == "worker process":
            kill_worker(self.cluster, self.ns, pod)
        elif kind == "container":
            kill_container(self.ns, pod)
        elif kind == "pod":
            delete_pod(core, self.ns, pod)
        else:
            raise ValueError(kind)
        trial = Trial(kind, self.rendezvous, self.script, pod, step)
        self.trials.append(trial)

        def recovered() -> tuple[float, int | None] | None:
            lines = job_lines(core, self.ns, self.name)
            # The last step logged before the kill (read after it: the logs lag).
            steps = [ln for ln in lines if ln.at <= t0 and (ln.event or {}).get("event") == "step"]
            if steps:
                trial.killed_at_step = int((steps[-1].event or {})["step"])
            starts = [ln for ln in lines if ln.at > t0 and (ln.event or {}).get("event") == "start"]
            if not starts:
                return None
            start = starts[0]
            for ln in lines:
                e = ln.event or {}
                if ln.at > start.at and e.get("event") == "step":
                    resumed = (start.event or {}).get("resume_step")
                    return ln.at - t0, int(resumed) if resumed is not None else None
            return None

        try:
            trial.seconds, trial.resumed_from = wait_for(
                f"a step after the {kind} kill", recovered, timeout
            )
        except AssertionError:
            trial.note = f"no training step within {timeout:.0f}s"
        return trial


# ---- the launch contract on real pods --------------------------------------------------------


def assert_env_of_the_launch_contract(cluster: Cluster, ns: str, name: str) -> list[str]:
    """§2h: the env the operator stand-in gave each real pod of job ``name`` is what
    ddpdeploy's launch contract says the operator gives it (what `smoke --local` and
    compose reproduce), plus the pod's own HOME, TMPDIR and caches. Returns the pods."""
    # Product modules, imported here only.
    from ddpdeploy.cluster.saved import saved_spec
    from ddpdeploy.render.pod import pod_only_env
    from ddpdeploy.targets import launch_contract

    core, custom = apis(cluster)
    job = custom.get_namespaced_custom_object("kubeflow.org", "v1", ns, "pytorchjobs", name)
    spec = saved_spec(job)  # the spec `up` rendered the job from
    assert spec is not None
    launch = launch_contract(spec)
    for node in launch.nodes:
        pod = core.read_namespaced_pod(node.hostname, ns)
        (container,) = [c for c in pod.spec.containers if c.name == CONTAINER]
        got: dict[str, str] = {}
        for var in container.env:  # in order: a later one wins, as in the container
            if var.value_from is not None:
                assert var.value_from.field_ref.field_path == "status.podIP"
                got[var.name] = pod.status.pod_ip
            else:
                got[var.name] = var.value
        want = launch.node_env(node) | pod_only_env(spec)
        # The downward API's fields are the pod's own on the cluster (addresses stay names).
        want |= {var: pod.status.pod_ip for var in launch.field_env}
        assert got == want, node.hostname
    return [node.hostname for node in launch.nodes]


# ---- the trainings the tests run ------------------------------------------------------------

# A 2 x 2 CPU job that fits this 2-core node (the default asks a core per process).
SMALL = {"nodes": 2, "procs": 2, "gpus": 0, "cpu": "400m", "memory": "1536Mi"}
CHECKPOINT = {"size": "1Gi"}  # the default StorageClass: a local volume
# The built-in trainer: 60 steps, a checkpoint every 5.
BUILTIN = {**SMALL, "checkpoint": CHECKPOINT,
           "command": {"args": ["--steps", "60", "--checkpoint-every", "5"]}}  # fmt: skip
# The tutorial-style script (tests/e2e/scripts/plain_ddp.py): 6 epochs of 8 steps at 2 x 2.
PLAIN = {**SMALL, "checkpoint": CHECKPOINT, "command": {"script": "plain_ddp.py"}}
# The ddpkit script (tests/e2e/scripts/ddpkit_train.py): 24 steps, a checkpoint every 4.
DDPKIT = {**SMALL, "checkpoint": CHECKPOINT, "command": {"script": "ddpkit_train.py"}}


def slowed(spec: dict[str, Any], *args: str) -> dict[str, Any]:
    """``spec`` with training arguments added that change its timing, not its weights."""
    command = dict(spec["command"])
    command["args"] = [*command.get("args", []), *args]
    return {**spec, "command": command}
