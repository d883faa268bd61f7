"""A 128-node job against the real apiserver: `up --wait`'s view stays a summary by phase
with the stuck pods named, and `status`, `down` and `list` make the same few requests
whatever the size (label-selected lists, never one request per pod or per job)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from actors import (
    container_status,
    create_pods,
    finish,
    get_job,
    res,
    set_job_conditions,
    set_pod_status,
    start_cli,
    wait_for_job,
)

pytestmark = pytest.mark.slow

IMAGE = "registry.invalid/train:v1"
RUNNING = {"phase": "Running", "containerStatuses": [container_status(IMAGE, {"running": {}})]}


def test_the_wait_view_of_128_pods_is_a_summary(control_plane, admin, namespace):
    args = ["up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "128"]
    proc = start_cli(control_plane.kubeconfig, *args, "--wait", "--timeout", "120s")
    pods = create_pods(admin, wait_for_job(admin, namespace, "j", proc))
    assert len(pods) == 128
    stuck = {"j-worker-7", "j-worker-99"}
    creating = "j-worker-40"
    for pod in pods:
        if pod in stuck:
            continue
        if pod == creating:
            waiting = {"waiting": {"reason": "ContainerCreating", "message": "mounting"}}
            status = {"phase": "Pending", "containerStatuses": [container_status(IMAGE, waiting)]}
            set_pod_status(admin, namespace, pod, status)
        else:
            set_pod_status(admin, namespace, pod, RUNNING)
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Running", "running"))
    time.sleep(3)  # the view shows the state above (at most every 0.5 s, and every 2 s)
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Succeeded", "done"))
    code, _, err = finish(proc)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[-1] == "PyTorchJob j succeeded: done"
    # The last view before the end: the phase counts, then the pods not running, named.
    blocks = [i for i, line in enumerate(lines) if line.startswith("j: Running (125/128")]
    assert blocks, err
    block = lines[blocks[-1] :]
    block = block[: next(i for i, line in enumerate(block[1:], 1) if not line.startswith("  "))]
    assert block[1] == "  3 Pending, 125 Running", block
    named = [re.match(r"  (\S+): ", line)[1] for line in block[2:]]  # type: ignore[index]
    assert sorted(named) == sorted([*stuck, creating]), block
    assert "ContainerCreating: mounting" in "\n".join(block)
    # Never a row per pod: no view block is longer than the summary and 16 named pods.
    starts = [i for i, line in enumerate(lines) if not line.startswith("  ")]
    sizes = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert max(sizes) <= 2 + 16, err
    # 128 pods starting one by one are not 128 views: changes are shown at most every 0.5 s.
    assert len(sizes) < 40, err


class Requests:
    """The HTTP requests this process's kubernetes client makes (the real client, counted
    on their way out)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from kubernetes.client import rest

        self.calls: list[str] = []
        original = rest.RESTClientObject.request

        def counted(client, method, url, *args, **kwargs):
            self.calls.append(f"{method} {url.split('?')[0]}")
            return original(client, method, url, *args, **kwargs)

        monkeypatch.setattr(rest.RESTClientObject, "request", counted)

    @contextlib.contextmanager
    def during(self) -> Iterator[list[str]]:
        self.calls.clear()
        yield self.calls


@pytest.fixture
def cli(control_plane, tmp_path: Path, monkeypatch, capsys):
    """`ddpdeploy ARGS` in this process (its own cost, without Python's start-up)."""
    from ddpdeploy.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def run(*args: str) -> tuple[int, float, str]:
        start = time.perf_counter()
        try:
            main([*args, "--kubeconfig", str(control_plane.kubeconfig)])
        except SystemExit as exc:
            code = int(exc.code or 0)
        took = time.perf_counter() - start
        out = capsys.readouterr()
        return code, took, out.out + out.err

    return run


def _job_with_pods(kube_cli, admin, namespace: str, name: str, nodes: int) -> None:
    args = ["up", "--image", IMAGE, "--name", name, "-n", namespace, "--nodes", str(nodes)]
    out = kube_cli(*args, "--no-wait")
    assert out.returncode == 0, out.stderr
    for pod in create_pods(admin, get_job(admin, namespace, name)):
        set_pod_status(admin, namespace, pod, RUNNING)


def test_status_and_down_cost_the_same_at_2_and_128_nodes(
    kube_cli, admin, namespace, cli, monkeypatch
):
    _job_with_pods(kube_cli, admin, namespace, "small", 2)
    _job_with_pods(kube_cli, admin, namespace, "big", 128)
    requests = Requests(monkeypatch)
    cli("status", "small", "-n", namespace)  # the discovery cache warm, as a user has it
    counts: dict[str, list[str]] = {}
    for name in ("small", "big"):
        for verb in ("status", "down"):
            with requests.during() as calls:
                code, took, out = cli(verb, name, "-n", namespace)
            assert code == 0, out
            assert took < 1.0, f"{verb} {name} took {took:.2f}s"
            counts[f"{verb} {name}"] = list(calls)
    assert counts["status big"] == [c.replace("small", "big") for c in counts["status small"]]
    assert counts["down big"] == [c.replace("small", "big") for c in counts["down small"]]
    # One list of the pods, by label; beyond it only the logs that find rank 0 (c10d, the
    # default: at most two pods' heads, in the order c10d ranks them; the pods here log
    # nothing, as the API server answers for a pod on no node), then the tail of the one
    # likeliest to hold it, whose head is not read again; never a request per pod.
    pod_calls = [c for c in counts["status big"] if "/pods" in c and not c.endswith("/log")]
    assert len(pod_calls) == 1 and pod_calls[0].endswith(f"/namespaces/{namespace}/pods")
    log_calls = [c.rsplit("/", 2)[-2] for c in counts["status big"] if c.endswith("/log")]
    assert log_calls == ["big-worker-0", "big-worker-1", "big-worker-0"], log_calls
    assert len(counts["status big"]) <= 6, counts["status big"]
    assert len(counts["down big"]) <= 6, counts["down big"]  # never a request per pod


def test_list_of_200_jobs_is_one_list_call_per_kind(
    admin, namespace, cli, monkeypatch, tmp_path: Path
):
    from ddpdeploy.cluster.saved import with_saved_spec
    from ddpdeploy.commands.options import spec_from_flags
    from ddpdeploy.targets import render_objects

    file = tmp_path / "ddpdeploy.yaml"
    file.write_text("nodes: 2\n")
    jobs = res(admin, "kubeflow.org/v1", "PyTorchJob")
    for i in range(200):
        given = {"--image": IMAGE, "--name": f"l{i}", "--namespace": namespace}
        spec = spec_from_flags(file, given)
        objs = with_saved_spec(render_objects(spec), spec)
        job = next(o for o in objs if o["kind"] == "PyTorchJob")
        jobs.create(namespace=namespace, body=job)
    requests = Requests(monkeypatch)
    cli("list", "-n", namespace)  # the discovery cache warm
    with requests.during() as calls:
        code, took, out = cli("list", "-n", namespace, "-o", "json")
    assert code == 0, out
    assert out.count('"name": "l') == 200
    # One list per kind the cluster serves (PyTorchJob, TrainJob, Job) and one of their pods
    # (a job's state is the one `status` gives it), nothing else.
    assert len(calls) == 4 and len(set(calls)) == 4, calls
    assert calls[-1].endswith(f"/api/v1/namespaces/{namespace}/pods"), calls
    assert all(c.startswith("GET ") and f"/namespaces/{namespace}/" in c for c in calls), calls
    assert took < 2.0, took


def test_a_missing_kind_costs_one_request_and_a_new_crd_is_still_found(
    control_plane, monkeypatch, tmp_path: Path
):
    """Looking up a kind the discovery cache lacks asks for its group version alone (not
    every group again); a CRD installed after the cache was written is found all the same."""
    import yaml

    from ddpdeploy.adapters.kube import Kube

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    Kube(str(control_plane.kubeconfig)).has_kind("v1", "Pod")  # writes the discovery cache
    requests = Requests(monkeypatch)
    kube = Kube(str(control_plane.kubeconfig))
    with requests.during() as calls:
        assert not kube.has_kind("nothing.example.com/v1", "Nothing")
        assert not kube.has_kind("nothing.example.com/v1", "Nothing")  # known by now
    assert [c.rsplit("/", 3)[-3:] for c in calls] == [["apis", "nothing.example.com", "v1"]]
    group = f"g{tmp_path.name.replace('_', '').lower()[-20:]}.example.com"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(crd))
    control_plane.install_crd(path)
    assert Kube(str(control_plane.kubeconfig)).has_kind(f"{group}/v1", "Widget")
