"""When the Kube adapter first asks the API, without an apiserver: made from the kubeconfig
alone (`up` finishes its spec with the context's namespace before any request), the first
call raises what construction used to. Each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def kubeconfig(folder: Path, server: str, namespace: str | None = "team-a") -> Path:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": context}],
        "current-context": "x",
    }
    path = folder / "config"
    path.write_text(yaml.safe_dump(doc))
    return path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python(code: str, folder: Path, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter; what it put in ``out`` (a dict), as JSON."""
    script = folder / "case.py"
    script.write_text(
        "import json, sys\nout = {}\ntry:\n"
        + textwrap.indent(textwrap.dedent(code).strip("\n"), "    ")
        + "\nfinally:\n    print(json.dumps(out))\n"
    )
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(folder / "cache"), "KUBECONFIG": "", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def test_made_without_a_request_and_the_first_call_fails_as_before(tmp_path):
    port = closed_port()
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{port}")
    out = python(
        f"""
        from ddpdeploy.adapters.kube import Kube
        from ddpdeploy.errors import OperationError
        kube = Kube({str(config)!r})
        out["made"] = [kube.server, kube.default_namespace]
        try:
            kube.has_kind("v1", "Pod")
        except OperationError as exc:
            out["error"] = str(exc)
        """,
        tmp_path,
    )
    assert out["made"] == [f"https://127.0.0.1:{port}", "team-a"]
    assert out["error"].startswith(
        f"connecting: cannot reach the Kubernetes API at https://127.0.0.1:{port} ("
    ), out
    assert "\n" not in out["error"]


def test_construction_connects_to_nothing(tmp_path):
    """A server that accepts (and hangs up): no connection comes while Kube is made (and
    `up` renders with its namespace); the first call is the first to come."""
    server = socket.create_server(("127.0.0.1", 0))
    log = tmp_path / "accepted"
    log.write_text("")

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with log.open("a") as f:
                f.write("a connection\n")
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{server.getsockname()[1]}")
    try:
        out = python(
            f"""
            import pathlib, time
            from ddpdeploy.adapters.kube import Kube
            kube = Kube({str(config)!r})
            time.sleep(0.5)
            out["before"] = pathlib.Path({str(log)!r}).read_text()
            try:
                kube.list("v1", "Pod", "team-a")
            except Exception as exc:
                out["error"] = str(exc)
            """,
            tmp_path,
        )
    finally:
        server.close()
    assert out["before"] == "", out
    assert log.read_text(), "the first call connected"
    assert out["error"].startswith("connecting: cannot reach the Kubernetes API"), out
