"""The kube connection against a real kube-apiserver: the namespace rule of every cluster
command, a failing exec credential plugin, an unusable discovery cache, and API errors
(Status JSON, websocket handshakes) shown as their message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from actors import create_pods, get_job, res
from apiserver import ControlPlane
from cli_runner import run_cli
from fs_helpers import without_dac_override

pytestmark = pytest.mark.slow  # a real kube-apiserver

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.invalid/train:v1"


def kubeconfig_with(plane: ControlPlane, folder: Path, **context: object) -> Path:
    """The test kubeconfig, its current (admin) context changed by ``context``."""
    doc = yaml.safe_load(plane.kubeconfig.read_text())
    current = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])
    current["context"].update(context)
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(kubeconfig: Path, cache: Path, *args: str, prefix: tuple[str, ...] = ()):
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "XDG_CACHE_HOME": str(cache)}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "ddpdeploy", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(out) -> str:
    assert "Traceback" not in out.stderr and "ERROR:" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.fixture
def other_namespace(admin, namespace: str) -> str:
    name = f"{namespace}-b"
    res(admin, "v1", "Namespace").create(body={"metadata": {"name": name}})
    return name


def test_every_command_takes_the_context_namespace(control_plane, admin, namespace, tmp_path):
    config = kubeconfig_with(control_plane, tmp_path, namespace=namespace)
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")  # no namespace: field
    cache = tmp_path / "cache"
    out = cli(config, cache, "up", "-f", str(spec), "--image", IMAGE, "--name", "ctx", "--no-wait")
    assert out.returncode == 0, out.stderr
    assert f"-n {namespace}" in out.stderr
    assert get_job(admin, namespace, "ctx") is not None  # before: in `default`
    assert get_job(admin, "default", "ctx") is None
    out = cli(config, cache, "status", "ctx")
    assert out.returncode == 0, out.stderr
    out = cli(config, cache, "list", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert [(j["name"], j["namespace"]) for j in json.loads(out.stdout)] == [("ctx", namespace)]
    out = cli(config, cache, "down", "ctx")
    assert out.returncode == 0, out.stderr
    assert get_job(admin, namespace, "ctx") is None


def test_flag_then_spec_file_then_context(
    control_plane, admin, namespace, other_namespace, tmp_path
):
    config = kubeconfig_with(control_plane, tmp_path, namespace="no-such-namespace")
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text(f"namespace: {namespace}\ncheckpoint: {{size: 1Gi}}\n")
    cache = tmp_path / "cache"
    base = ("up", "-f", str(spec), "--image", IMAGE, "--no-wait")
    out = cli(config, cache, *base, "--name", "file")
    assert out.returncode == 0, out.stderr
    assert get_job(admin, namespace, "file") is not None  # the spec's, over the context's
    out = cli(config, cache, *base, "--name", "flag", "-n", other_namespace)
    assert out.returncode == 0, out.stderr
    assert get_job(admin, other_namespace, "flag") is not None  # -n over the spec's
    assert get_job(admin, namespace, "flag") is None
    # status, down: the flag, else the context's (a spec file is not read by them)
    out = cli(config, cache, "status", "file")
    assert out.returncode == 1 and "in namespace no-such-namespace" in one_line(out)
    out = cli(config, cache, "status", "file", "-n", namespace)
    assert out.returncode == 0, out.stderr


def test_up_help_states_the_namespace_rule():
    out = run_cli("up", "--help", env={"COLUMNS": "200"})
    assert "Namespace: -n, else the spec's namespace:, else the kubeconfig context's" in " ".join(
        out.stdout.split()
    )
    for command in ("status", "down", "list", "logs", "scale", "resume", "collect"):
        text = " ".join(run_cli(command, "--help", env={"COLUMNS": "200"}).stdout.split())
        assert "default: the kubeconfig context's, else default" in text, command


def exec_user(plane: ControlPlane, folder: Path, script: str) -> Path:
    plugin = folder / "plugin.sh"
    plugin.write_text(script)
    plugin.chmod(0o755)
    doc = yaml.safe_load(plane.kubeconfig.read_text())
    doc["users"] = [
        {
            "name": "admin",
            "user": {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "command": str(plugin),
                    "interactiveMode": "Never",
                }
            },
        }
    ]
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_failing_exec_plugin_is_not_blamed_on_rbac(control_plane, tmp_path):
    config = exec_user(control_plane, tmp_path, "#!/bin/sh\necho 'please log in' >&2\nexit 1\n")
    out = cli(config, tmp_path / "cache", "list")
    line = one_line(out)
    assert out.returncode == 1
    assert "exec credential plugin failed" in line and "please log in" in line
    assert "anonymous" not in line and "RBAC" not in line


def test_no_credentials_is_said_so(control_plane, namespace, tmp_path):
    doc = yaml.safe_load(control_plane.kubeconfig.read_text())
    doc["users"] = [{"name": "admin", "user": {}}]
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump(doc))
    out = cli(config, tmp_path / "cache", "status", "x", "-n", namespace)
    line = one_line(out)
    assert out.returncode == 1
    assert "got no credentials (it saw system:anonymous)" in line, line


def test_unwritable_cache_folder_still_connects(control_plane, namespace, tmp_path):
    cache = tmp_path / "ro"
    cache.mkdir()
    probe = cache / "probe"
    probe.write_text("")
    probe.chmod(0)
    cache.chmod(0o555)
    prefix = tuple(without_dac_override(probe))
    out = cli(control_plane.kubeconfig, cache, "status", "nosuch", "-n", namespace, prefix=prefix)
    line = one_line(out)
    assert out.returncode == 1
    assert "no job nosuch" in line and "cannot reach" not in line, line
    assert not (cache / "ddpdeploy").exists()


def test_cache_path_through_a_file_still_connects(control_plane, namespace, tmp_path):
    cache = tmp_path / "a-file"
    cache.write_text("")
    out = cli(control_plane.kubeconfig, cache, "status", "nosuch", "-n", namespace)
    assert out.returncode == 1 and "no job nosuch" in one_line(out)


def cache_file(cache: Path) -> Path:
    (found,) = (cache / "ddpdeploy" / "discovery").glob("*.json")
    return found


@pytest.mark.parametrize(
    "garbage",
    ["{not json", "", "[]", '{"library_version": "%s", "resources": 5}', "\x00" * 50],
)
def test_corrupt_discovery_cache_is_rediscovered(control_plane, namespace, tmp_path, garbage):
    import kubernetes

    cache = tmp_path / "cache"
    out = cli(control_plane.kubeconfig, cache, "list", "-n", namespace)
    assert out.returncode == 0, out.stderr
    file = cache_file(cache)
    file.write_text(garbage.replace("%s", kubernetes.__version__))
    out = cli(control_plane.kubeconfig, cache, "list", "-n", namespace, "-o", "json")
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and json.loads(out.stdout) == []
    assert "resources" in json.loads(file.read_text())  # written afresh


def test_api_status_json_shows_as_its_message(control_plane, admin, namespace, tmp_path):
    """A pod with no node: the apiserver refuses its log and exec with a Status object
    (exec: inside a websocket handshake error, with the response headers)."""
    from ddpdeploy.adapters.kube import Kube
    from ddpdeploy.errors import OperationError

    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    config = control_plane.kubeconfig
    out = cli(
        config,
        tmp_path / "c",
        "up",
        "-f",
        str(spec),
        "--image",
        IMAGE,
        "--name",
        "j",
        "-n",
        namespace,
        "--no-wait",
    )
    assert out.returncode == 0, out.stderr
    pods = create_pods(admin, get_job(admin, namespace, "j"))
    for pod in pods:  # on a node with no kubelet, so the apiserver has somewhere to fail
        body = res(admin, "v1", "Pod").get(name=pod, namespace=namespace).to_dict()
        res(admin, "v1", "Pod").delete(name=pod, namespace=namespace, grace_period_seconds=0)
        body["spec"]["nodeName"] = "ghost-node"
        meta = body["metadata"]
        body["metadata"] = {k: meta[k] for k in ("name", "labels", "ownerReferences")}
        res(admin, "v1", "Pod").create(namespace=namespace, body=body)
    out = cli(config, tmp_path / "c", "logs", "j", "-n", namespace)
    # The merged logs: one warning line per pod it could not read, then the error.
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1
    assert len(lines) == len(pods) + 1 and lines[-1].startswith("error: "), lines
    for line in lines[:-1]:
        assert line.startswith("warning: reading the logs of pod "), lines
        assert "{" not in line and '"kind"' not in line and "ghost-node" in line, line

    kube = Kube(str(config))
    with pytest.raises(OperationError) as err:
        list(kube.exec_stream(pods[0], namespace, "pytorch", ["ls"]))
    text = str(err.value)
    assert "-+-+-" not in text and "Content-Type" not in text and "{" not in text, text
    assert "\n" not in text


def test_invalid_context_namespace_is_named_as_the_contexts(control_plane, tmp_path):
    config = kubeconfig_with(control_plane, tmp_path, namespace="Bad_NS")
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    out = cli(config, tmp_path / "c", "up", "-f", str(spec), "--image", IMAGE, "--no-wait")
    line = one_line(out)
    assert out.returncode == 2
    assert "the kubeconfig context's namespace 'Bad_NS' must be a DNS-1123 label" in line


def test_stream_errors_without_an_http_answer_are_unreachable(control_plane):
    """kubernetes.stream turns any websocket failure into ApiException(status=0, reason=...)
    and even Ctrl-C; the first reads as "cannot reach", the second stays an interrupt."""
    from kubernetes.client.exceptions import ApiException

    from ddpdeploy.adapters.kube import Kube
    from ddpdeploy.errors import OperationError
    from ddpdeploy.signals import Interrupted

    kube = Kube(str(control_plane.kubeconfig))
    with pytest.raises(OperationError) as err, kube.errors("running ls in pod p"):
        raise ApiException(status=0, reason="[Errno 111] Connection\nrefused")
    assert str(err.value).startswith("running ls in pod p: cannot reach the Kubernetes API")
    assert "Connection refused" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(Interrupted), kube.errors("running ls in pod p"):
        try:
            raise Interrupted(2)
        except KeyboardInterrupt as exc:  # as kubernetes.stream.ws_client does
            raise ApiException(status=0, reason=str(exc)) from None
