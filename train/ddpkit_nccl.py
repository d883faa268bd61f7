"""Which transport NCCL chose, read from its own debug text (NCCL_DEBUG=INFO, SUBSYS=INIT,NET).

Pure and standard library only: ``parse(text)`` takes what one rank's NCCL wrote to its
NCCL_DEBUG_FILE and says which network it picked for traffic between nodes (``IB``,
``RoCE``, ``Socket``) and which paths its channels use within and between nodes
(``P2P/IPC``, ``SHM``, ``NET/IB``, ...). The lines it reads, as NCCL 2.4 to 2.28 print them:

  NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>   devices and link layer
  NET/IB : No device found.                                              no RDMA device
  NET/Socket : Using [0]eth0:10.0.0.1<0>                                 socket interfaces
  Using network IB | Using network Socket                                the network chosen
  Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA                 one channel's path
"""

from __future__ import annotations

import re
from typing import Any

_USING_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
_IB_USING = re.compile(r"NCCL INFO NET/IB : Using (.*?)(?:;|$)")
_IB_DEVICE = re.compile(r"\[\d+\]([\w.-]+):\d+/(IB|RoCE)")
_IB_NONE = re.compile(r"NCCL INFO NET/IB : No device found")
_SOCKET_USING = re.compile(r"NCCL INFO NET/Socket : Using (.*)$")
_VIA = re.compile(r"NCCL INFO (?:Channel|Ring) .* via (\S+(?: pointer| memory)?)")
_VERSION = re.compile(r"NCCL version (\S+)")


def _path_kind(via: str) -> str:
    """'NET/IB/0/GDRDMA' -> 'NET/IB'; 'P2P/IPC/read' -> 'P2P/IPC'; old 'direct shared
    memory' -> 'SHM'; 'P2P/direct pointer' -> 'P2P/direct'."""
    if via.startswith("direct shared"):
        return "SHM"
    parts = via.split(" ")[0].split("/")
    return "/".join(parts[:2]) if parts[0] in ("NET", "P2P") else parts[0]


def parse(text: str) -> dict[str, Any]:
    """What NCCL's debug text says about its transports.

    Returns ``net`` (the network between nodes: IB, RoCE, Socket or None when the text
    does not say), ``paths`` (the channel paths seen, sorted), ``devices`` (RDMA devices
    with their link layer), ``no_rdma_device`` (NCCL looked and found none), ``version``
    and ``transport``: the one word a report shows, the network when a channel crosses
    nodes (or NCCL named it), else the fastest path within the node.
    """
    net: str | None = None
    devices: list[str] = []
    layers: set[str] = set()
    paths: set[str] = set()
    no_rdma = socket_seen = False
    version = None
    for line in text.splitlines():
        if m := _USING_NETWORK.search(line):
            net = m.group(1)
        elif m := _IB_USING.search(line):
            for dev, layer in _IB_DEVICE.findall(m.group(1)):
                devices.append(f"{dev}/{layer}")
                layers.add(layer)
        elif _IB_NONE.search(line):
            no_rdma = True
        elif _SOCKET_USING.search(line):
            socket_seen = True
        elif m := _VIA.search(line):
            paths.add(_path_kind(m.group(1)))
        elif (m := _VERSION.search(line)) and version is None:
            version = m.group(1)
    if "NET/IB" in paths:
        net = "IB"
    elif "NET/Socket" in paths:
        net = "Socket"
    elif net is None and layers:
        net = "IB"
    elif net is None and (no_rdma or socket_seen):
        net = "Socket"
    if net == "IB" and layers == {"RoCE"}:
        net = "RoCE"  # NCCL's IB transport over Ethernet ports
    return {
        "net": net,
        "transport": _summary(net, paths),
        "paths": sorted(paths),
        "devices": devices,
        "no_rdma_device": no_rdma,
        "version": version,
    }


def _summary(net: str | None, paths: set[str]) -> str:
    crosses_nodes = any(p.startswith("NET/") for p in paths)
    if crosses_nodes or (net is not None and not paths):
        return net or "unknown"
    for fast in ("NVLS", "P2P/IPC", "P2P/CUMEM", "P2P/direct", "P2P", "SHM"):
        if any(p == fast or p.startswith(fast + "/") for p in paths):
            return fast.split("/")[0]
    return next(iter(sorted(paths)), "unknown")


def rdma_fallback_warning(host: str, result: dict[str, Any]) -> str | None:
    """The warning for a job that asked for RDMA whose NCCL chose sockets, or None."""
    if result.get("net") != "Socket":
        return None
    why = (
        "NCCL found no RDMA device (no RDMA resource in the pod, or the device plugin "
        "did not mount it)"
        if result.get("no_rdma_device")
        else "no usable RDMA device: no IPC_LOCK capability (memory cannot be pinned), "
        "NCCL_IB_HCA not matching the devices, or NCCL_IB_DISABLE/NCCL_NET set"
    )
    return f"RDMA was asked for but NCCL on {host} chose TCP sockets (4-5x slower): {why}"
