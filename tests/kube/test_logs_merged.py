"""`logs` and `status` against the real kube-apiserver, reading pod logs through it from
the kubelet stand-in (kubelet.py), with the output of a real 2 nodes x 2 processes run
(fixtures/README.md): the merge by global rank and node, the c10d case, the filters,
previous containers, follow, rank 0's progress, and hostile or failing logs."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from actors import container_status, create_pods, finish, get_job, set_pod_status, start_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures"
IMAGE = "registry.invalid/train:v1"
ESC = "\x1b"

pytestmark = pytest.mark.slow  # an apiserver, a kubelet stand-in, CLI subprocesses


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def last_line(name: str) -> str:
    return fixture(name).splitlines()[-1].removeprefix("[rank0]:")


def running(admin, namespace: str, pod: str, restarts: int = 0) -> None:
    state = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    status = {"phase": "Running", "containerStatuses": [container_status(IMAGE, state, restarts)]}
    set_pod_status(admin, namespace, pod, status)


@pytest.fixture
def job(kube_cli, admin, namespace, kubelet):
    """`up` a 2-node job (static unless told), its pods on the stand-in's node, Running."""

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
        assert f"[rank{rank} node{node}] worker up: rank {rank}, local rank {local}, host vm" in lines
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
    since_bad = kube_cli("logs", "j", "-n", namespace, "--since", "ten")
    assert since_bad.returncode == 2 and "--since: 'ten' is not a duration" in since_bad.stderr
