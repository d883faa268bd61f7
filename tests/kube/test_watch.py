"""`up --wait` watches the job and its pods instead of polling: against the real apiserver,
a change is seen at once, an expired watch lists again, an apiserver that goes away is one
line, and Ctrl-C mid-watch leaves the job as it is."""

from __future__ import annotations

import contextlib
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from actors import (
    Lines,
    create_pods,
    get_job,
    res,
    set_job_conditions,
    set_pod_status,
    start_cli,
)
from netstubs import kubeconfig_via

from ddpdeploy.adapters.kube import Kube
from ddpdeploy.cluster import watch
from ddpdeploy.errors import OperationError

pytestmark = pytest.mark.slow

IMAGE = "registry.invalid/train:v1"


@pytest.fixture
def job(kube_cli, admin, namespace) -> list[str]:
    """A submitted 2-node PyTorchJob `j` with its pods created; returns the pod names."""
    out = kube_cli(
        "up", "--image", IMAGE, "--name", "j", "-n", namespace, "--nodes", "2", "--no-wait"
    )
    assert out.returncode == 0, out.stderr
    return create_pods(admin, get_job(admin, namespace, "j"))


def connect(kubeconfig: Path) -> Kube:
    return Kube(str(kubeconfig))


class Waiting:
    """``watch.wait`` on a thread; the snapshots it shows, as they come."""

    def __init__(self, kube: Kube, namespace: str, **how: object) -> None:
        self.shown: queue.Queue = queue.Queue()
        self.result: dict[str, object] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(kube, namespace, how), daemon=True)
        self.thread.start()

    def _run(self, kube: Kube, namespace: str, how: dict) -> None:
        try:
            self.result["snap"] = watch.wait(kube, "j", namespace, self.shown.put, **how)
        except BaseException as exc:  # handed to the test
            self.result["error"] = exc
        finally:
            self.result["at"] = time.monotonic()
            self.done.set()

    def next_shown(self, timeout: float = 30) -> watch.Snapshot:
        return self.shown.get(timeout=timeout)

    def end(self, timeout: float = 30) -> dict[str, object]:
        assert self.done.wait(timeout), "wait() did not return"
        return self.result


def test_wait_returns_at_once_when_the_job_succeeds(control_plane, admin, namespace, job):
    waiting = Waiting(connect(control_plane.kubeconfig), namespace, interval=30)
    first = waiting.next_shown()
    assert first[2].state == "Pending" and len(first[1]) == 2
    set_pod_status(admin, namespace, job[0], {"phase": "Running"})
    running = waiting.next_shown(timeout=5)  # a pod's change is shown, long before `interval`
    assert running[2].state == "Running", running[2]
    flipped = time.monotonic()
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Succeeded", "done"))
    result = waiting.end()
    took = float(result["at"]) - flipped  # type: ignore[arg-type]
    assert "error" not in result, result
    assert result["snap"][2].ok  # type: ignore[index]
    assert took < 0.5, f"wait took {took:.3f}s to see Succeeded (the old poll: up to 1 s)"


def test_wait_times_out_on_time_with_no_change(control_plane, namespace, job):
    started = time.monotonic()
    waiting = Waiting(connect(control_plane.kubeconfig), namespace, timeout=2.5, interval=1)
    result = waiting.end()
    took = float(result["at"]) - started  # type: ignore[arg-type]
    assert isinstance(result.get("error"), OperationError), result
    assert "timed out after 2.5s" in str(result["error"]) and "Pending" in str(result["error"])
    assert 2.4 <= took < 5, took


def test_an_expired_watch_lists_again(control_plane, admin, namespace, job):
    """A resourceVersion the apiserver no longer has (410 Gone) is a fresh list, not an
    error. Version 1 is older than the PyTorchJob watch cache (started when the CRD was
    installed): the apiserver answers 410 to it."""
    kube = connect(control_plane.kubeconfig)
    stop = threading.Event()
    events = kube.watch("kubeflow.org/v1", "PyTorchJob", namespace, name="j", since="1", stop=stop)
    kind, jobs = next(events)
    assert kind == "SYNC"
    assert [(j["kind"], j["metadata"]["name"]) for j in jobs] == [("PyTorchJob", "j")]
    set_job_conditions(admin, namespace, "j", ("Created", ""), ("Running", "on"))
    kind, got = next(events)  # and it watches on from the new list
    assert kind == "MODIFIED"
    assert [c["type"] for c in got["status"]["conditions"]] == ["Created", "Running"]
    stop.set()
    events.close()


class Cuttable:
    """A TCP proxy to the apiserver whose connections can all be cut at once (the
    apiserver going away, as a client sees it)."""

    def __init__(self, upstream: int) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.upstream = upstream
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.socks += [client, up]
            for src, dst in ((client, up), (up, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)

    def cut(self) -> None:
        self.server.close()
        for sock in self.socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.fixture
def cuttable(control_plane, tmp_path: Path) -> Iterator[tuple[Cuttable, Path]]:
    proxy = Cuttable(control_plane.port)
    try:
        yield proxy, kubeconfig_via(control_plane.kubeconfig, proxy.port, tmp_path / "kubeconfig")
    finally:
        proxy.cut()


def test_the_apiserver_going_away_mid_watch_is_one_line(cuttable, namespace, job, tmp_path):
    proxy, kubeconfig = cuttable
    waiting = Waiting(connect(kubeconfig), namespace, interval=30)
    waiting.next_shown()
    cut = time.monotonic()
    proxy.cut()
    result = waiting.end(timeout=30)
    error = result.get("error")
    assert isinstance(error, OperationError), result
    text = str(error)
    assert "\n" not in text and "cannot reach the Kubernetes API" in text, text
    assert float(result["at"]) - cut < 15  # type: ignore[arg-type]


def test_the_apiserver_going_away_under_up_wait(cuttable, admin, namespace, tmp_path):
    proxy, kubeconfig = cuttable
    proc = start_cli(kubeconfig, "up", "--image", IMAGE, "--name", "j", "-n", namespace, "--wait")
    lines = Lines(proc)
    lines.wait_for("j: Pending")
    proxy.cut()
    code, seen = lines.finish()
    assert code == 1, seen
    assert seen[-1].startswith("error: watching ") and "cannot reach the Kubernetes API" in seen[-1]
    assert not any("Traceback" in line for line in seen), seen


def test_ctrl_c_mid_watch_leaves_the_job_as_it_is(control_plane, admin, namespace):
    proc = start_cli(
        control_plane.kubeconfig, "up", "--image", IMAGE, "--name", "j", "-n", namespace, "--wait"
    )
    lines = Lines(proc)
    lines.wait_for("j: Pending")
    pods = create_pods(admin, get_job(admin, namespace, "j"))
    set_pod_status(admin, namespace, pods[0], {"phase": "Running"})
    lines.wait_for("j: Running")  # the watch brought it: `up` is mid-watch now
    before = _objects(admin, namespace)
    proc.send_signal(signal.SIGINT)
    code, seen = lines.finish()
    assert code == 130, seen
    assert seen[-1].startswith("error: interrupted (SIGINT): stopped watching"), seen
    assert "goes on (it was Running)" in seen[-1], seen
    assert not any("Traceback" in line for line in seen), seen
    assert _objects(admin, namespace) == before


def _objects(admin, namespace: str) -> dict[str, list[tuple[str, str]]]:
    """Every PyTorchJob and pod with its resourceVersion: unchanged means untouched."""

    def of(api: str, kind: str) -> list[tuple[str, str]]:
        items = res(admin, api, kind).get(namespace=namespace).to_dict()["items"]
        return sorted((i["metadata"]["name"], i["metadata"]["resourceVersion"]) for i in items)

    return {"job": of("kubeflow.org/v1", "PyTorchJob"), "pods": of("v1", "Pod")}
