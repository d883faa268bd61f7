"""A throwaway control plane for the cluster tests: etcd and kube-apiserver on 127.0.0.1.

No scheduler, controller manager or kubelet: tests play the operator and the kubelet by
creating pods and patching status subresources. The apiserver binary comes from
.ci/kube-build.sh (built from Debian's kubernetes source package; tests/kube_build.py finds
it, waiting for a build CI started in the background).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kube_build
import yaml

CACHE = Path(os.environ.get("DDPDEPLOY_KUBE_CACHE", "/var/cache/ddpdeploy-test"))
ADMIN_TOKEN = "admin-token-for-tests"
LIMITED_TOKEN = "limited-token-for-tests"
LIMITED_NAMESPACE = "team-limited"  # the limited user's only namespace


def find_binaries() -> tuple[str | None, str | None, str]:
    """(kube-apiserver, etcd, why-not) from the env, .ci/kube-build.sh's cache, PATH."""
    apiserver = os.environ.get("DDPDEPLOY_KUBE_APISERVER")
    if not apiserver or not os.access(apiserver, os.X_OK):
        # Not built yet, or not named: a build under way is waited for (bounded).
        folder, _ = kube_build.kube_bin()
        if apiserver and os.access(apiserver, os.X_OK):
            pass
        elif folder is not None:
            apiserver = str(folder / "kube-apiserver")
        elif not apiserver:
            built = sorted(glob.glob(str(CACHE / "kube-apiserver-*" / "kube-apiserver")))
            apiserver = built[-1] if built else shutil.which("kube-apiserver")
    etcd = shutil.which("etcd")
    missing = []
    if not apiserver or not os.access(apiserver, os.X_OK):
        missing.append("kube-apiserver (run .ci/kube-build.sh or set DDPDEPLOY_KUBE_APISERVER)")
    if not etcd:
        missing.append("etcd (apt-get install etcd-server)")
    return apiserver, etcd, "; ".join(missing)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ControlPlane:
    workdir: Path
    apiserver_bin: str
    etcd_bin: str
    port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        # The apiserver's self-signed mode writes its CA and serving cert here.
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 (lives with the process)
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def start(self, timeout: float = 120, attempts: int = 3) -> None:
        for attempt in range(attempts):
            self._start_etcd()
            self._start_apiserver()
            try:
                self._wait_ready(timeout)
                break
            except RuntimeError as exc:
                # A port found free was taken before etcd or the apiserver bound it (CI
                # runs two suites at once, each making connections): new ports, new data.
                if "address already in use" not in str(exc) or attempt == attempts - 1:
                    raise
                self.stop()
                shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        self._write_kubeconfig()

    def _start_etcd(self) -> None:
        client, peer = _free_port(), _free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self._spawn(
            "etcd",
            [
                self.etcd_bin,
                "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", self.etcd_url,
                "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", peer_url,
                "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"default={peer_url}",
                "--unsafe-no-fsync",
            ],
        )  # fmt: skip

    def _start_apiserver(self) -> None:
        tokens = self.workdir / "tokens.csv"
        tokens.write_text(
            f'{ADMIN_TOKEN},admin,uid-admin,"system:masters"\n{LIMITED_TOKEN},limited,uid-limited\n'
        )
        sa_key = self.workdir / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
        )
        self.port = _free_port()
        self._spawn(
            "kube-apiserver",
            [
                self.apiserver_bin,
                "--etcd-servers", self.etcd_url,
                "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1",
                "--secure-port", str(self.port),
                "--insecure-port", "0",
                "--cert-dir", str(self.workdir / "certs"),
                "--token-auth-file", str(tokens),
                "--authorization-mode", "RBAC",
                "--service-cluster-ip-range", "10.0.0.0/24",
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(sa_key),
                "--service-account-signing-key-file", str(sa_key),
                # No controller manager creates the "default" ServiceAccount that this
                # admission plugin would demand before a pod may be created.
                "--disable-admission-plugins", "ServiceAccount",
            ],
        )  # fmt: skip

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "not started"
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited: {self.log_tail()}")
            if self.ca_file.exists():
                ctx = ssl.create_default_context(cafile=str(self.ca_file))
                req = urllib.request.Request(
                    f"{self.server}/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
                )
                try:
                    with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                        if resp.status == 200:
                            return
                except (urllib.error.URLError, OSError) as exc:
                    last = str(exc)
            time.sleep(0.5)
        raise RuntimeError(f"kube-apiserver not ready after {timeout}s ({last}): {self.log_tail()}")

    def log_tail(self) -> str:
        logs = sorted(self.workdir.glob("*.log"))
        return " | ".join(f"{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in logs)

    def _write_kubeconfig(self) -> None:
        cluster = {"server": self.server, "certificate-authority": str(self.ca_file)}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [
                {"name": "admin", "user": {"token": ADMIN_TOKEN}},
                {"name": "limited", "user": {"token": LIMITED_TOKEN}},
            ],
            "contexts": [
                {"name": "admin", "context": {"cluster": "test", "user": "admin"}},
                {
                    "name": "limited",
                    "context": {"cluster": "test", "user": "limited"},
                },
            ],
            "current-context": "admin",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def admin_client(self) -> Any:
        """A dynamic client with system:masters rights."""
        from kubernetes import config, dynamic

        api = config.new_client_from_config(str(self.kubeconfig), context="admin")
        return dynamic.DynamicClient(api, cache_file=str(self.workdir / "discovery.json"))

    def install_crd(self, crd_file: Path) -> None:
        """A plain create: 1.20 prunes the CRD's x-kubernetes-validations, which it does
        not know, while a server-side apply of the same CRD is refused."""
        admin = self.admin_client()
        crd = yaml.safe_load(crd_file.read_text())
        crds = admin.resources.get(
            api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
        )
        crds.create(body=crd)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = crds.get(name=crd["metadata"]["name"]).to_dict().get("status") or {}
            if any(
                c["type"] == "Established" and c["status"] == "True"
                for c in status.get("conditions") or []
            ):
                break
            time.sleep(0.2)
        group, version = crd["spec"]["group"], crd["spec"]["versions"][0]["name"]
        kind = crd["spec"]["names"]["kind"]
        # The custom endpoints answer 404 for a moment after Established.
        while time.monotonic() < deadline:
            try:
                admin.resources.get(api_version=f"{group}/{version}", kind=kind).get(
                    namespace="default"
                )
                return
            except Exception:
                admin.resources.invalidate_cache()
                time.sleep(0.2)
        raise RuntimeError(f"the {kind} CRD never became served")

    def stop(self) -> None:
        """Apiserver first, then etcd; each by its PID, killed if it lingers."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
