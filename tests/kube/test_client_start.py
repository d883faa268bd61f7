"""The cluster verbs against the real kube-apiserver, as far as the kubernetes client goes:
`status`, `logs`, `list` and `down` (and the adapter's exec) load none of its generated API
classes and models (start-up time: issue 25 §6), exec runs through the kubelet stand-in's
websocket, and a kubeconfig that skips TLS verification is one warning line of ours per
command instead of urllib3's per request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from actors import create_pods, get_job, set_running

pytestmark = pytest.mark.slow  # a real kube-apiserver, CLI subprocesses

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.invalid/train:v1"
GENERATED = ("kubernetes.client.api.", "kubernetes.client.models.")

# `python -m ddpdeploy ARGS`, writing the modules it loaded to $MODULES as it exits.
WRAPPER = textwrap.dedent(
    """
    import atexit, json, os, runpy, sys
    atexit.register(lambda: open(os.environ["MODULES"], "w").write(json.dumps(list(sys.modules))))
    sys.argv = ["ddpdeploy", *sys.argv[1:]]
    runpy.run_module("ddpdeploy", run_name="__main__")
    """
)


def cli(control_plane, tmp_path: Path, *args: str, kubeconfig: Path | None = None):
    """The CLI run, and the kubernetes modules it loaded."""
    modules = tmp_path / "modules.json"
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig or control_plane.kubeconfig),
        "XDG_CACHE_HOME": str(control_plane.workdir / "cache"),
        "MODULES": str(modules),
    }
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    loaded = [m for m in json.loads(modules.read_text()) if m.startswith("kubernetes")]
    return out, loaded


@pytest.fixture
def running_job(control_plane, admin, namespace, kubelet, tmp_path):
    """A 2-node job, its pods Running on the kubelet stand-in's node, each with a log."""
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    out, _ = cli(
        control_plane, tmp_path, "up", "-f", str(spec), "--image", IMAGE, "--name", "j",
        "-n", namespace, "--nodes", "2", "--no-wait",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    pods = create_pods(admin, get_job(admin, namespace, "j"), node=kubelet.node_name)
    for node, pod in enumerate(pods):
        set_running(admin, namespace, pod, IMAGE)
        kubelet.set_log(pod, f"agent: node {node}\n[rank{node}]:step 1/2\n")
    return pods


def test_the_verbs_load_no_generated_client_module(
    control_plane, namespace, kubelet, running_job, tmp_path
):
    for args in (
        ["status", "j", "-n", namespace],  # reads rank 0's log too (its progress)
        ["logs", "j", "-n", namespace],
        ["list", "-n", namespace],
        ["down", "j", "-n", namespace],
    ):
        out, loaded = cli(control_plane, tmp_path, *args)
        assert out.returncode == 0, (args, out.stderr)
        assert not [m for m in loaded if m.startswith(GENERATED)], (args, loaded)
        # kubernetes/__init__.py did not run either (it imports these)
        assert "kubernetes.leaderelection" not in loaded and "kubernetes.stream" not in loaded
        if args[0] == "logs":
            assert "[rank1 node1] step 1/2" in out.stdout.splitlines(), out.stdout
    assert any("/containerLogs/" in r for r in kubelet.requests)


def test_exec_through_the_apiserver_loads_no_generated_module(
    control_plane, namespace, kubelet, running_job, tmp_path
):
    """The adapter's exec (collect's pod source) through the real apiserver's websocket
    proxy to the stand-in: stdout as bytes, the exit code, the command's arguments."""
    pod = running_job[0]
    kubelet.set_exec(pod, b"\x00binary\xffout\n" * 5000, b"", 0)
    code = f"""
        import json, sys
        from ddpdeploy.adapters.kube import Kube
        from ddpdeploy.errors import OperationError
        kube = Kube({str(control_plane.kubeconfig)!r})
        got = b"".join(kube.exec_stream({pod!r}, {namespace!r}, "pytorch", ["sh", "-c", "a b"]))
        out = {{"size": len(got), "head": got[:12].hex()}}
        out["generated"] = [m for m in sys.modules if m.startswith({GENERATED!r})]
        print(json.dumps(out))
    """
    env = {**os.environ, "XDG_CACHE_HOME": str(control_plane.workdir / "cache")}
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["size"] == 5000 * 12 and out["head"] == (b"\x00binary\xffout\n").hex()
    assert out["generated"] == []
    assert kubelet.execs == [["sh", "-c", "a b"]]


@pytest.mark.parametrize(
    ("answer", "argv", "line"),
    [
        (
            (b"", b"ls: cannot access '/ckpt': No such file", 2),
            ["ls", "/ckpt"],
            "exit code 2: ls: cannot access '/ckpt': No such file",
        ),
        # Found on the real cluster: the client's returncode read the kubelet's
        # InternalError ("container not running", its cause's message text) as an exit
        # code: ValueError.
        (
            (b"", b"", "container not running (0123abcd)"),
            ["ls", "/ckpt"],
            "Internal error occurred: error executing command in container: container not "
            "running (0123abcd)",
        ),
        # A stream closed before the command's status is no success: it may be a short read
        # that collect would write as the whole file.
        (
            (b"half of it", b"", None),
            ["cat", "/ckpt/a"],
            "the exec ended without its command's status (the connection closed early)",
        ),
    ],
    ids=["exit code", "runtime refused", "cut short"],
)
def test_an_exec_that_failed_is_the_error_line(
    control_plane, namespace, kubelet, running_job, answer, argv, line
):
    from ddpdeploy.adapters.kube import Kube
    from ddpdeploy.errors import OperationError

    kubelet.set_exec(running_job[1], *answer)
    kube = Kube(str(control_plane.kubeconfig))
    with pytest.raises(OperationError) as err:
        list(kube.exec_stream(running_job[1], namespace, "pytorch", argv))
    assert str(err.value) == f"running {argv[0]} in pod {running_job[1]}: {line}"


def insecure(control_plane, folder: Path) -> Path:
    doc = yaml.safe_load(control_plane.kubeconfig.read_text())
    doc["clusters"][0]["cluster"] = {
        "server": control_plane.server,
        "insecure-skip-tls-verify": True,
    }
    path = folder / "insecure-kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_skipped_tls_verification_is_one_line_per_command(
    control_plane, namespace, running_job, tmp_path
):
    config = insecure(control_plane, tmp_path)
    warning = (
        f"warning: the kubeconfig skips TLS verification for {control_plane.server} "
        "(insecure-skip-tls-verify); the server's identity is not checked"
    )
    for args, code in (
        (["status", "nosuch", "-n", namespace], 1),
        (["list", "-n", namespace, "-o", "json"], 0),
        (["logs", "j", "-n", namespace], 0),  # concurrent log reads: still one line
    ):
        out, _ = cli(control_plane, tmp_path, *args, kubeconfig=config)
        assert out.returncode == code, out.stderr
        assert "InsecureRequestWarning" not in out.stderr and "warnings.warn" not in out.stderr
        lines = out.stderr.strip().splitlines()
        assert lines[0] == warning and lines.count(warning) == 1, out.stderr
        assert len(lines) == (2 if code else 1), out.stderr
    # A verified connection says nothing.
    out, _ = cli(control_plane, tmp_path, "list", "-n", namespace, "-o", "json")
    assert out.returncode == 0 and out.stderr == "", out.stderr
