"""A job's node list from its process group, so that nobody types addresses.

Every rank finds the address it reaches the group's master by (the kernel's
source address toward $MASTER_ADDR, which torchrun sets; no packet is sent), and
one `all_gather_object` at start-up gives every rank all of them. A rank on the
master's own node reaches it over loopback; it is given the address the other
nodes reach the master by instead. The list holds each node once, in rank order.

`share_nodes(source, group)` is what the hook runs on every rank when it is built:
the gather, then the list handed to rank 0's source if it asks for one (an
`AgentClient` built without `nodes`).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

import torch.distributed as dist

DISCARD_PORT = 9  # any port: a UDP connect only picks a route


def resolve(host: str) -> str | None:
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)[0][4][0]
    except (OSError, UnicodeError, IndexError):
        return None


def address_toward(ip: str) -> str | None:
    """This host's source address on the route to `ip` (None when no route reaches it)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, DISCARD_PORT))
        except OSError:
            return None
        return s.getsockname()[0]


def _is_loopback(address: str | None) -> bool:
    return address is not None and ipaddress.ip_address(address).is_loopback


def rank_address(master: str | None = None) -> tuple[str | None, str | None]:
    """(this rank's address toward the master, the master's address), None when unknown."""
    master = master if master is not None else os.environ.get("MASTER_ADDR")
    master_ip = resolve(master) if master else None
    return (address_toward(master_ip) if master_ip else None), master_ip


def node_list(seen: list[tuple[str | None, str | None]]) -> list[str]:
    """Each rank's (address, master address) -> the nodes, once each, in rank order."""
    remote_view = next((m for a, m in seen if a is not None and not _is_loopback(a)), None)
    nodes: list[str] = []
    for address, _ in seen:
        if _is_loopback(address) and remote_view is not None:
            address = remote_view  # on the master's node: where the others reach it
        if address is not None and address not in nodes:
            nodes.append(address)
    return nodes


def job_nodes(group: dist.ProcessGroup | None = None) -> list[str]:
    """The job's nodes; every rank of `group` must call it (one all_gather_object)."""
    seen: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(seen, rank_address(), group=group)
    return node_list(seen)


def share_nodes(source: object, group: dist.ProcessGroup | None = None) -> list[str]:
    """Gather the nodes (on every rank) and give them, and the job's world size,
    to `source` if it asks for them (`use_nodes`, `use_world`)."""
    nodes = job_nodes(group)
    for ask, value in (("use_nodes", nodes), ("use_world", dist.get_world_size(group))):
        use = getattr(source, ask, None)
        if callable(use):
            use(value)
    return nodes
