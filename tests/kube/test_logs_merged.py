"""`logs` and `status` against the real kube-apiserver, reading pod logs through it from
the kubelet stand-in (kubelet.py), with the output of a real 2 nodes x 2 processes run
(fixtures/README.md): the merge by global rank and node, the c10d case, the filters,
previous containers, follow, rank 0's progress, and hostile or failing logs."""

from __future__ import annotations

import json
import queue
import signal
import threading
import time
from pathlib import Path

import pytest
from actors import (
    container_status,
    create_pods,
    finish,
    get_job,
    set_job_conditions,
    set_pod_status,
    set_running,
    start_cli,
    wait_for_job,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
IMAGE = "registry.invalid/train:v1"
ESC = "\x1b"

pytestmark = pytest.mark.slow  # an apiserver, a kubelet stand-in, CLI subprocesses


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def last_line(name: str) -> str:
    return fixture(name).splitlines()[-1].removeprefix("[rank0]:")


def running(admin, namespace: str, pod: str, restarts: int = 0) -> None:
    set_running(admin, namespace, pod, IMAGE, restarts)


@pytest.fixture
def job(kube_cli, admin, namespace, kubelet):
    """`up` a 2-node job (c10d, the default: pods worker-0 and worker-1), its pods on the
    stand-in's node, Running."""

    def make(*more: str, name: str = "j") -> list[str]:
        args = ["up", "--image", IMAGE, "--name", name, "-n", namespace, "--nodes", "2"]
        out = kube_cli(*args, "--procs", "2", "--no-wait", *more)
        assert out.returncode == 0, out.stderr
        pods = create_pods(admin, get_job(admin, namespace, name), node=kubelet.node_name)
        for pod in pods:
            running(admin, namespace, pod)
        return pods

    return make


def test_logs_merge_every_rank_of_a_2x2_run(kube_cli, namespace, kubelet, job):
    master, worker = job()
    t0 = time.time() - 60  # node 1 writes each of its lines half a second after node 0's
    kubelet.set_log(master, fixture("run2x2-node0.log"), at=t0, every=1.0)
    kubelet.set_log(worker, fixture("run2x2-node1.log"), at=t0 + 0.5, every=1.0)
    out = kube_cli("logs", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for rank, node, local in ((0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)):
        up = f"worker up: rank {rank}, local rank {local}, host vm"
        assert f"[rank{rank} node{node}] {up}" in lines
        assert f"[rank{rank} node{node}] warning: rank {rank} has no GPU, using gloo" in lines
    assert "[rank0 node0] " + last_line("run2x2-node0.log") in lines
    # The agents' own lines (torchrun's banner) carry no rank: their node's.
    assert lines.count("[node0] *****************************************") == 2
    assert lines.count("[node1] *****************************************") == 2
    assert len(lines) == sum(len(fixture(f"run2x2-node{n}.log").splitlines()) for n in (0, 1))
    # Merged in the order written (the kubelet's timestamps): node 0, node 1, node 0, ...
    short = min(len(fixture(f"run2x2-node{n}.log").splitlines()) for n in (0, 1))
    nodes = [line.split("] ")[0].rsplit("node", 1)[1] for line in lines[: 2 * short]]
    assert nodes == ["0", "1"] * short


def test_c10d_rank0_on_the_second_pod(kube_cli, namespace, kubelet, job):
    # Under c10d the ranks follow join order: here worker-1 joined first and holds 0 and 1.
    first, second = job("--elastic", "1:2")
    assert first.endswith("worker-0") and second.endswith("worker-1")
    kubelet.set_log(first, fixture("run2x2-node1.log"))
    kubelet.set_log(second, fixture("run2x2-node0.log"))
    out = kube_cli("logs", "j", "-n", namespace, "--rank", "0")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines and all(line.startswith("[rank0 node1] ") for line in lines)
    assert "[rank0 node1] worker up: rank 0, local rank 0, host vm" in lines
    both = kube_cli("logs", "j", "-n", namespace, "--rank", "2,1").stdout.splitlines()
    assert {line.split("]")[0] for line in both} == {"[rank2 node0", "[rank1 node1"}
    status = kube_cli("status", "j", "-n", namespace)  # rank 0's pod is found, not assumed
    assert status.returncode == 0, status.stderr
    assert "training: step 6/6 (done)" in status.stdout


# Found by the third hostile pass: on a c10d job, `logs j --index 7`, `--index 0` and
# `--index 1` all printed rank 0's pod's log, exit 0, and `--replica master` (a c10d job has
# Worker replicas only) ended in the API's 404, exit 1.
def test_c10d_index_is_that_nodes_pod_and_a_missing_one_is_refused(
    kube_cli, namespace, kubelet, job
):
    first, second = job()
    kubelet.set_log(first, "[rank2]:on worker-0")
    kubelet.set_log(second, "[rank0]:on worker-1")
    for index, text in ((0, "[rank2]:on worker-0"), (1, "[rank0]:on worker-1")):
        out = kube_cli("logs", "j", "-n", namespace, "--index", str(index))
        assert (out.returncode, out.stdout.splitlines()) == (0, [text]), out.stderr
    beyond = kube_cli("logs", "j", "-n", namespace, "--index", "7")
    assert beyond.returncode == 2 and not beyond.stdout
    assert beyond.stderr.strip().splitlines() == [
        f"error: --index: PyTorchJob {namespace}/j has no node 7; its nodes are 0-1 "
        "(`ddpdeploy status j` lists its pods)"
    ]
    master = kube_cli("logs", "j", "-n", namespace, "--replica", "master")
    assert master.returncode == 2 and not master.stdout
    assert master.stderr.strip().splitlines() == [
        f"error: --replica: PyTorchJob {namespace}/j has worker replicas only (c10d "
        "rendezvous); pass --replica worker, or --index N alone for node N"
    ]
    worker = kube_cli("logs", "j", "-n", namespace, "--replica", "worker", "--index", "1")
    assert worker.stdout.splitlines() == ["[rank0]:on worker-1"]


def test_node_tail_since_and_previous(kube_cli, admin, namespace, kubelet, job):
    master, worker = job()
    hour_ago = time.time() - 3600
    kubelet.set_log(master, fixture("run2x2-node0.log"), at=time.time() - 120)
    kubelet.set_log(worker, "[rank2]:old line\n[rank3]:old too", at=hour_ago)
    kubelet.append(worker, "[rank2]:new line\nagent: new")
    kubelet.requests.clear()
    node1 = kube_cli("logs", "j", "-n", namespace, "--node", "1")
    assert node1.stdout.splitlines() == [
        "[rank2 node1] old line", "[rank3 node1] old too", "[rank2 node1] new line",
        "[node1] agent: new",
    ]  # fmt: skip
    assert all(f"/{worker}/" in r for r in kubelet.requests)  # only node 1's pod was read
    since = kube_cli("logs", "j", "-n", namespace, "--node", "1", "--since", "10m")
    assert since.stdout.splitlines() == ["[rank2 node1] new line", "[node1] agent: new"]
    tail = kube_cli("logs", "j", "-n", namespace, "--tail", "1").stdout.splitlines()
    # Each container's last line, in the order written (the worker's is the newer).
    assert tail == ["[rank0 node0] " + last_line("run2x2-node0.log"), "[node1] agent: new"]
    # A restarted pod: its previous container's log first, marked.
    running(admin, namespace, master, restarts=1)
    kubelet.set_log(master, "[rank0]:before the restart\nagent: restarting", previous=True,
                    at=hour_ago)  # fmt: skip
    out = kube_cli("logs", "j", "-n", namespace, "--node", "0", "--tail", "1")
    assert out.stdout.splitlines() == [
        "[node0 previous] agent: restarting",
        "[rank0 node0] " + last_line("run2x2-node0.log"),
    ]
    bad = kube_cli("logs", "j", "-n", namespace, "--node", "5")
    assert bad.returncode == 2 and "--node: the job has no pod for node 5" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    both = kube_cli("logs", "j", "-n", namespace, "--index", "1", "--rank", "2")
    assert both.returncode == 2 and "--rank" in both.stderr and "--index" in both.stderr
    since_bad = kube_cli("logs", "j", "-n", namespace, "--since", "ten")
    assert since_bad.returncode == 2 and "--since: 'ten' is not a duration" in since_bad.stderr


def test_logs_reads_the_pods_at_once_at_most_16(kube_cli, admin, namespace, kubelet):
    # 20 pods, each log answered 0.3 s late: read one after another, never two at a time.
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "20"]
    assert kube_cli(*args, "--no-wait").returncode == 0
    pods = create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)
    t0 = time.time() - 60
    for pod in pods:
        running(admin, namespace, pod)
        node = int(pod.rsplit("-", 1)[1])  # c10d (the default): worker-N is node N
        # Written in reverse node order: the merge, not the reading, orders the output.
        kubelet.set_log(pod, f"[rank{node}]:hello\nagent: bye", at=t0 + 20 - node, every=0.1)
    kubelet.delay = 0.3
    out = kube_cli("logs", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    hellos = [f"[rank{node} node{node}] hello" for node in range(19, -1, -1)]
    assert out.stdout.splitlines()[::2] == hellos
    assert out.stdout.splitlines()[1::2] == [f"[node{n}] agent: bye" for n in range(19, -1, -1)]
    assert 2 <= kubelet.most_in_flight <= 16


def _wait_for(proc, kubelet, pods: list[str]) -> None:
    """Until ``proc`` (`logs -f`) has a stream open to each of ``pods``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(any(f"/{p}/" in r and "follow=true" in r for r in kubelet.requests) for p in pods):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"logs -f never followed {pods}: {kubelet.requests}")


def _lines_of(proc):
    """A bounded readline of ``proc``'s stdout (a reader thread; 30 s per line)."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(t) for t in proc.stdout], daemon=True).start()
    return lambda: lines.get(timeout=30)


def test_follow_merges_as_lines_come_and_ends_with_the_job(
    control_plane, admin, namespace, kubelet, job
):
    master, worker = job()
    kubelet.set_log(master, "[rank0]:first")
    kubelet.set_log(worker, "[rank2]:second")
    proc = start_cli(control_plane.kubeconfig, "logs", "j", "-n", namespace, "--follow")
    _wait_for(proc, kubelet, [master, worker])
    read = _lines_of(proc)
    first = sorted(read() for _ in range(2))
    assert first == ["[rank0 node0] first\n", "[rank2 node1] second\n"]
    # Each new line shows while the other stream stays open and quiet.
    kubelet.append(worker, "[rank3]:later, on node 1")
    assert read() == "[rank3 node1] later, on node 1\n"
    kubelet.append(master, "agent: later, on node 0")
    assert read() == "[node0] agent: later, on node 0\n"
    kubelet.close_streams()  # the containers exit: every stream ends...
    time.sleep(1.5)
    assert proc.poll() is None  # ...but a container may start again while the job runs
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Succeeded", ""))
    code, out, err = finish(proc)  # the job is final and the streams are drained
    assert code == 0 and out == "", (out, err)


def test_follow_ctrl_c_exits_130_quietly(control_plane, namespace, kubelet, job):
    master, worker = job()
    kubelet.set_log(master, "[rank0]:x")
    kubelet.set_log(worker, "[rank2]:y")
    proc = start_cli(control_plane.kubeconfig, "logs", "j", "-n", namespace, "-f")
    _wait_for(proc, kubelet, [master, worker])
    # The lines shown first: a stream requested is not yet a line printed (under load the
    # signal came before them now and then, with or without the pods' watch).
    read = _lines_of(proc)
    assert sorted(read() for _ in range(2)) == ["[rank0 node0] x\n", "[rank2 node1] y\n"]
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=30)
    err = proc.stderr.read()
    assert code == 130 and err == "aborted (SIGINT); nothing more was done\n", (code, err)


def test_markup_and_escapes_in_a_log_line_are_text(kube_cli, namespace, kubelet, job):
    master, worker = job()
    kubelet.set_log(master, f"[rank0]:[/bold]loss [red]1{ESC}]0;pwned\x07{ESC}[2J done")
    kubelet.set_log(worker, "[rank2]:[rank9]: not a rank of ours")
    out = kube_cli("logs", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "[rank0 node0] [/bold]loss [red]1\N{REPLACEMENT CHARACTER}\N{REPLACEMENT CHARACTER} done",
        "[rank2 node1] [rank9]: not a rank of ours",
    ]


def test_a_pod_whose_log_endpoint_fails_is_one_line(kube_cli, namespace, kubelet, job):
    master, worker = job()
    kubelet.set_log(master, "[rank0]:still shown")
    kubelet.failing[worker] = 500
    out = kube_cli("logs", "j", "-n", namespace)
    assert out.returncode == 1
    assert out.stdout == "[rank0 node0] still shown\n"
    errors = out.stderr.strip().splitlines()
    assert len(errors) == 2 and worker in errors[0] and "the log is gone" in errors[0]
    assert (
        errors[1]
        == f"error: could not read the log of pod {worker}; the other pods' lines are above"
    )


# Found by the fourth hostile pass: with no right to pods/log (a read-only RBAC role on
# the real cluster) every pod failed and the last line still said "the other pods' lines
# are above", where there were none.
def test_no_pod_whose_log_can_be_read_is_said_as_such(kube_cli, namespace, kubelet, job):
    master, worker = job()
    kubelet.failing[master] = kubelet.failing[worker] = 500
    out = kube_cli("logs", "j", "-n", namespace)
    assert out.returncode == 1 and out.stdout == ""
    errors = out.stderr.strip().splitlines()
    assert len(errors) == 3, errors
    both = ", ".join(sorted([master, worker]))
    assert errors[2] == f"error: could not read the log of any pod of the job ({both})"


def test_status_shows_rank0s_progress(kube_cli, namespace, kubelet, job):
    master, worker = job()
    lines = fixture("run2x2-node0.log").splitlines()
    upto = next(i for i, t in enumerate(lines) if '"step": 4,' in t)
    t0 = time.time() - len(lines)
    kubelet.set_log(master, "\n".join(lines[: upto + 1]), at=t0, every=1.0)  # a line a second
    kubelet.set_log(worker, fixture("run2x2-node1.log"))
    out = kube_cli("status", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    # Steps 1-4 came a line (about a second) apart; a step took ~1.33 s, 2 to go.
    assert "training: step 4/6, ETA 3s, loss -1.6, 128.0 samples/s" in out.stdout
    assert "last checkpoint: step 3, " in out.stdout and " ago" in out.stdout
    assert "probe: busbw 0.533 GB/s" in out.stdout
    assert "ranks: step 3: work per step slowest rank 3 (vm) 80.1 ms" in out.stdout
    assert "straggler: rank 3 (vm) 1.6x, rank 2 (vm) 1.2x" in out.stdout
    doc = json.loads(kube_cli("status", "j", "-n", namespace, "-o", "json").stdout)
    training = doc["training"]
    assert (
        training["step"] == 4 and training["total_steps"] == 6 and training["checkpoint_step"] == 3
    )
    assert training["lines"][0].startswith("step 4/6")
    kubelet.set_log(master, fixture("run2x2-node0.log"))
    done = kube_cli("status", "j", "-n", namespace, "-o", "yaml").stdout
    assert "- step 6/6 (done)" in done and done.count("training:") == 1
    assert "run: image registry.example/train:v1, spec 3f5a9c0e1d2b, git 64a6f7540b0a" in done


def test_status_names_a_hang(kube_cli, namespace, kubelet, job):
    master, worker = job()
    kubelet.set_log(master, fixture("hang-node0.log"))
    kubelet.set_log(worker, fixture("hang-node1.log"))
    out = kube_cli("status", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert (
        "hung at step 4 (no step for 3.8 s): ranks that did not arrive: 3 (vm); "
        "stacks of 4 rank(s) in /checkpoints"
    ) in out.stdout


def test_status_without_events_or_a_readable_log(kube_cli, admin, namespace, kubelet, job):
    master, worker = job()
    kubelet.set_log(master, "[rank0]:epoch 1 loss 0.3\n[rank1]:epoch 1 loss 0.3")
    kubelet.set_log(worker, "[rank2]:hi")
    out = kube_cli("status", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert "no training events in rank 0's log (a script without ddpkit.log)" in out.stdout
    kubelet.failing[master] = 500
    broken = kube_cli("status", "j", "-n", namespace)
    assert broken.returncode == 0, broken.stderr
    (line,) = [t for t in broken.stdout.splitlines() if t.startswith("training:")]
    assert "cannot read rank 0's log" in line and master in line
    doc = json.loads(kube_cli("status", "j", "-n", namespace, "-o", "json").stdout)
    assert doc["training"]["error"] == line.removeprefix("training: ")  # said once in JSON


# Found by the third hostile pass: the 1.20 kubelet answers a gone container's log with its
# own error, HTTP 200; `logs` printed it as "[node0 previous] unable to retrieve container
# logs for docker://…" and `status` as the last run's error. It is "log unavailable": one
# stderr line from `logs`; `status` tells the run's end from the pod's lastState instead.
GONE = "unable to retrieve container logs for docker://ec1c" + "0" * 60


def test_a_log_the_kubelet_no_longer_has_is_said_not_shown(
    kube_cli, admin, namespace, kubelet, job
):
    first, second = job()
    flag = "ddptrain: error: unrecognized arguments: --bogus-flag"
    last = {"terminated": {"exitCode": 1, "reason": "Error", "message": flag}}
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    for pod in (first, second):
        status = {"phase": "Running", "containerStatuses": [
            container_status(IMAGE, waiting, 1, last)]}  # fmt: skip
        set_pod_status(admin, namespace, pod, status)
        kubelet.own_error[(pod, "pytorch", True)] = GONE
        kubelet.own_error[(pod, "pytorch", False)] = (
            "rpc error: code = Unknown desc = Error: No such container: ec1c" + "0" * 60 + "\n"
        )
    kubelet.own_error.pop((second, "pytorch", False))
    kubelet.set_log(second, "[rank1]:the run now")
    out = kube_cli("logs", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[rank1 node1] the run now"]
    err = out.stderr.strip().splitlines()
    assert len(err) == 3 and all(" is unavailable (the kubelet: " in t for t in err), err
    assert err[0].startswith(f"[node0 previous] the log of pod {first} (its previous run) ")
    assert err[2].startswith(f"[node0] the log of pod {first} is unavailable")
    one = kube_cli("logs", "j", "-n", namespace, "--index", "0")
    assert one.returncode == 1 and not one.stdout
    assert one.stderr.strip().splitlines() == [
        f"error: the log of pod {first} is unavailable (the kubelet: rpc error: code = "
        "Unknown desc = Error: No such container: ec1c" + "0" * 60 + ")"
    ]
    status = kube_cli("status", "j", "-n", namespace)
    assert status.returncode == 0, status.stderr
    (line,) = [t for t in status.stdout.splitlines() if t.startswith("training:")]
    assert line == (
        "training: restarting (restart 1; the last run ended with exit code 1, Error): " + flag
    )


def test_up_follow_shows_the_probe_line(admin, control_plane, namespace, kubelet):
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
    proc = start_cli(control_plane.kubeconfig, *args, "--follow", "--timeout", "90s")
    pods = create_pods(admin, wait_for_job(admin, namespace, "j", proc), node=kubelet.node_name)
    kubelet.set_log(pods[0], fixture("run2x2-node0.log"))
    kubelet.close_streams()  # the container has exited: the followed log ends after its lines
    for pod in pods:
        running(admin, namespace, pod)
    _wait_for(proc, kubelet, [pods[0]])
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Succeeded", ""))
    code, out, err = finish(proc)
    assert code == 0, err
    assert out.splitlines() == fixture("run2x2-node0.log").splitlines()  # as it is
    assert "probe: busbw 0.533 GB/s; per size: 1 MB 0.137, 4 MB 0.38, 16 MB 0.533" in err
