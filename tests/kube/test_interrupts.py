"""Never half of a change: SIGINT/SIGTERM at several points of `up` and `up --replace`
(a slow proxy in front of the apiserver widens the windows), two `up`s of one name at the
same moment, an apiserver that never answers, and `up 2>/dev/full`; the cluster's state is
checked afterwards each time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from actors import ROOT, Lines, get_job, pod_spec, res
from netstubs import black_hole, kubeconfig_via, slow_proxy

pytestmark = pytest.mark.slow

IMAGE = "registry.invalid/train:v1"


def start(kubeconfig: Path, *args: str, stderr: object = subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "XDG_CACHE_HOME": str(kubeconfig.parent)}
    return subprocess.Popen(
        [sys.executable, "-m", "ddpdeploy", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def state(admin, ns: str) -> dict[str, list[str]]:
    """Live (not Terminating) objects of each kind `up` makes."""

    def names(api: str, kind: str) -> list[str]:
        items = res(admin, api, kind).get(namespace=ns).to_dict()["items"]
        return sorted(
            i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp")
        )

    return {
        "pvc": names("v1", "PersistentVolumeClaim"),
        "policy": names("networking.k8s.io/v1", "NetworkPolicy"),
        "job": names("kubeflow.org/v1", "PyTorchJob"),
    }


@pytest.fixture
def slow_kubeconfig(control_plane, tmp_path: Path):
    with slow_proxy(control_plane.port, delay=0.25) as port:
        yield kubeconfig_via(control_plane.kubeconfig, port, tmp_path / "kubeconfig")


@pytest.fixture
def ckpt_spec(tmp_path: Path) -> Path:
    path = tmp_path / "ddpdeploy.yaml"
    path.write_text("checkpoint: {size: 1Gi}\n")
    return path


def up_args(ns: str, name: str, spec: Path, *more: str) -> list[str]:
    return ["up", "--image", IMAGE, "--name", name, "-n", ns, "-f", str(spec), "--no-wait", *more]


@pytest.mark.parametrize(
    ("after", "sig"),
    [
        ("warning: the cluster has no default StorageClass", signal.SIGINT),  # preflight done
        ("created PersistentVolumeClaim", signal.SIGINT),  # mid-apply
        ("created NetworkPolicy", signal.SIGTERM),  # just before the job
    ],
)
def test_interrupted_up_leaves_nothing(admin, namespace, slow_kubeconfig, ckpt_spec, after, sig):
    proc = start(slow_kubeconfig, *up_args(namespace, "j", ckpt_spec))
    lines = Lines(proc)
    lines.wait_for(after)
    proc.send_signal(sig)
    code, seen = lines.finish()
    assert code == 128 + sig, seen
    last = seen[-1]
    assert last.startswith(f"error: interrupted ({signal.Signals(sig).name}): "), seen
    # (A signal during the job's create request can land after the server made it.)
    assert any(s in last for s in ("was not created", "nothing was", "was created; took back"))
    assert state(admin, namespace) == {"pvc": [], "policy": [], "job": []}, seen


def test_interrupted_replace_still_leaves_a_job(admin, namespace, slow_kubeconfig, ckpt_spec):
    kubeconfig = slow_kubeconfig
    first = start(kubeconfig, *up_args(namespace, "j", ckpt_spec))
    assert Lines(first).finish()[0] == 0
    old = get_job(admin, namespace, "j")["metadata"]["uid"]
    proc = start(kubeconfig, *up_args(namespace, "j", ckpt_spec, "--replace"))
    lines = Lines(proc)
    # Ctrl-C right after the old job is gone: the new one must be created all the same.
    deadline = time.monotonic() + 60
    while (job := get_job(admin, namespace, "j")) is not None and job["metadata"]["uid"] == old:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    code, seen = lines.finish()
    assert code == 130, seen
    assert seen[-1].startswith("error: interrupted (SIGINT): "), seen
    assert "was replaced" in seen[-1]
    new = get_job(admin, namespace, "j")
    assert new is not None and new["metadata"]["uid"] != old
    assert state(admin, namespace) == {"pvc": ["j-checkpoints"], "policy": ["j"], "job": ["j"]}


@pytest.mark.parametrize(("sig", "exit_code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_wait_says_the_job_goes_on(admin, namespace, control_plane, sig, exit_code):
    args = ["up", "--image", IMAGE, "--name", "w", "-n", namespace, "--wait"]
    proc = start(control_plane.kubeconfig, *args)
    lines = Lines(proc)
    lines.wait_for("created PyTorchJob")
    time.sleep(1)
    proc.send_signal(sig)
    code, seen = lines.finish()
    assert code == exit_code, seen
    name = signal.Signals(sig).name
    assert seen[-1].startswith(f"error: interrupted ({name}): stopped watching"), seen
    assert "goes on (it was Pending)" in seen[-1], seen  # the state it was last seen in
    assert get_job(admin, namespace, "w") is not None


def test_two_ups_of_one_name_at_once_one_wins(admin, namespace, slow_kubeconfig, ckpt_spec):
    images = ("registry.invalid/a:1", "registry.invalid/b:1")
    procs = [
        start(slow_kubeconfig, *up_args(namespace, "j", ckpt_spec, "--image", image))
        for image in images
    ]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 1], results
    won = next(i for i, (code, _) in enumerate(results) if code == 0)
    loser = results[1 - won][1]
    assert loser.strip().splitlines()[-1].startswith(f"error: PyTorchJob {namespace}/j "), loser
    assert "someone else" in loser
    # The winner's job stands, untouched by the loser (no silent overwrite).
    job = get_job(admin, namespace, "j")
    template = pod_spec(job)
    assert template["containers"][0]["image"] == images[won]
    assert images[won] in job["metadata"]["annotations"]["ddpdeploy.dev/spec"]
    # The saved spec `resume` reads after `down` is the winner's too.
    pvc = res(admin, "v1", "PersistentVolumeClaim").get(name="j-checkpoints", namespace=namespace)
    assert images[won] in pvc.to_dict()["metadata"]["annotations"]["ddpdeploy.dev/spec"]
    assert state(admin, namespace) == {"pvc": ["j-checkpoints"], "policy": ["j"], "job": ["j"]}


def _timed(run: Callable[[], subprocess.CompletedProcess]) -> tuple[float, object]:
    began = time.monotonic()
    out = run()
    return time.monotonic() - began, out


def test_an_apiserver_that_never_answers_is_given_up_on(tmp_path: Path):
    config = tmp_path / "kubeconfig"
    cache = tmp_path / "cache"  # empty: no discovery cache to lean on
    with black_hole() as port:
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}', "
            "insecure-skip-tls-verify: true}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        )
        env = {**os.environ, "KUBECONFIG": str(config), "XDG_CACHE_HOME": str(cache)}
        for args in (["list", "-n", "x"], ["down", "x", "-n", "x"]):
            seconds, out = _timed(
                lambda args=args: subprocess.run(
                    [sys.executable, "-m", "ddpdeploy", *args],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=150,
                )
            )
            assert out.returncode == 1, out.stderr
            # The kubeconfig skips TLS verification: that is said once, first.
            warning, *lines = out.stderr.strip().splitlines()
            assert warning.startswith("warning: the kubeconfig skips TLS verification"), warning
            assert len(lines) == 1 and "cannot reach the Kubernetes API" in lines[0], out.stderr
            assert seconds < 120


def test_up_with_stderr_full_leaves_nothing(admin, namespace, control_plane, tmp_path):
    plain = tmp_path / "plain.yaml"  # no PVC: no storage warning before the first change
    plain.write_text("nodes: 2\n")
    with open("/dev/full", "w") as full:
        proc = start(control_plane.kubeconfig, *up_args(namespace, "j", plain), stderr=full)
        code = proc.wait(timeout=120)
    assert code != 0
    assert state(admin, namespace) == {"pvc": [], "policy": [], "job": []}


def test_the_exec_websocket_gives_up_on_a_server_that_never_answers():
    """collect --from cluster reads through exec, whose websocket kubernetes.stream opens
    with no timeout: exec_stream bounds the opening; here the same bound around the same
    library's connect to a server that accepts and never answers."""
    import websocket

    from ddpdeploy.adapters.kube import bounded

    with black_hole() as port:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="no answer within 1 s"):
            bounded(lambda: websocket.WebSocket().connect(f"ws://127.0.0.1:{port}/"), 1, "t")
        assert time.monotonic() - began < 10
