"""`up` finishes the spec (its namespace from the kubeconfig, a file read), renders its
objects once, and says a render error before it sends a single request. A listening socket
stands in for the API server: the fault here is "no request at all", which it records."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ddpdeploy import targets
from ddpdeploy.cli import main


@pytest.fixture
def listener() -> Iterator[tuple[int, list[int]]]:
    """A TCP port that accepts and counts connections (and answers nothing)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    sock.close()


def kubeconfig(folder: Path, port: int, namespace: str = "team-b") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": namespace}}
        ],
        "current-context": "x",
    }
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_render_error_comes_before_any_request(tmp_path, monkeypatch, listener, capsys):
    port, accepted = listener
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as code:
        main(["up", "--kubeconfig", str(kubeconfig(tmp_path, port)), "--nodes", "2"])
    assert code.value.code == 2
    assert "image: required" in capsys.readouterr().err
    assert accepted == []


def test_the_objects_are_rendered_once_in_the_contexts_namespace(tmp_path, monkeypatch, listener):
    port, _ = listener
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rendered: list[str] = []
    real = targets.render_objects

    def counted(spec, *args, **kwargs):  # type: ignore[no-untyped-def]
        rendered.append(spec.namespace)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(targets, "render_objects", counted)
    monkeypatch.setattr("ddpdeploy.cluster.apply.render_objects", counted)
    with pytest.raises(SystemExit) as code:
        main(["up", "--kubeconfig", str(kubeconfig(tmp_path, port)), "--image", "t:1"])
    assert code.value.code == 1  # the silent server: the preflight's first request fails
    assert rendered == ["team-b"]
