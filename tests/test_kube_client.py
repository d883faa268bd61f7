"""How the Kube adapter loads the kubernetes client and when it first asks the API, without
an apiserver (tests/kube/test_client_start.py has the verbs against a real one): made from
the kubeconfig alone, only the client's parts it uses loaded (stand-ins for the packages
that import everything), the whole client still there for code that wants it, before or
after, and a client laid out otherwise is one error line. Each case runs in a fresh
interpreter: what is imported is the point."""

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
from cli_runner import run_cli

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


GENERATED = """
        def generated():
            prefixes = ("kubernetes.client.api.", "kubernetes.client.models.")
            return sorted(m for m in sys.modules if m.startswith(prefixes))
"""


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


def test_the_namespace_comes_from_the_merged_kubeconfigs_chosen_context(tmp_path):
    # The client's own merge (KUBECONFIG=a:b, first entry of a name wins, --context picks),
    # from one read of the files: listing the contexts read them twice more (a 4 MiB file
    # took 40 s).
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = kubeconfig(tmp_path / "a", "https://127.0.0.1:1", "team-a")
    second = kubeconfig(tmp_path / "b", "https://127.0.0.2:1", "team-b")
    doc = yaml.safe_load(second.read_text())
    doc["contexts"] += [
        {"name": "y", "context": {"cluster": "c", "user": "u", "namespace": "team-b"}}
    ]
    doc["current-context"] = "y"
    second.write_text(yaml.safe_dump(doc))
    out = python(
        """
        import yaml
        from ddpdeploy.adapters.kube import Kube
        reads, safe_load = [], yaml.safe_load
        yaml.safe_load = lambda stream: reads.append(1) or safe_load(stream)
        for context in (None, "x", "y"):
            kube = Kube(None, context)
            out[str(context)] = [kube.server, kube.default_namespace]
        out["reads"] = len(reads)
        """,
        tmp_path,
        KUBECONFIG=f"{first}:{second}",
    )
    # The client takes the last file's current-context ("y"), and each name's first entry.
    assert out == {
        "None": ["https://127.0.0.1:1", "team-b"],
        "x": ["https://127.0.0.1:1", "team-a"],
        "y": ["https://127.0.0.1:1", "team-b"],
        "reads": 3 * 2,  # each file once per Kube
    }


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


def test_only_the_clients_parts_in_use_load(tmp_path):
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{closed_port()}")
    out = python(
        GENERATED
        + f"""
        from ddpdeploy.adapters.kube import Kube
        kube = Kube({str(config)!r})
        try:
            kube.has_kind("v1", "Pod")
        except Exception:
            pass
        out["generated"] = generated()
        out["loaded"] = sorted(m for m in sys.modules if m.startswith("kubernetes"))
        """,
        tmp_path,
    )
    assert out["generated"] == []
    # kubernetes/__init__.py would have imported these: it did not run
    for part in ("kubernetes.leaderelection", "kubernetes.informer", "kubernetes.stream"):
        assert part not in out["loaded"], out["loaded"]
    assert "kubernetes.dynamic" in out["loaded"] and "kubernetes.config" in out["loaded"]


def test_the_whole_client_after_us_is_still_the_whole_client(tmp_path):
    """Code in the same process that imports the client after a Kube was made gets all of
    it, the same objects as ours (no second copy of a module)."""
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{closed_port()}")
    out = python(
        f"""
        from ddpdeploy.adapters.kube import Kube
        kube = Kube({str(config)!r})
        import kubernetes
        from kubernetes import client, config, watch
        from kubernetes.client import CoreV1Api, V1Pod
        import kubernetes.client.api_client as api_client
        out["same"] = [
            client.ApiClient is api_client.ApiClient,
            client.CoreV1Api is CoreV1Api,
            kubernetes.client.models.V1Pod is V1Pod,
            kubernetes.client.api.CoreV1Api is CoreV1Api,
            type(kube._api) is client.ApiClient,
        ]
        out["pod"] = V1Pod(metadata={{"name": "p"}}).to_dict()["metadata"]["name"]
        quantity = int(kubernetes.utils.parse_quantity("1Ki"))
        out["parts"] = [kubernetes.leaderelection.__name__, quantity]
        out["version"] = kubernetes.__version__
        out["project"] = kubernetes.__project__  # runs kubernetes/__init__.py into it
        out["core"] = CoreV1Api(kube._api).api_client is kube._api
        """,
        tmp_path,
    )
    assert out["same"] == [True] * 5, out
    assert out["pod"] == "p" and out["core"] is True
    assert out["parts"] == ["kubernetes.leaderelection", 1024]
    assert out["project"] == "kubernetes"
    from importlib.metadata import version

    assert out["version"] == version("kubernetes")


def test_the_whole_client_before_us_is_used_as_it_is(tmp_path):
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{closed_port()}")
    out = python(
        f"""
        import kubernetes, kubernetes.client
        whole = kubernetes.client.__dict__.copy()
        from ddpdeploy.adapters.kube import Kube
        kube = Kube({str(config)!r})
        out["kept"] = sys.modules["kubernetes.client"].__dict__.keys() >= whole.keys()
        out["ours"] = type(kube._api) is kubernetes.client.ApiClient
        try:
            kube.has_kind("v1", "Pod")
        except Exception as exc:
            out["error"] = str(exc)
        """,
        tmp_path,
    )
    assert out["kept"] and out["ours"], out
    assert out["error"].startswith("connecting: cannot reach the Kubernetes API"), out


def test_a_client_laid_out_otherwise_is_one_line(tmp_path):
    """A future client that moved a module the adapter uses: the one error line that says
    which, not a traceback."""
    fake = tmp_path / "site" / "kubernetes"
    (fake / "client").mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "99.0.0"\nraise ImportError("ran")\n')
    (fake / "client" / "__init__.py").write_text("raise ImportError('ran')\n")
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{closed_port()}")
    env = {"PYTHONPATH": str(tmp_path / "site"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = run_cli("status", "j", "--kubeconfig", str(config), env=env)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: the installed kubernetes client (version 99.0.0) does ")
    assert "kubernetes.client.api_client" in lines[0] and "kubernetes>=29" in lines[0]
