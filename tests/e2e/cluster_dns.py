"""Cluster DNS for the e2e cluster (Debian has no CoreDNS): a dnslib server answering from
the API's Services and Endpoints, kept by list+watch as CoreDNS's kubernetes plugin does.

Authoritative for the cluster zone (default cluster.local), A records only:

  <svc>.<ns>.svc.<zone>          a headless Service's ready endpoint addresses, or a
                                 Service's ClusterIP (which resolves but does not route:
                                 there is no kube-proxy)
  <host>.<svc>.<ns>.svc.<zone>   the endpoint of that Service whose hostname is <host> (a pod
                                 with spec.hostname and spec.subdomain) or whose IP, dashed,
                                 is <host>

A pod's short name (MASTER_ADDR=<job>-master-0) resolves through its resolv.conf's search
list (<ns>.svc.<zone> first), as on a real cluster. A name that exists but has no address
for the type asked (AAAA, or a headless Service with no ready endpoint) is NOERROR with no
answer (NODATA), like CoreDNS, so glibc keeps the A answer; anything else is NXDOMAIN: no
upstream (pods reach nothing outside the cluster here), no SRV, PTR or pod records.

Run by .ci/cluster.sh (as root, for port 53 on the bridge's address); every answer is
logged, one line each, to stdout (the cluster's logs/dns.log).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

sys.path.append(str(Path(__file__).resolve().parent))  # kubeloop; after the stdlib
from kubeloop import Obj, Watched, api_client  # noqa: E402

log = logging.getLogger("e2e-dns")


def _endpoint_addresses(endpoints: Obj | None) -> list[Obj]:
    """Ready addresses only, as CoreDNS serves them (not-ready ones are left out unless the
    Service publishes them, which the endpoints controller then lists as ready)."""
    return [
        addr
        for subset in (endpoints or {}).get("subsets") or []
        for addr in subset.get("addresses") or []
    ]


def lookup(
    services: dict[tuple[str, str], Obj],
    endpoints: dict[tuple[str, str], Obj],
    labels: list[str],
) -> list[str] | None:
    """Addresses of the name whose labels left of ``.svc.<zone>`` are ``labels``: a list
    (empty: the name exists but has no address), or None when no such name exists."""
    if len(labels) == 2:
        svc, ns = labels
        service = services.get((ns, svc))
        if service is None:
            return None
        cluster_ip = (service.get("spec") or {}).get("clusterIP")
        if cluster_ip and cluster_ip != "None":
            return [cluster_ip]
        return [a["ip"] for a in _endpoint_addresses(endpoints.get((ns, svc)))]
    if len(labels) == 3:
        host, svc, ns = labels
        if (ns, svc) not in services:
            return None
        ips = [
            a["ip"]
            for a in _endpoint_addresses(endpoints.get((ns, svc)))
            if a.get("hostname") == host or a["ip"].replace(".", "-") == host
        ]
        return ips or None
    return None


class Resolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, services: Watched, endpoints: Watched, zone: str, ttl: int) -> None:
        self.services = services
        self.endpoints = endpoints
        self.suffix = f".svc.{zone.strip('.').lower()}"
        self.ttl = ttl

    def answer(self, name: str) -> list[str] | None:
        name = name.rstrip(".").lower()
        if not name.endswith(self.suffix):
            return None
        labels = name[: -len(self.suffix)].split(".")
        with self.services.lock, self.endpoints.lock:
            return lookup(self.services.objects, self.endpoints.objects, labels)

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        reply.header.aa = 1
        q = request.q
        ips = self.answer(str(q.qname))
        qtype = QTYPE[q.qtype]
        if ips is None:
            reply.header.rcode = RCODE.NXDOMAIN
            log.info("%s %s -> NXDOMAIN", q.qname, qtype)
        elif q.qtype in (QTYPE.A, QTYPE.ANY):
            for ip in ips:
                reply.add_answer(RR(q.qname, QTYPE.A, rdata=A(ip), ttl=self.ttl))
            log.info("%s %s -> %s", q.qname, qtype, " ".join(ips) or "NODATA")
        else:
            log.info("%s %s -> NODATA", q.qname, qtype)
        return reply


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="address to serve on (UDP and TCP)")
    parser.add_argument("--port", type=int, default=53)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--zone", default="cluster.local")
    parser.add_argument("--ttl", type=int, default=5)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout
    )
    from kubernetes import client

    core = client.CoreV1Api(api_client(args.kubeconfig))
    stop = threading.Event()
    services = Watched("services", core.list_service_for_all_namespaces)
    endpoints = Watched("endpoints", core.list_endpoints_for_all_namespaces)
    for watched in (services, endpoints):
        watched.start(stop)
    resolver = Resolver(services, endpoints, args.zone, args.ttl)
    quiet = DNSLogger(log="-recv,-send,-request,-reply,-truncated,-data", prefix=False)
    servers = [
        DNSServer(resolver, port=args.port, address=args.listen, tcp=tcp, logger=quiet)
        for tcp in (False, True)
    ]
    for server in servers:
        server.start_thread()
    log.info("serving %s on %s:%d (udp, tcp)", args.zone, args.listen, args.port)
    stop.wait()


if __name__ == "__main__":
    main()
