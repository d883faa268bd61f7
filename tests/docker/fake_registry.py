"""A minimal registry (distribution API v2, push side only) with basic auth, for push tests.

No registry image can be pulled here, so the tests serve the few endpoints the engine uses
to push: blob existence, upload (POST, PATCH, PUT), and manifest PUT. Blobs go to a folder.
The engine treats 127.0.0.0/8 as an insecure registry and falls back to plain HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse


class FakeRegistry:
    def __init__(self, root: Path, user: str = "ci", password: str = "secret") -> None:
        self.root = root
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.manifests: dict[str, bytes] = {}  # "name:tag" -> manifest body
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeRegistry:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def host(self) -> str:
        return f"localhost:{self.port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet test output
                pass

            def _reply(self, code: int, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                if "Content-Length" not in (headers or {}):
                    self.send_header("Content-Length", "0")
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.end_headers()

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == registry.auth:
                    return True
                self._body()
                self._reply(401, {"WWW-Authenticate": 'Basic realm="fake"'})
                return False

            def _blob(self, digest: str) -> Path:
                return registry.root / digest.replace(":", "_")

            def do_GET(self) -> None:
                if self._authorized():
                    self._reply(200 if self.path.rstrip("/") == "/v2" else 404)

            def do_HEAD(self) -> None:
                if not self._authorized():
                    return
                parts = urlparse(self.path).path.split("/blobs/")
                blob = self._blob(parts[-1]) if len(parts) == 2 else None
                if blob is not None and blob.is_file():
                    size = str(blob.stat().st_size)
                    headers = {"Content-Length": size, "Docker-Content-Digest": parts[-1]}
                    self._reply(200, headers)
                else:
                    self._reply(404)

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                self._body()
                name = urlparse(self.path).path[len("/v2/") :].split("/blobs/uploads")[0]
                upload = uuid.uuid4().hex
                (registry.root / f"upload_{upload}").write_bytes(b"")
                location = f"/v2/{name}/blobs/uploads/{upload}"
                headers = {"Location": location, "Docker-Upload-UUID": upload, "Range": "0-0"}
                self._reply(202, headers)

            def do_PATCH(self) -> None:
                if not self._authorized():
                    return
                path = urlparse(self.path).path
                part = registry.root / f"upload_{path.rsplit('/', 1)[-1]}"
                with part.open("ab") as fh:
                    fh.write(self._body())
                end = max(part.stat().st_size - 1, 0)
                self._reply(202, {"Location": path, "Range": f"0-{end}"})

            def do_PUT(self) -> None:
                if not self._authorized():
                    return
                url = urlparse(self.path)
                body = self._body()
                if "/manifests/" in url.path:
                    name, ref = url.path[len("/v2/") :].split("/manifests/")
                    registry.manifests[f"{name}:{ref}"] = body
                    digest = "sha256:" + hashlib.sha256(body).hexdigest()
                    self._reply(201, {"Docker-Content-Digest": digest, "Location": url.path})
                    return
                digest = parse_qs(url.query)["digest"][0]
                part = registry.root / f"upload_{url.path.rsplit('/', 1)[-1]}"
                with part.open("ab") as fh:
                    fh.write(body)
                part.rename(self._blob(digest))
                name = url.path[len("/v2/") :].split("/blobs/uploads")[0]
                location = f"/v2/{name}/blobs/{digest}"
                self._reply(201, {"Docker-Content-Digest": digest, "Location": location})

        return Handler
