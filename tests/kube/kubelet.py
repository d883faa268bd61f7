"""A kubelet stand-in: the container-log endpoint the real apiserver proxies
`read_namespaced_pod_log` to, over HTTPS on 127.0.0.1 with a self-signed certificate (the
apiserver checks a kubelet's certificate only with --kubelet-certificate-authority, which
tests/kube/apiserver.py does not pass).

Serves ``/exec/{ns}/{pod}/{container}`` as a websocket (the channel protocol
v4.channel.k8s.io that the apiserver passes through from the client): what ``set_exec`` set
for the pod, stdout, stderr and the exit code; ``execs`` records each command.

Serves ``/containerLogs/{ns}/{pod}/{container}`` with ``tailLines``, ``sinceSeconds``,
``limitBytes``, ``timestamps``, ``previous`` and ``follow`` from the text a test sets per
(pod, container, previous); a followed stream stays open, sending lines as the test adds
them, until the test closes it or that run of the container ends (``restart``: the next
run, the old one becomes ``previous``; ``remove``: the pod is gone); ``delay`` slows every
answer, and ``most_in_flight`` counts the most requests answered at once. ``register``
creates the Node object (InternalIP 127.0.0.1, kubeletEndpoint.Port) that pods name in
spec.nodeName.

Why a stand-in beside the real kubelet of tests/e2e (issue 23 §4): the real one now covers
what a run produces (a 2 x 2 job's logs merged by rank, `logs -f` across a restarted
container and a replaced pod, `status` from a running and a finished job, `collect` through
exec; tests/e2e). What stays here is what a real kubelet cannot produce on demand: log
lines stamped to the second (the merge order, --since and the ETA's arithmetic), an answer
slowed on purpose (at most 16 reads at once) or a 500 from the log endpoint, a followed
stream ended or restarted at a chosen line, the recorded log of a real run replayed
without running it (20 and 128 pods on a 2-core node), a look-alike pod whose forged log
belongs to no run, and an exec that answers a chosen exit code.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import ssl
import struct
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Key = tuple[str, str, bool]  # (pod, container, previous)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for 127.0.0.1 (openssl, as apiserver.py uses)."""
    key, cert = folder / "kubelet.key", folder / "kubelet.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=kubelet-stand-in",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


def stamp(when: float) -> str:
    """RFC 3339 with nanoseconds, as the kubelet writes timestamps."""
    dt = datetime.datetime.fromtimestamp(when, datetime.timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond:06d}000Z"


@dataclass
class Kubelet:
    folder: Path
    logs: dict[Key, list[tuple[float, str]]] = field(default_factory=dict)
    failing: dict[str, int] = field(default_factory=dict)  # pod -> HTTP status it answers
    # (pod, container, previous) -> the kubelet's own error it answers as the log, HTTP 200,
    # no timestamp, as the 1.20 kubelet does once the container is gone
    own_error: dict[Key, str] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)  # the paths asked for, with queries
    closed: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    port: int = 0
    node_name: str = ""
    delay: float = 0.0  # seconds each log answer waits before its first byte
    in_flight: int = 0  # log requests being answered now...
    most_in_flight: int = 0  # ...and the most at once
    _counting: threading.Lock = field(default_factory=threading.Lock)
    # pod -> (stdout, stderr, exit code) an exec in it answers; the commands run
    exec_answers: dict[str, tuple[bytes, bytes, int | str | None]] = field(default_factory=dict)
    execs: list[list[str]] = field(default_factory=list)

    def start(self) -> Kubelet:
        key, cert = self_signed(self.folder)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        # The handshake in each request's thread, not in the one accepting them all.
        self._server.socket = ctx.wrap_socket(
            self._server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.port = self._server.server_address[1]
        self.node_name = f"kubelet-{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.close_streams()
        self._server.shutdown()
        self._server.server_close()

    def register(self, admin: Any) -> None:
        """The Node the apiserver finds this kubelet by (its address and port)."""
        nodes = admin.resources.get(api_version="v1", kind="Node")
        nodes.create(
            body={
                "metadata": {"name": self.node_name},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                },
            }
        )

    def unregister(self, admin: Any) -> None:
        admin.resources.get(api_version="v1", kind="Node").delete(name=self.node_name)

    def set_log(
        self,
        pod: str,
        text: str,
        container: str = "pytorch",
        previous: bool = False,
        at: float | None = None,
        every: float = 0.001,
    ) -> None:
        """The container's log: ``text``'s lines, written from ``at`` (default now) on,
        ``every`` seconds apart."""
        start = time.time() if at is None else at
        lines = [(start + i * every, t) for i, t in enumerate(text.splitlines())]
        with self.changed:
            self.logs[(pod, container, previous)] = lines
            self.changed.notify_all()

    def set_exec(
        self, pod: str, stdout: bytes, stderr: bytes = b"", code: int | str | None = 0
    ) -> None:
        """What any command run in the pod answers: its exit ``code``, or (text) the error
        the kubelet's runtime gave instead of running it ("container not running"), or
        (None) no status at all: the stream cut short, which a real kubelet cannot be made
        to do on demand."""
        self.exec_answers[pod] = (stdout, stderr, code)

    def append(self, pod: str, text: str, container: str = "pytorch") -> None:
        """More lines of a running container (a followed stream sends them)."""
        with self.changed:
            log = self.logs.setdefault((pod, container, False), [])
            log += [(time.time(), t) for t in text.splitlines()]
            self.changed.notify_all()

    def restart(self, pod: str, text: str, container: str = "pytorch") -> None:
        """The container restarts: its run so far becomes the previous one (``previous``
        reads it), its followed streams end, and the new run's log is ``text``."""
        with self.changed:
            self.logs[(pod, container, True)] = self.logs.pop((pod, container, False), [])
            self.changed.notify_all()
        self.set_log(pod, text, container)

    def remove(self, pod: str) -> None:
        """The pod is gone: its logs with it, and its followed streams end."""
        with self.changed:
            for key in [k for k in self.logs if k[0] == pod]:
                del self.logs[key]
            self.changed.notify_all()

    def close_streams(self) -> None:
        """End every followed stream, as a container's exit does."""
        with self.changed:
            self.closed.set()
            self.changed.notify_all()

    def lines(self, key: Key, query: dict[str, str]) -> list[tuple[float, str]]:
        log = list(self.logs.get(key, []))
        if "sinceSeconds" in query:
            since = time.time() - int(query["sinceSeconds"])
            log = [(t, s) for t, s in log if t >= since]
        if "tailLines" in query:
            tail = int(query["tailLines"])
            log = log[max(0, len(log) - tail) :] if tail else []
        return log

    def follow(
        self, key: Key, log: list[tuple[float, str]], sent: int
    ) -> Iterator[tuple[float, str]]:
        """Lines of ``log`` (one run of the container) after the first ``sent``, as they
        come, until the streams close or that run ends (``set_log``, ``restart`` or
        ``remove`` put another run, or none, in its place)."""
        while True:
            with self.changed:
                while len(log) <= sent and not self.closed.is_set() and self.logs.get(key) is log:
                    self.changed.wait(0.5)
                new = log[sent:]
                ended = self.closed.is_set() or self.logs.get(key) is not log
            yield from new
            sent += len(new)
            if ended and not new:
                return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A kubelet's listen backlog, not socketserver's 5: more connections at once (`logs`
    # reads pods concurrently) would have their SYNs dropped and retried a second later.
    request_queue_size = 1024


def _handler(kubelet: Kubelet) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            with kubelet._counting:
                kubelet.in_flight += 1
                kubelet.most_in_flight = max(kubelet.most_in_flight, kubelet.in_flight)
            try:
                time.sleep(kubelet.delay)
                self._get()
            finally:
                with kubelet._counting:
                    kubelet.in_flight -= 1

        def _get(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            kubelet.requests.append(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            parts = url.path.strip("/").split("/")
            if len(parts) == 4 and parts[0] == "exec":
                return self._exec(parts[2], urllib.parse.parse_qsl(url.query))
            if len(parts) != 4 or parts[0] != "containerLogs":
                return self._answer(404, f"no such path {url.path}")
            _, _ns, pod, container = parts
            if pod in kubelet.failing:
                return self._answer(kubelet.failing[pod], "internal error: the log is gone")
            previous = query.get("previous") == "true"
            key = (pod, container, previous)
            if key in kubelet.own_error:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(kubelet.own_error[key].encode())
                return
            with kubelet.changed:  # the run answered: the one there now
                run = kubelet.logs.get(key)
                lines = kubelet.lines(key, query)
                sent = len(run or [])
            if run is None:
                what = "previous terminated container" if previous else "container"
                return self._answer(400, f'{what} "{container}" in pod "{pod}" not found')
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            stamps = query.get("timestamps") == "true"
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
            self._write(lines, stamps, limit)
            if query.get("follow") == "true" and not previous:
                for line in kubelet.follow(key, run, sent):
                    self._write([line], stamps, None)

        def _write(self, lines: list[tuple[float, str]], stamps: bool, limit: int | None) -> None:
            data = "".join((f"{stamp(t)} " if stamps else "") + f"{s}\n" for t, s in lines)
            body = data.encode()
            self.wfile.write(body if limit is None else body[:limit])
            self.wfile.flush()

        def _exec(self, pod: str, query: list[tuple[str, str]]) -> None:
            key = self.headers.get("Sec-WebSocket-Key")
            if (self.headers.get("Upgrade") or "").lower() != "websocket" or not key:
                return self._answer(400, "exec: a websocket upgrade only (this stand-in)")
            if pod not in kubelet.exec_answers:
                return self._answer(404, f'pod "{pod}" has no exec answer')
            offered = [
                p.strip() for p in (self.headers.get("Sec-WebSocket-Protocol") or "").split(",")
            ]
            if "v4.channel.k8s.io" not in offered:
                return self._answer(400, f"exec: no v4.channel.k8s.io in {offered}")
            kubelet.execs.append([v for k, v in query if k == "command"])
            guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455's
            accept = base64.b64encode(hashlib.sha1((key + guid).encode()).digest()).decode()
            self.send_response(101, "Switching Protocols")
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
            self.end_headers()
            stdout, stderr, code = kubelet.exec_answers[pod]
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
            if isinstance(code, str):
                # As the 1.20 kubelet's exec server sends a runtime error: an InternalError
                # whose one cause's message is text where an exit code's would be a number.
                text = f"error executing command in container: {code}"
                status = {
                    "metadata": {},
                    "status": "Failure",
                    "message": f"Internal error occurred: {text}",
                    "reason": "InternalError",
                    "details": {"causes": [{"message": text}]},
                    "code": 500,
                }
            elif code:
                status = {
                    "metadata": {},
                    "status": "Failure",
                    "reason": "NonZeroExitCode",
                    "message": f"command terminated with non-zero exit code: {code}",
                    "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
                }
            # v4: a binary frame per write, its first byte the channel (1 stdout, 2 stderr,
            # 3 the status), then a close frame
            end = b"" if code is None else json.dumps(status).encode()
            for channel, data in ((1, stdout), (2, stderr), (3, end)):
                if data:
                    self._frame(0x2, bytes([channel]) + data)
            self._frame(0x8, struct.pack("!H", 1000))
            self.close_connection = True

        def _frame(self, opcode: int, payload: bytes) -> None:
            """One unmasked websocket frame, as a server sends."""
            n = len(payload)
            if n < 126:
                size = bytes([n])
            elif n < 65536:
                size = bytes([126]) + struct.pack("!H", n)
            else:
                size = bytes([127]) + struct.pack("!Q", n)
            self.wfile.write(bytes([0x80 | opcode]) + size + payload)
            self.wfile.flush()

        def _answer(self, code: int, message: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(message.encode())

    return Handler
