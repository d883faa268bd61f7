"""Network stand-ins on 127.0.0.1 for the cluster tests: a slow TCP proxy in front of the
apiserver (widens the window between two API calls, so that a signal lands mid-change) and
a black hole (accepts connections, never answers)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    try:
        while data := src.recv(65536):
            time.sleep(delay)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def slow_proxy(upstream_port: int, delay: float) -> Iterator[int]:
    """A TCP proxy to 127.0.0.1:``upstream_port`` that holds each request chunk ``delay``
    seconds; yields its port (TLS passes through untouched)."""
    server = _listener()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", upstream_port))
            threading.Thread(target=_pump, args=(client, upstream, delay), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client, 0.0), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()


@contextlib.contextmanager
def black_hole() -> Iterator[int]:
    """A listener that accepts every connection and never sends a byte; yields its port."""
    server = _listener()
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for sock in held:
            sock.close()


def kubeconfig_via(original: Path, port: int, out: Path) -> Path:
    """A copy of ``original`` whose cluster is reached at 127.0.0.1:``port``."""
    config = yaml.safe_load(original.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    out.write_text(yaml.safe_dump(config))
    return out
