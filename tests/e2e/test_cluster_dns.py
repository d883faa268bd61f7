"""The e2e cluster's DNS server: its answers from a fixed set of Services and Endpoints over
real UDP and TCP queries on 127.0.0.1 (fast tier), then from inside real pods on the cluster
(e2e): a replica's short name, `<svc>.<ns>.svc.cluster.local` and
`<host>.<subdomain>.<ns>.svc.cluster.local`, as a PyTorchJob's pods ask for them."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from realcluster import Cluster

pytest.importorskip("dnslib")
import cluster_dns  # noqa: E402
from dnslib import QTYPE, RCODE, DNSRecord  # noqa: E402
from dnslib.server import DNSLogger, DNSServer  # noqa: E402

SERVICES = {
    ("ns", "tj-master-0"): {"spec": {"clusterIP": "None"}},
    ("ns", "web"): {"spec": {"clusterIP": "None"}},
    ("ns", "api"): {"spec": {"clusterIP": "10.213.1.7"}},
    ("ns", "empty"): {"spec": {"clusterIP": "None"}},
}
ENDPOINTS = {
    ("ns", "tj-master-0"): {"subsets": [{"addresses": [{"ip": "10.213.0.5"}]}]},
    ("ns", "web"): {
        "subsets": [
            {
                "addresses": [
                    {"ip": "10.213.0.6", "hostname": "web-0"},
                    {"ip": "10.213.0.7", "hostname": "web-1"},
                ],
                "notReadyAddresses": [{"ip": "10.213.0.8", "hostname": "web-2"}],
            }
        ]
    },
}


class Fixed:
    """Stands for cluster_dns's Watched: a lock and the objects by (namespace, name)."""

    def __init__(self, objects: dict[tuple[str, str], Any]) -> None:
        self.lock = threading.Lock()
        self.objects = objects


@pytest.mark.parametrize(
    ("labels", "ips"),
    [
        (["tj-master-0", "ns"], ["10.213.0.5"]),
        (["web", "ns"], ["10.213.0.6", "10.213.0.7"]),  # ready endpoints only
        (["api", "ns"], ["10.213.1.7"]),
        (["empty", "ns"], []),  # exists, no address: NODATA
        (["web-1", "web", "ns"], ["10.213.0.7"]),
        (["10-213-0-6", "web", "ns"], ["10.213.0.6"]),
        (["web-2", "web", "ns"], None),  # not ready
        (["nope", "ns"], None),
        (["web", "other"], None),
        (["a", "b", "c", "d"], None),
    ],
)
def test_lookup(labels: list[str], ips: list[str] | None) -> None:
    assert cluster_dns.lookup(SERVICES, ENDPOINTS, labels) == ips


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    resolver = cluster_dns.Resolver(Fixed(SERVICES), Fixed(ENDPOINTS), "cluster.local", 5)
    quiet = DNSLogger(log="-recv,-send,-request,-reply,-truncated,-data", prefix=False)
    with socket.socket() as s:  # a port free for UDP and TCP alike, most likely
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    servers = [
        DNSServer(resolver, port=port, address="127.0.0.1", tcp=tcp, logger=quiet)
        for tcp in (False, True)
    ]
    for s in servers:
        s.start_thread()
    yield port
    for s in servers:
        s.stop()


@pytest.mark.parametrize("tcp", [False, True])
@pytest.mark.parametrize(
    ("name", "qtype", "rcode", "answers"),
    [
        ("tj-master-0.ns.svc.cluster.local", "A", RCODE.NOERROR, ["10.213.0.5"]),
        ("WEB-0.Web.ns.svc.cluster.local.", "A", RCODE.NOERROR, ["10.213.0.6"]),
        ("tj-master-0.ns.svc.cluster.local", "AAAA", RCODE.NOERROR, []),
        ("tj-master-0.svc.cluster.local", "A", RCODE.NXDOMAIN, []),
        ("pypi.org", "A", RCODE.NXDOMAIN, []),
    ],
)
def test_answers_over_the_wire(
    server: int, tcp: bool, name: str, qtype: str, rcode: int, answers: list[str]
) -> None:
    reply = DNSRecord.parse(
        DNSRecord.question(name, qtype).send("127.0.0.1", server, tcp=tcp, timeout=5)
    )
    assert reply.header.rcode == rcode
    assert reply.header.aa == 1
    assert sorted(str(rr.rdata) for rr in reply.rr if rr.rtype == QTYPE.A) == answers


def test_pods_resolve_each_other_through_the_cluster_dns(
    cluster: Cluster, namespace: str, trainer_image: str
) -> None:
    """A headless Service `web` over pod web-0 (hostname web-0, subdomain web), and a
    client pod resolving it every way a PyTorchJob's pods do, with glibc's getent."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    security = {"runAsUser": 10001, "runAsNonRoot": True}
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 80}]},
        },
    )
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "web-0", "labels": {"app": "web"}},
            "spec": {
                "hostname": "web-0",
                "subdomain": "web",
                "securityContext": security,
                "containers": [{"name": "c", "image": trainer_image, "command": ["sleep", "300"]}],
            },
        },
    )
    names = [
        "web",
        f"web.{namespace}",
        f"web.{namespace}.svc.cluster.local",
        "web-0.web",
        f"web-0.web.{namespace}.svc.cluster.local",
    ]
    # Until web-0 is ready its name does not resolve: the client waits, as pods do.
    script = (
        f"until getent hosts web-0.web >/dev/null; do sleep 1; done; "
        f"for n in {' '.join(names)}; do echo \"$n $(getent hosts $n | cut -d' ' -f1)\"; done; "
        "getent hosts no-such-name || echo 'no-such-name unknown'"
    )
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "client"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": security,
                "containers": [
                    {"name": "c", "image": trainer_image, "command": ["sh", "-c", script]}
                ],
            },
        },
    )
    deadline = time.monotonic() + 120
    while (phase := core.read_namespaced_pod("client", namespace).status.phase) not in (
        "Succeeded",
        "Failed",
    ):
        assert time.monotonic() < deadline, f"client pod still {phase}"
        time.sleep(0.5)
    log = core.read_namespaced_pod_log("client", namespace)
    assert phase == "Succeeded", log
    web_ip = core.read_namespaced_pod("web-0", namespace).status.pod_ip
    lines = dict(line.split(" ", 1) for line in log.strip().splitlines())
    assert {n: lines[n] for n in names} == {n: web_ip for n in names}
    assert lines["no-such-name"] == "unknown"
