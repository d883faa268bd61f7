"""`logs -f` across a container's runs, against the real kube-apiserver and the kubelet
stand-in (kubelet.py): a container that restarts and a pod replaced are read again from
their start, once, with a line saying so; a look-alike pod (not labelled ours) is never
read; the follow ends with the job, or on Ctrl-C."""

from __future__ import annotations

import queue
import signal
import threading
import time

import pytest
from actors import (
    create_pods,
    delete_pod_now,
    get_job,
    make_pod,
    operator_pod,
    res,
    set_job_conditions,
    set_running,
    start_cli,
)

IMAGE = "registry.invalid/train:v1"

pytestmark = pytest.mark.slow  # an apiserver, a kubelet stand-in, CLI subprocesses


def running(admin, namespace: str, pod: str, restarts: int = 0) -> None:
    set_running(admin, namespace, pod, IMAGE, restarts)


@pytest.fixture
def job(kube_cli, admin, namespace, kubelet):
    """`up` a 2-node job (c10d, the default), its pods (the operator's labels only) Running
    on the stand-in's node: (worker-0, worker-1), called (master, worker) below."""
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
    out = kube_cli(*args, "--procs", "2", "--no-wait")
    assert out.returncode == 0, out.stderr
    pods = create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)
    for pod in pods:
        running(admin, namespace, pod)
    return pods


ABORTED = "aborted (%s); nothing more was done"


class Follow:
    """`logs j -f ...` in the background: its stdout and stderr lines as they come."""

    def __init__(self, control_plane, namespace: str, *more: str, follow: bool = True) -> None:
        args = ["logs", "j", "-n", namespace, *(["-f"] if follow else []), *more]
        self.proc = start_cli(control_plane.kubeconfig, *args)
        self.out: list[str] = []
        self.err: list[str] = []
        self._q: queue.Queue[tuple[str, str | None]] = queue.Queue()
        for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            threading.Thread(target=self._read, args=(name, stream), daemon=True).start()

    def _read(self, name: str, stream) -> None:
        for line in stream:
            self._q.put((name, line.rstrip("\n")))
        self._q.put((name, None))

    def _take(self, timeout: float) -> bool:
        try:
            name, line = self._q.get(timeout=timeout)
        except queue.Empty:
            return False
        if line is not None:
            (self.out if name == "out" else self.err).append(line)
        return True

    def wait_for(self, line: str, where: str = "out", timeout: float = 60) -> None:
        seen = self.out if where == "out" else self.err
        deadline = time.monotonic() + timeout
        while line not in seen:
            assert time.monotonic() < deadline, (line, self.out, self.err)
            if not self._take(0.1) and self.proc.poll() is not None and self._q.empty():
                raise AssertionError(f"exited before {line!r}: {self.out} {self.err}")

    def finish(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        while self._take(1):
            pass
        return code


def followed_streams(kubelet, pod: str) -> int:
    return sum(f"/{pod}/" in r and "follow=true" in r for r in kubelet.requests)


def test_a_restarted_container_is_followed_from_its_start_once(
    control_plane, admin, namespace, kubelet, job
):
    master, worker = job
    kubelet.set_log(master, "[rank0]:m old\n[rank0]:m last")
    kubelet.set_log(worker, "[rank2]:w old\n[rank2]:w last")
    follow = Follow(control_plane, namespace, "--tail", "1")
    follow.wait_for("[rank0 node0] m last")
    follow.wait_for("[rank2 node1] w last")
    # torchrun's agent exits, the kubelet starts the container again: restart 1.
    kubelet.restart(worker, "[rank2]:w run 2\nagent: run 2 up")
    running(admin, namespace, worker, restarts=1)
    follow.wait_for("[node1] container restarted (restart 1); following the new one", "err")
    follow.wait_for("[rank2 node1] w run 2")  # the new run from its start (--tail is the first's)
    follow.wait_for("[node1] agent: run 2 up")
    kubelet.append(worker, "[rank3]:w run 2 more")
    follow.wait_for("[rank3 node1] w run 2 more")
    # Restart 2 shows in the pod's status while run 2's stream is still open: run 3 is read
    # once that stream has ended, and run 2's late line comes once, from its own stream.
    running(admin, namespace, worker, restarts=2)
    time.sleep(1.5)
    kubelet.append(worker, "[rank2]:w run 2 late")
    follow.wait_for("[rank2 node1] w run 2 late")
    kubelet.restart(worker, "[rank2]:w run 3")
    follow.wait_for("[node1] container restarted (restart 2); following the new one", "err")
    follow.wait_for("[rank2 node1] w run 3")
    time.sleep(1)
    assert follow.proc.poll() is None  # the job still runs
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Succeeded", ""))
    kubelet.close_streams()
    assert follow.finish() == 0, follow.err
    assert sorted(follow.out) == sorted(
        [
            "[rank0 node0] m last", "[rank2 node1] w last", "[rank2 node1] w run 2",
            "[node1] agent: run 2 up", "[rank3 node1] w run 2 more",
            "[rank2 node1] w run 2 late", "[rank2 node1] w run 3",
        ]
    )  # fmt: skip
    assert follow.err == [
        "[node1] container restarted (restart 1); following the new one",
        "[node1] container restarted (restart 2); following the new one",
    ]
    assert followed_streams(kubelet, worker) == 3 and followed_streams(kubelet, master) == 1
    assert not any("previous=true" in r for r in kubelet.requests)  # shown once: not re-read


def test_a_replaced_pod_is_followed_and_a_look_alike_never_read(
    control_plane, admin, namespace, kubelet, job
):
    master, worker = job
    obj = get_job(admin, namespace, "j")
    kubelet.set_log(master, "[rank0]:m1")
    kubelet.set_log(worker, "[rank2]:the first pod")
    follow = Follow(control_plane, namespace)
    follow.wait_for("[rank0 node0] m1")
    follow.wait_for("[rank2 node1] the first pod")

    def operator_labels(index: int) -> dict[str, str]:  # the operator's, none of ours
        return {
            "training.kubeflow.org/job-name": "j",
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": str(index),
        }

    # A look-alike worker appears: the job's pod selector matches it, our labels are not on it.
    make_pod(admin, obj, "j-worker-2", operator_labels(2), kubelet.node_name)
    kubelet.set_log("j-worker-2", "[rank4]:[red]not ours")
    running(admin, namespace, "j-worker-2")
    # Our worker is deleted and a look-alike takes its name (a new uid, not ours).
    delete_pod_now(admin, namespace, worker)
    kubelet.remove(worker)
    asked = followed_streams(kubelet, worker)
    make_pod(admin, obj, worker, operator_labels(1), kubelet.node_name)
    kubelet.set_log(worker, "[rank2]:a look-alike of the same name")
    running(admin, namespace, worker)
    time.sleep(2)  # the watch has brought both
    assert not any("/j-worker-2/" in r for r in kubelet.requests)
    assert followed_streams(kubelet, worker) == asked
    delete_pod_now(admin, namespace, worker)
    kubelet.remove(worker)
    # The operator's replacement: our labels (from the template), the job as its controller.
    operator_pod(admin, obj, "Worker", 1, kubelet.node_name)
    kubelet.set_log(worker, "[rank2]:the new pod")
    running(admin, namespace, worker)
    follow.wait_for(f"[node1] pod {worker} replaced (a new pod); following it", "err")
    follow.wait_for("[rank2 node1] the new pod")
    follow.proc.send_signal(signal.SIGINT)
    assert follow.finish(timeout=30) == 130
    assert follow.err == [
        f"[node1] pod {worker} replaced (a new pod); following it",
        ABORTED % "SIGINT",
    ]
    assert sorted(follow.out) == [
        "[rank0 node0] m1", "[rank2 node1] the first pod", "[rank2 node1] the new pod"
    ]  # fmt: skip
    assert not any("/j-worker-2/" in r for r in kubelet.requests)


# Found by the third hostile pass: `logs -f` ended exit 0 without a word when the job was
# deleted (its namespace too) or replaced (`up --replace`: a new uid); it says which, in one
# line, exit 1, as `up --wait` ends on a job that vanished.
@pytest.mark.parametrize("how", ["deleted", "replaced"])
@pytest.mark.parametrize("one_pod", [False, True], ids=["merged", "index"])
def test_follow_says_the_job_went_away(
    control_plane, kube_cli, admin, namespace, kubelet, job, how, one_pod
):
    master, worker = job
    kubelet.set_log(master, "[rank0]:m1")
    kubelet.set_log(worker, "[rank2]:w1")
    follow = Follow(control_plane, namespace, *(("--index", "0") if one_pod else ()))
    follow.wait_for("[rank0]:m1" if one_pod else "[rank0 node0] m1")
    res(admin, "kubeflow.org/v1", "PyTorchJob").delete(name="j", namespace=namespace)
    if how == "replaced":
        time.sleep(1)  # the watch sees the old one go first
        args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
        out = kube_cli(*args, "--procs", "2", "--no-wait")
        assert out.returncode == 0, out.stderr
    time.sleep(1)
    for pod in job:  # the old pods go (no garbage collector here): their streams end
        delete_pod_now(admin, namespace, pod)
        kubelet.remove(pod)
    assert follow.finish(timeout=30) == 1, (follow.out, follow.err)
    what = "deleted" if how == "deleted" else "replaced (a new job of that name)"
    assert follow.err == [f"error: PyTorchJob {namespace}/j was {what}; stopped following"]


# Found by the fourth hostile pass: `logs --index 1 -f` on a pod still Pending (its claim
# not there yet, on the real cluster) ended at once, exit 0, without a line, and
# `logs --index 1` printed nothing at all; the merged `logs` says why.
def test_one_pod_not_started_is_waited_for_when_followed_and_said_when_not(
    control_plane, kube_cli, admin, namespace, kubelet
):
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
    assert kube_cli(*args, "--procs", "2", "--no-wait").returncode == 0
    master, worker = create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)
    running(admin, namespace, master)  # worker-1: Pending, no container yet
    kubelet.set_log(worker, "")  # the API's empty answer for a pod not scheduled yet
    out = kube_cli("logs", "j", "-n", namespace, "--index", "1")
    assert out.returncode == 0 and out.stdout == ""
    assert out.stderr == f"no log lines: no container has started yet (pods: {worker} Pending)\n"
    follow = Follow(control_plane, namespace, "--index", "1")
    follow.wait_for(f"waiting for pod {worker} to start its container (Pending)", "err")
    assert follow.proc.poll() is None  # still there, not ended at once
    kubelet.set_log(worker, "[rank2]:w1")
    running(admin, namespace, worker)
    follow.wait_for("[rank2]:w1")
    follow.proc.send_signal(signal.SIGINT)
    assert follow.finish() == 130
    assert follow.err[1:] == [ABORTED % "SIGINT"], follow.err


# Found by the fifth hostile pass: `logs -f` of a job whose pods all waited (Unschedulable
# for room, on the real cluster) printed nothing at all until they started: silence.
def test_pods_not_started_are_said_once_when_the_merged_log_is_followed(
    control_plane, kube_cli, admin, namespace, kubelet
):
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
    assert kube_cli(*args, "--procs", "2", "--no-wait").returncode == 0
    master, worker = create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)
    follow = Follow(control_plane, namespace)
    follow.wait_for(
        f"waiting for pod(s) {master} (Pending), {worker} (Pending) to start their container; "
        "each is followed once it starts (`ddpdeploy status` says why they wait)",
        "err",
    )
    kubelet.set_log(worker, "[rank2]:w1")
    running(admin, namespace, worker)
    follow.wait_for("[rank2 node1] w1")
    follow.proc.send_signal(signal.SIGINT)
    assert follow.finish() == 130
    assert follow.err[1:] == ["[node1] container started; following it", ABORTED % "SIGINT"]


@pytest.mark.parametrize("one_pod", [(), ("--index", "0")], ids=["merged", "one-pod"])
def test_a_follow_ends_when_the_api_server_stops_answering(
    control_plane, admin, namespace, kubelet, job, one_pod
):
    # Found by the fourth hostile pass (left open then): with the API server stopped
    # (SIGSTOP: connections accepted, no byte sent), `logs -f` waited for ever, silent.
    master, worker = job
    kubelet.set_log(master, "[rank0]:m first")
    kubelet.set_log(worker, "[rank2]:w first")
    follow = Follow(control_plane, namespace, *one_pod)
    follow.wait_for("[rank0]:m first" if one_pod else "[rank0 node0] m first")
    (apiserver,) = [p for p in control_plane.procs if p.args[0] == control_plane.apiserver_bin]
    apiserver.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        code = follow.finish(timeout=90)
        took = time.monotonic() - started
    finally:
        apiserver.send_signal(signal.SIGCONT)
    assert code == 1, (follow.out, follow.err)
    (line,) = follow.err
    # Merged, either pod's stream may be the first to find the server silent.
    pods = (master,) if one_pod else (master, worker)
    assert line.startswith(
        tuple(f"error: reading the logs of pod {p}: the API server at " for p in pods)
    ), line
    assert "stopped answering (no answer within 10 s after 15 s without a line)" in line, line
    assert "run the command again" in line
    assert took < 60


def test_a_follow_of_pods_not_started_ends_when_the_api_server_stops_answering(
    control_plane, kube_cli, admin, namespace, kubelet
):
    # Found by the fourth hostile pass (left open then): with no stream open (the pods
    # Pending) the watch's timeout was a warning and `logs -f` ended, exit 0.
    out = kube_cli("up", "--image", IMAGE, "--name", "j", "-n", namespace, "--no-wait")
    assert out.returncode == 0, out.stderr
    create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)
    follow = Follow(control_plane, namespace)
    # Past connecting (under load a fixed sleep was not), then its watches' lists are open.
    waiting = "waiting for pod(s) j-worker-0 (Pending)"
    deadline = time.monotonic() + 90
    while not any(line.startswith(waiting) for line in follow.err):
        assert time.monotonic() < deadline and follow.proc.poll() is None, follow.err
        follow._take(0.1)
    time.sleep(2)
    (apiserver,) = [p for p in control_plane.procs if p.args[0] == control_plane.apiserver_bin]
    apiserver.send_signal(signal.SIGSTOP)
    try:
        code = follow.finish(timeout=120)
    finally:
        apiserver.send_signal(signal.SIGCONT)
    assert code == 1, (follow.out, follow.err)
    assert "cannot reach the Kubernetes API" in follow.err[-1]
    assert follow.err[-1].endswith("; stopped following")


# Found by the sixth hostile pass: `logs` interrupted mid-read (the kubelet slow to answer)
# ended with no line at all, and exit 130 for SIGTERM too.
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    "follow, more",
    [(False, ()), (True, ()), (False, ("--index", "0"))],
    ids=["merged", "followed", "index"],
)
def test_an_interrupted_read_says_so_with_the_signals_code(
    control_plane, namespace, kubelet, job, sig, follow, more
):
    for pod in job:
        kubelet.set_log(pod, "[rank0]:x\n" * 100)
    kubelet.delay = 5  # the read is under way, waiting for the first byte
    reader = Follow(control_plane, namespace, *more, follow=follow)
    time.sleep(3)
    reader.proc.send_signal(sig)
    assert reader.finish(timeout=30) == 128 + sig
    assert reader.err == [ABORTED % sig.name]
