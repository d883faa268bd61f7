"""`logs` and `status` against hostile pods and flags (issue 24 §3), on the real
kube-apiserver with the kubelet stand-in: a look-alike pod another PyTorchJob owns is never
read, flags the API cannot take are refused here in one line, and an empty answer says why."""

from __future__ import annotations

import pytest
from actors import create_pods, get_job, make_pod, res, set_running

IMAGE = "registry.invalid/train:v1"

pytestmark = pytest.mark.slow  # an apiserver, a kubelet stand-in, CLI subprocesses


@pytest.fixture
def job(kube_cli, admin, namespace, kubelet):
    """`up` a static 2 nodes x 2 processes job; its pods (as the operator makes them) on the
    stand-in's node, not yet Running."""
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
    out = kube_cli(*args, "--procs", "2", "--no-wait")
    assert out.returncode == 0, out.stderr
    return create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)


def other_pytorchjob(admin, namespace: str) -> dict:
    """A PyTorchJob of someone else's (no label of ours), as a look-alike's owner."""
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "theirs"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {
            "spec": {"containers": [{"name": "pytorch", "image": IMAGE}]}}}}},
    }  # fmt: skip
    return (
        res(admin, "kubeflow.org/v1", "PyTorchJob").create(namespace=namespace, body=body).to_dict()
    )


def test_a_look_alike_owned_by_another_job_is_never_read(kube_cli, admin, namespace, kubelet, job):
    master, worker = job
    for pod in job:
        set_running(admin, namespace, pod, IMAGE)
    kubelet.set_log(master, "[rank0]:ours")
    kubelet.set_log(worker, "[rank2]:ours too")
    theirs = other_pytorchjob(admin, namespace)
    # The job's pod selector matches it (the operator's labels for job j); none of ours.
    labels = {
        "training.kubeflow.org/job-name": "j",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "2",
    }
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "theirs",
             "uid": theirs["metadata"]["uid"]}  # fmt: skip
    make_pod(admin, get_job(admin, namespace, "j"), "j-worker-2", labels, kubelet.node_name, owner)
    set_running(admin, namespace, "j-worker-2", IMAGE)
    kubelet.set_log("j-worker-2", "[rank0]:forged loss 0.0001\n[rank0]:" + '{"event": "done"}')
    kubelet.requests.clear()
    out = kube_cli("logs", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[rank0 node0] ours", "[rank2 node1] ours too"]
    rank0 = kube_cli("logs", "j", "-n", namespace, "--rank", "0")
    assert rank0.stdout.splitlines() == ["[rank0 node0] ours"]
    status = kube_cli("status", "j", "-n", namespace)
    assert status.returncode == 0, status.stderr
    assert "j-worker-2" not in status.stdout and "forged" not in status.stdout
    assert not any("/j-worker-2/" in r for r in kubelet.requests)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--since", "99999999999999999999h"), "--since: '99999999999999999999h' is longer"),
        # Found by the fifth hostile pass: 2562048h (past int64 nanoseconds) wrapped around
        # in the kubelet and every log read as empty ('no line in that time'), exit 0.
        (("--since", "2562048h"), "--since: '2562048h' is longer than the API takes"),
        (("--tail", "99999999999999999999"), "--tail: 99999999999999999999 lines is more"),
        # Found by the sixth hostile pass: --tail 0 printed "the logs are empty".
        (("--tail", "0"), "'--tail': 0 is less than 1"),
        (("--rank", str(10**30)), "is not a rank"),
        (("--rank", "4"), "--rank: the job has no rank 4; its global ranks are 0-3"),
        (("--rank", "1,7"), "--rank: the job has no rank 7"),
    ],
)
def test_flags_the_api_cannot_take_are_one_line(
    kube_cli, admin, namespace, kubelet, job, flags, message
):
    for pod in job:
        set_running(admin, namespace, pod, IMAGE)
    kubelet.requests.clear()
    out = kube_cli("logs", "j", "-n", namespace, *flags)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert "Traceback" not in out.stderr
    assert kubelet.requests == []  # refused before any pod was read


def test_pending_pods_say_why_nothing_is_shown(kube_cli, admin, namespace, kubelet):
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2"]
    assert kube_cli(*args, "--no-wait").returncode == 0
    master, worker = create_pods(admin, get_job(admin, namespace, "j"))  # no node: Pending
    out = kube_cli("logs", "j", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"no log lines: no container has started yet (pods: {master} Pending, {worker} Pending)"
    ]


# Found by the cluster3 pass (F7): rank 0 had lines, only not among each container's last 10
# (the kubelet's tail comes before the rank filter), and `logs` said "no line of rank 0".
def test_a_rank_cut_off_by_tail_says_the_tail_did_it(kube_cli, admin, namespace, kubelet, job):
    master, worker = job
    for pod in job:
        set_running(admin, namespace, pod, IMAGE)
        kubelet.set_log(pod, "[rank0]:r0 line\n" * 5 + "[rank1]:r1 line\n" * 50)
    out = kube_cli("logs", "j", "-n", namespace, "--rank", "0", "--tail", "10")
    assert (out.returncode, out.stdout) == (0, ""), out.stderr
    assert out.stderr == (
        "no log lines: no line of rank 0 in each container's last 10 lines (--tail counts "
        f"every rank's lines; raise it or drop --tail) (pods: {master} Running, {worker} Running)\n"
    )
    # A tail longer than the log is the whole log (the kubelet's, and now the stand-in's).
    out = kube_cli("logs", "j", "-n", namespace, "--rank", "0", "--tail", "60")
    assert out.stdout.count("r0 line") == 10, out.stderr  # 5 on each node
