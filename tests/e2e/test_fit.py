"""Fast tests of what the e2e tier found missing (no cluster here; the e2e tests prove the
same on the real one): the `--cpu` and `--memory` spec flags, `up`'s CPU and memory fit
check (ddpdeploy.cluster.capacity's math, the preflight's one line), and rank 0's pod of a
finished c10d job."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: cli_runner, fakekube
from cli_runner import run_cli  # noqa: E402
from fakekube import FakeKube  # noqa: E402

from ddpdeploy.cluster import apply as deploy  # noqa: E402
from ddpdeploy.cluster.capacity import fit, pod_requests, shown  # noqa: E402
from ddpdeploy.cluster.saved import with_saved_spec  # noqa: E402
from ddpdeploy.cluster.watch import rank0_pod  # noqa: E402
from ddpdeploy.commands.options import spec_from_flags  # noqa: E402
from ddpdeploy.errors import OperationError  # noqa: E402
from ddpdeploy.spec import JobSpec  # noqa: E402
from ddpdeploy.targets import render_objects  # noqa: E402

GiB = 1 << 30


def pod_resources(flags: dict[str, Any]) -> dict[str, Any]:
    spec = spec_from_flags(None, {"--image": "r.invalid/t:1", **flags})
    job = render_objects(spec)[-1]
    (replica,) = job["spec"]["pytorchReplicaSpecs"].values()
    return replica["template"]["spec"]["containers"][0]["resources"]


def test_cpu_and_memory_flags_set_the_pods_requests() -> None:
    assert pod_resources({"--procs": 2}) == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"memory": "8Gi"},
    }
    assert pod_resources({"--procs": 2, "--cpu": "400m", "--memory": "1536Mi"}) == {
        "requests": {"cpu": "400m", "memory": "1536Mi"},
        "limits": {"memory": "1536Mi"},
    }


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--cpu", "0"], "error: --cpu: '0' must be greater than zero"),
        (["--cpu", "lots"], "error: --cpu: 'lots' is not a Kubernetes quantity"),
        (["--memory", "16"], "error: --memory: '16' is 16 bytes; give a unit, e.g. 16Gi"),
    ],
)
def test_a_bad_cpu_or_memory_flag_is_one_line_naming_it(
    flags: list[str], error: str, tmp_path: Path
) -> None:
    res = run_cli("render", "--image", "r.invalid/t:1", *flags, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().startswith(error), res.stderr


def test_compose_keeps_its_own_cpu_switch(tmp_path: Path) -> None:
    """compose's --cpu/--gpu picks the devices; the spec flag --cpu (a pod's CPU request,
    nothing to a compose project) is not taken there."""
    res = run_cli("compose", "--image", "r.invalid/t:1", "--gpus", "2", "--cpu", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "nvidia" not in res.stdout
    res = run_cli("compose", "--image", "r.invalid/t:1", "--memory", "2Gi", cwd=tmp_path)
    assert res.returncode == 0, res.stderr


# ---- the capacity math ---------------------------------------------------------------------


def node(name: str = "n1", cpu: str | None = "2", memory: str | None = "8Gi", **spec: Any) -> Any:
    alloc = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    labels = spec.pop("labels", {})
    meta = {"name": name, "labels": labels}
    return {"kind": "Node", "metadata": meta, "spec": spec, "status": {"allocatable": alloc}}


def bound(node_name: str, cpu: str, phase: str = "Running") -> Any:
    container = {"name": "c", "resources": {"requests": {"cpu": cpu}}}
    return {"spec": {"nodeName": node_name, "containers": [container]}, "status": {"phase": phase}}


WANT = {"cpu": Decimal(2), "memory": Decimal(8 * GiB)}


def test_pod_requests_count_containers_summed_and_the_largest_init_container() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"resources": {"limits": {"cpu": "250m", "memory": "512Mi"}}},  # limit = request
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
    }
    assert pod_requests(spec) == {"cpu": Decimal(2), "memory": Decimal(GiB + GiB // 2)}


def test_two_pods_of_two_cores_do_not_fit_one_two_core_node() -> None:
    got = fit([node(memory="64Gi")], WANT, 2)
    assert (got.nodes, got.pods, got.short) == (1, 1, ("cpu",))
    assert fit([node(memory="64Gi"), node("n2", memory="64Gi")], WANT, 2).pods == 2
    small = {"cpu": Decimal("0.4"), "memory": Decimal(1536 << 20)}
    assert fit([node()], small, 2).pods == 5  # cpu 2 / 0.4 = 5, memory 8Gi / 1.5Gi = 5


def test_what_runs_now_counts_only_for_the_warning() -> None:
    small = {"cpu": Decimal(1), "memory": Decimal(GiB)}
    pods = [bound("n1", "1500m"), bound("n1", "2", phase="Succeeded"), bound("", "2")]
    got = fit([node()], small, 2, pods=pods)
    assert (got.pods, got.pods_now) == (2, 0)
    assert fit([node()], small, 2).pods_now is None


def test_unschedulable_unselected_and_unreported_nodes() -> None:
    assert fit([node(unschedulable=True)], WANT, 1).nodes == 0
    selected = fit([node(labels={"pool": "a"}), node("n2")], WANT, 1, {"pool": "a"})
    assert selected.nodes == 1
    # A node that reports no cpu (a fake, a virtual node) does not limit by cpu.
    assert fit([node(cpu=None, memory="64Gi")], WANT, 4).pods == 8
    assert fit([node(cpu=None, memory=None)], WANT, 4).short == ()


def test_amounts_are_shown_as_people_write_them() -> None:
    assert shown("cpu", Decimal("0.400")) == "0.4"
    assert shown("cpu", Decimal(2)) == "2"
    assert shown("memory", Decimal(1536 << 20)) == "1.5Gi"
    assert shown("memory", Decimal(512 << 20)) == "512Mi"


# ---- the preflight -------------------------------------------------------------------------


def preflight(kube: FakeKube, **doc: Any) -> list[str]:
    spec = JobSpec.model_validate(
        {"image": "r.invalid/t:1", "name": "j", "namespace": "ns", "gpus": 0, **doc}
    )
    checked = deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    return checked.warnings


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube()
    fake.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    fake.add({**node(cpu="2", memory="23Gi"), "apiVersion": "v1"})
    return fake


def test_up_refuses_a_job_the_node_cannot_hold_in_one_line(kube: FakeKube) -> None:
    with pytest.raises(OperationError) as err:
        preflight(kube, nodes=2, procs=2)  # the default: a core and 4Gi per process
    line = str(err.value)
    assert line == (
        "2 pod(s) requesting cpu 2, memory 8Gi each do not fit the cluster: the node holds 1; "
        "it has cpu 2, memory 23Gi allocatable; lower --cpu (per node) or --nodes, or add nodes"
    )
    assert not [c for c in kube.calls if c[0] in ("create", "apply")]


def test_up_takes_a_job_that_fits_and_warns_when_the_node_is_busy(kube: FakeKube) -> None:
    assert preflight(kube, nodes=2, procs=2, cpu="400m", memory="1536Mi") == []
    busy = bound("n1", "1800m")
    kube.add({**busy, "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})
    (warning,) = preflight(kube, nodes=2, procs=2, cpu="400m", memory="1536Mi")
    assert warning.startswith("only 0 of the 2 pod(s) requesting cpu 0.4, memory 1.5Gi fit")


def test_memory_alone_is_named_when_it_is_short(kube: FakeKube) -> None:
    with pytest.raises(OperationError, match=r"lower --memory \(per node\) or --nodes"):
        preflight(kube, nodes=1, cpu="1", memory="64Gi")


# ---- rank 0's pod once a c10d job has ended ------------------------------------------------


class Logs:
    def __init__(self, logs: dict[str, list[str]]) -> None:
        self._logs = logs

    def logs(self, pod: str, namespace: str, container: str, **_: Any) -> Any:
        return iter(self._logs[pod])


def test_rank0_of_a_finished_c10d_job_is_the_pod_that_logged_its_start() -> None:
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}, "elasticPolicy": {}},
    }
    pods = [
        {"metadata": {"name": f"j-worker-{i}"}, "status": {"phase": "Succeeded"}} for i in (0, 1)
    ]
    kube = Logs({"j-worker-0": ["torchrun says hi"], "j-worker-1": ['[rank0]:{"event": "start"}']})
    assert rank0_pod(kube, job, pods) == "j-worker-1"  # type: ignore[arg-type]
    pods[0]["status"]["phase"] = "Pending"  # never started: its log is not read
    assert rank0_pod(Logs({"j-worker-1": []}), job, pods) is None  # type: ignore[arg-type]


# ---- one line for what users hit (jobstate), as the real kubelet reports it ----------------

# The end of a real container's log (the kubelet keeps its last 2 KB as the termination
# message under FallbackToLogsOnError): a flag error on both ranks of a node.
FLAG_ERROR = """[rank1]:ddptrain: error: unrecognized arguments: --bogus-flag 3
[rank0]:usage: ddptrain.py [-h] [--steps N]
[rank0]:ddptrain: error: unrecognized arguments: --bogus-flag 3
E1202 09:40:01.529000 1 torch/distributed/elastic/multiprocessing/api.py:1002] failed
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 6, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/opt/ddpdeploy/train/ddptrain.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_09:40:01
  host      : crash-worker-0
  rank      : 1 (local_rank: 1)
  exitcode  : 2 (pid: 12)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_09:40:01
  host      : crash-worker-0
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 11)
============================================================
"""


def crashing(message: str, reason: str = "Error", code: int = 1) -> Any:
    term = {"exitCode": code, "reason": reason, "message": message}
    status = {
        "name": "pytorch",
        "restartCount": 2,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
        "lastState": {"terminated": term},
    }
    container = {"name": "pytorch", "resources": {"limits": {"memory": "150Mi"}}}
    return {
        "metadata": {"name": "j-worker-0"},
        "spec": {"containers": [container]},
        "status": {"phase": "Running", "containerStatuses": [status]},
    }


PYTORCHJOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "j", "namespace": "ns"},
    "status": {"conditions": [{"type": "Running", "status": "True"}]},
}


def test_a_crash_loop_names_the_root_cause_ranks_own_last_line() -> None:
    from ddpdeploy.cluster.jobstate import crash_line, job_state

    assert (
        crash_line(FLAG_ERROR) == "rank 0: ddptrain: error: unrecognized arguments: --bogus-flag 3"
    )
    state = job_state(PYTORCHJOB, [crashing(FLAG_ERROR)])
    assert (state.state, state.done) == ("CrashLoopBackOff", True)
    assert state.reason == (
        "pod j-worker-0: container pytorch restarted 2 times, last exit code 1 (Error): "
        "rank 0: ddptrain: error: unrecognized arguments: --bogus-flag 3"
    )
    # No summary (cut off, or torchrun never started): the last rank line, else the last line.
    assert crash_line("[rank3]:boom\n[rank1]:ValueError: x\nE agent\n") == "rank 1: ValueError: x"
    assert crash_line("ddpdeploy: j-worker-0 did not resolve within 900s\n") == (
        "ddpdeploy: j-worker-0 did not resolve within 900s"
    )
    assert crash_line("") is None
    # torch's own prefix of an uncaught exception's lines is not repeated after ours.
    assert crash_line("[rank1]:[rank1]: ValueError: x\n") == "rank 1: ValueError: x"
    # Found by the cluster2 pass: a rank that printed only prefixes gave the raw "[rank1]:".
    assert crash_line("[rank1]:[rank1]: \n[rank1]:\n") is None
    state = job_state(PYTORCHJOB, [crashing("[rank1]:[rank1]: \n[rank1]:\n")])
    assert (
        state.reason
        == "pod j-worker-0: container pytorch restarted 2 times, last exit code 1 (Error)"
    )
    # Lines end at newlines, as every other reader splits a log (cluster2 D5).
    assert crash_line("[rank1]:a\u2028b\x0cc\n") == "rank 1: a\u2028b\x0cc"


def test_a_crash_line_gives_a_partial_lines_next_rank_its_own_line() -> None:
    from ddpdeploy.cluster.jobstate import crash_line

    # torchrun's tee writes rank 3's last write without its newline; rank 1's error line
    # runs on from it, and is rank 1's own.
    message = "[rank3]:loading[rank1]:ddptrain: error: x\nE agent\n"
    assert crash_line(message) == "rank 1: ddptrain: error: x"
    summary = "  rank      : 3 (local_rank: 1)\n  exitcode  : 1 (pid: 7)\n"
    assert crash_line(message + summary) == "rank 3: loading"


ROOT_CAUSE_SIGSEGV = (
    "Traceback (most recent call last):\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    "Failures:\n  <NO_OTHER_FAILURES>\n"
    "Root Cause (first observed failure):\n[0]:\n  time      : 2026-01-01_00:00:00\n"
    "  rank      : 1 (local_rank: 1)\n  exitcode  : -11 (pid: 9)\n"
    "  traceback : Signal 11 (SIGSEGV) received by PID 9\n"
)


def test_a_silent_root_cause_is_named_not_another_ranks_line() -> None:
    from ddpdeploy.cluster.jobstate import crash_line, job_state

    # Found by the cluster3 pass (F2): rank 1 segfaulted without a line; rank 0's
    # "Connection closed by peer" (its consequence) was shown as the cause.
    message = "[rank0]:[rank0]: RuntimeError: Connection closed by peer\n" + ROOT_CAUSE_SIGSEGV
    silent = (
        "rank 1 (root cause) exited with SIGSEGV (-11) and printed nothing in the log's last 2 KB"
    )
    # Rank 0's line is shown as what it is, the last rank line there, never as the cause.
    context = "; the last rank line there is rank 0's: RuntimeError: Connection closed by peer"
    assert crash_line(message) == silent + context
    state = job_state(PYTORCHJOB, [crashing(message)])
    assert state.reason.endswith("last exit code 1 (Error): " + silent + context)
    assert "rank 0: " not in state.reason
    exited = message.replace("-11 (pid", "3 (pid")
    assert crash_line(exited) == silent.replace("SIGSEGV (-11)", "exit code 3") + context
    assert crash_line(ROOT_CAUSE_SIGSEGV) == silent  # no rank printed a line
    # The root cause's own line, when it has one, is still the line shown.
    assert crash_line("[rank1]:[rank1]: ValueError: x\n" + message) == "rank 1: ValueError: x"


def test_an_oom_kill_loop_says_so_with_the_limit() -> None:
    from ddpdeploy.cluster.jobstate import job_state

    state = job_state(PYTORCHJOB, [crashing("", reason="OOMKilled", code=137)])
    assert (state.state, state.done) == ("OOMKilled", True)
    assert state.reason == (
        "pod j-worker-0: container pytorch went over its memory limit (150Mi) and was killed "
        "(restarted 2 times); raise --memory (per node: request and limit)"
    )


def test_a_deleted_pod_held_by_a_finalizer_is_named_once_its_containers_stopped() -> None:
    from ddpdeploy.cluster.jobstate import job_state, pod_view
    from ddpdeploy.targets import layout_of

    pod = {
        "metadata": {
            "name": "j-worker-0",
            "deletionTimestamp": "2026-12-02T09:40:00Z",
            "finalizers": ["example.com/hold"],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "pytorch", "state": {"running": {}}}],
        },
    }
    assert job_state(PYTORCHJOB, [pod]).state == "Running"  # still in its grace period
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 143}}
    state = job_state(PYTORCHJOB, [pod])
    assert (state.state, state.done) == ("Terminating", True)
    assert "finalizer(s) example.com/hold hold it" in state.reason
    assert "kubectl patch pod j-worker-0" in state.reason
    view = pod_view(pod, layout_of("pytorchjob"))
    assert view.detail == "Terminating (finalizers: example.com/hold)"
    # The 1.20 kubelet removes the dead container: then it shows as waiting, still stopped.
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    assert job_state(PYTORCHJOB, [pod]).state == "Terminating"


def test_a_running_job_whose_container_failed_says_its_last_failure() -> None:
    """Between two back-offs a crash-looping container runs again: the job is Running, and
    the reason carries the last run's failure."""
    from ddpdeploy.cluster.jobstate import job_state

    pod = crashing(FLAG_ERROR)
    pod["status"]["containerStatuses"][0]["state"] = {"running": {}}
    state = job_state(PYTORCHJOB, [pod])
    assert (state.state, state.done) == ("Running", False)
    assert state.reason == (
        "1/1 pods running; pod j-worker-0: container pytorch restarted 2 times, last exit "
        "code 1 (Error): rank 0: ddptrain: error: unrecognized arguments: --bogus-flag 3"
    )
