"""What users hit, on real pods (issue 23 §2f): one line from `up --wait` and from `status`
for an image that is never pulled here, a pod the node has no room for (and the preflight's
warning before it), a crash-looping rank (its own last error line), a memory limit the job
exceeds (OOMKilled), and a pod that will not terminate. Then `collect --debug` after a real
hang (§2d): the built-in trainer's --debug-hang-rank blocks one rank, the hang watchdog
dumps every rank's stacks onto the volume, and collect brings them through the kubelet.

All but the busy node run side by side (small 1-node jobs, one namespace each).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from e2ejob import JOB_NAME_LABEL, apis, cluster_kubectl, job_events, wait_for, write_spec
from realcluster import Cluster, fresh_namespace

# A 1-node job asking little (several run at once on the 2-core node).
TINY = ["--gpus", "0", "--cpu", "100m", "--memory", "1Gi"]
WAIT = ["--wait", "--timeout", "3m"]
HOLD = "ddpdeploy.dev/e2e-hold"


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def title(status: Any) -> str:
    """`status`'s first line: the job's state and its reason (-o json: no table wrapping)."""
    import json

    doc = json.loads(status.stdout)
    return f"{doc['state']}: {doc['reason']}"


def _missing_image(cli: Callable[..., Any], ns: str, image: str) -> dict[str, Any]:
    up = cli("up", "--name", "noimage", "--image", f"{image}-never-built", *TINY, *WAIT, "-n", ns)
    return {"up": up, "status": cli("status", "noimage", "-n", ns, "-o", "json")}


def _crash_loop(cli: Callable[..., Any], ns: str, image: str) -> dict[str, Any]:
    # Both ranks of the node refuse the flag, every time the kubelet starts them again.
    up = cli("up", "--name", "crash", "--image", image, "--procs", "2", *TINY, *WAIT, "-n", ns,
             "--", "--bogus-flag", "3")  # fmt: skip
    return {"up": up, "status": cli("status", "crash", "-n", ns, "-o", "json")}


def _oom(cli: Callable[..., Any], ns: str, image: str) -> dict[str, Any]:
    # torch alone needs more than 150Mi: the kernel kills the container at start-up.
    args = ("--gpus", "0", "--cpu", "100m", "--memory", "150Mi")
    up = cli("up", "--name", "oom", "--image", image, *args, *WAIT, "-n", ns)
    return {"up": up, "status": cli("status", "oom", "-n", ns, "-o", "json")}


def _held(
    cli: Callable[..., Any], ns: str, image: str, cluster: Cluster, folder: Path
) -> dict[str, Any]:
    """A pod a finalizer holds after `down`: the next `up` of the job cannot get its pod."""
    core, _ = apis(cluster)
    spec = {"name": "held", "terminationGracePeriodSeconds": 5}  # SIGKILL 5 s after SIGTERM
    job = ("-f", str(write_spec(folder, spec)), "--image", image, *TINY, "-n", ns)
    train = ("--", "--steps", "100000", "--debug-step-delay", "1")
    first = cli("up", *job, "--no-wait", *train)
    assert first.returncode == 0, first.stderr
    pod = "held-worker-0"
    wait_for(f"{pod} running", lambda: _phase(core, ns, pod) == "Running", 120)
    patch = f'{{"metadata":{{"finalizers":["{HOLD}"]}}}}'
    res = cluster_kubectl(cluster, "patch", "pod", "-n", ns, pod, "--type", "merge", "-p", patch)
    assert res.returncode == 0, res.stderr
    try:
        down = cli("down", "held", "-n", ns)
        assert down.returncode == 0, down.stderr
        wait_for(f"{pod}'s container to stop", lambda: _stopped(core, ns, pod), 120)
        up = cli("up", *job, *WAIT, *train)
        return {"up": up, "status": cli("status", "held", "-n", ns, "-o", "json")}
    finally:  # whatever happened: a held pod would keep its CPU and its namespace
        free = '{"metadata":{"finalizers":null}}'
        cluster_kubectl(cluster, "patch", "pod", "-n", ns, pod, "--type", "merge", "-p", free)


def _hang(cli: Callable[..., Any], ns: str, image: str, cluster: Cluster, out: Path) -> Any:
    """Rank 1 blocks loading step 4's data; the watchdog (5 s) dumps every rank's stacks
    into the checkpoint folder and ends the run; collect --debug brings them."""
    core, _ = apis(cluster)
    spec = write_spec(out.parent / "hang-spec", {"name": "hang", "checkpoint": {"size": "1Gi"}})
    up = cli("up", "-f", str(spec), "--image", image, "--procs", "2", *TINY, "-n", ns,
             "--no-wait", "--", "--steps", "50", "--checkpoint-every", "2",
             "--debug-hang-rank", "1:4", "--hang-timeout-s", "5")  # fmt: skip
    assert up.returncode == 0, up.stderr
    hang = wait_for("the hang event", lambda: job_events(core, ns, "hang", "hang"), 240)
    collect = cli("collect", "hang", "-n", ns, "--from", "cluster", "--debug", "--to", str(out))
    cli("down", "hang", "-n", ns)  # it would hang again after each restart
    return {"hang": hang[0][1], "collect": collect, "out": out}


def _phase(core: Any, ns: str, pod: str) -> str | None:
    try:
        return str(core.read_namespaced_pod(pod, ns).status.phase)
    except Exception:
        return None


def _stopped(core: Any, ns: str, pod: str) -> bool:
    # Terminated, or waiting once the kubelet has removed the dead container: not running.
    statuses = core.read_namespaced_pod(pod, ns).status.container_statuses or []
    return bool(statuses) and not any(s.state.running is not None for s in statuses)


def _busy_node(cli: Callable[..., Any], ns: str, image: str, cluster: Cluster) -> dict[str, Any]:
    """A pod holding most of the node's CPU, then a 2-node job that fits the node when it
    is empty: the preflight warns, one pod runs, the real scheduler keeps the other Pending
    (Unschedulable: Insufficient cpu), and `up --wait` waits on (as the warning says) to its
    --timeout; once the hog is gone the scheduler places the pod."""
    from ddpdeploy.cluster.capacity import pod_requests
    from ddpdeploy.spec import quantity

    core, _ = apis(cluster)
    node = core.list_node().items[0]
    allocatable = quantity(node.status.allocatable["cpu"])[1]
    held = Decimal(0)
    api = cluster.api()
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
            held += pod_requests(api.sanitize_for_serialization(pod.spec))["cpu"]
    hog_cpu = allocatable - held - Decimal("0.5")  # room for one 400m pod, not two
    hog = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hog"},
        "spec": {
            "containers": [
                {
                    "name": "hog",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "600"],
                    "resources": {"requests": {"cpu": f"{int(hog_cpu * 1000)}m"}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    core.create_namespaced_pod(ns, hog)
    wait_for("the hog pod running", lambda: _phase(core, ns, "hog") == "Running", 120)
    up = cli("up", "--name", "busy", "--image", image, "--nodes", "2", "--gpus", "0",
             "--cpu", "400m", "--memory", "512Mi", "--wait", "--timeout", "30s",
             "-n", ns)  # fmt: skip
    status = cli("status", "busy", "-n", ns, "-o", "json")
    core.delete_namespaced_pod("hog", ns, grace_period_seconds=0)

    def placed() -> bool:
        pods = core.list_namespaced_pod(ns, label_selector=f"{JOB_NAME_LABEL}=busy")
        return len(pods.items) == 2 and all(p.spec.node_name for p in pods.items)

    wait_for("both pods of busy placed once the hog is gone", placed, 120, every=1)
    cli("down", "busy", "-n", ns)  # its CPU back for the scenarios that follow
    return {"up": up, "status": status, "hog": str(hog_cpu)}


@pytest.fixture(scope="module")
def failures(
    cluster: Cluster, trainer_image: str, e2e_cli: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    out: dict[str, Any] = {}
    folder = tmp_path_factory.mktemp("failures")
    with contextlib.ExitStack() as stack:

        def ns() -> str:
            return stack.enter_context(fresh_namespace(cluster))

        start = time.monotonic()
        out["busy"] = _busy_node(e2e_cli, ns(), trainer_image, cluster)
        jobs = {
            "image": (_missing_image, (e2e_cli, ns(), trainer_image)),
            "crash": (_crash_loop, (e2e_cli, ns(), trainer_image)),
            "oom": (_oom, (e2e_cli, ns(), trainer_image)),
            "held": (_held, (e2e_cli, ns(), trainer_image, cluster, folder / "held")),
            "hang": (_hang, (e2e_cli, ns(), trainer_image, cluster, folder / "hang")),
        }
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            futures = {k: pool.submit(fn, *args) for k, (fn, args) in jobs.items()}
            for key, future in futures.items():
                try:
                    out[key] = future.result()
                except Exception as exc:  # shown by the test that reads it
                    out[key] = exc
        print(f"\nfailure scenarios done in {time.monotonic() - start:.0f}s")
        yield out


def _got(failures: dict[str, Any], key: str) -> dict[str, Any]:
    got = failures[key]
    if isinstance(got, BaseException):
        raise got
    return dict(got)


def test_a_missing_image(failures: dict[str, Any]) -> None:
    got = _got(failures, "image")
    up = got["up"]
    assert up.returncode == 1, up.stderr
    line = last_line(up.stderr)
    assert line.startswith("error: PyTorchJob noimage ErrImagePull: pod noimage-worker-0: "), line
    assert "cannot pull image ddpdeploy-test/" in line and "-never-built" in line, line
    assert title(got["status"]).startswith(("ErrImagePull: pod", "ImagePullBackOff: pod"))


def test_a_pod_the_node_has_no_room_for(failures: dict[str, Any]) -> None:
    got = _got(failures, "busy")
    up = got["up"]
    assert up.returncode == 1, up.stderr
    assert "warning: only 1 of the 2 pod(s) requesting cpu 0.4, memory 512Mi fit beside" in (
        up.stderr
    ), up.stderr
    line = last_line(up.stderr)
    assert line.startswith("error: timed out after 30s waiting for PyTorchJob "), line
    assert "it is Unschedulable (pod busy-worker-" in line and "Insufficient cpu" in line, line
    assert title(got["status"]).startswith("Unschedulable: pod busy-worker-")


def test_a_crash_looping_rank_says_its_own_error(failures: dict[str, Any]) -> None:
    got = _got(failures, "crash")
    up = got["up"]
    assert up.returncode == 1, up.stderr
    line = last_line(up.stderr)
    assert line.startswith("error: PyTorchJob crash CrashLoopBackOff: pod crash-worker-0: "), line
    # Both ranks fail alike; torchrun's summary names the one that failed first.
    # (When the root cause's own line is not in the 2 KB the kubelet keeps, the last rank
    # line there is shown as such: "…; the last rank line there is rank 0's: ddptrain: …".)
    assert re.search(
        r"(: rank [01]|rank [01]'s): ddptrain: error: unrecognized arguments: --bogus-flag 3;", line
    ), line
    # `status` a moment later: CrashLoopBackOff, or Running again between two back-offs,
    # with the last run's line either way.
    shown = title(got["status"])
    assert shown.startswith(("CrashLoopBackOff: pod crash-worker-0", "Running: ")), shown
    assert "ddptrain: error: unrecognized arguments: --bogus-flag 3" in shown, shown


def test_a_memory_limit_the_job_exceeds(failures: dict[str, Any]) -> None:
    got = _got(failures, "oom")
    up = got["up"]
    assert up.returncode == 1, up.stderr
    line = last_line(up.stderr)
    assert line.startswith("error: PyTorchJob oom OOMKilled: pod oom-worker-0: container "), line
    assert "memory limit (150Mi)" in line and "raise --memory" in line, line
    shown = title(got["status"])
    assert shown.startswith(("OOMKilled: pod oom-worker-0", "Running: ")), shown
    assert "OOMKilled" in shown, shown


def test_a_pod_that_will_not_terminate(failures: dict[str, Any]) -> None:
    got = _got(failures, "held")
    up = got["up"]
    assert up.returncode == 1, up.stderr
    line = last_line(up.stderr)
    assert line.startswith("error: PyTorchJob held Terminating: pod held-worker-0 was deleted"), (
        line
    )
    assert f"finalizer(s) {HOLD} hold it" in line, line
    assert title(got["status"]).startswith("Terminating: pod held-worker-0")


def test_collect_debug_after_a_real_hang(failures: dict[str, Any]) -> None:
    got = _got(failures, "hang")
    assert got["hang"]["step"] == 4, got["hang"]  # rank 1 hangs loading step 4's data
    collect = got["collect"]
    assert collect.returncode == 0, collect.stdout + collect.stderr
    said = collect.stdout + collect.stderr
    assert "debug: 2 hang stacks" in said, said
    stacks = sorted((got["out"] / "debug").glob("hang-rank*.txt"))
    assert [p.name for p in stacks] == ["hang-rank0.txt", "hang-rank1.txt"]
    assert "ddptrain" in stacks[1].read_text()
