"""Emulated hosts on one machine: network namespaces joined by veth links.

Two shapes are offered:

- `netns_pair(prefix, subnet)`: namespaces "<prefix>a" and "<prefix>b" joined by
  one veth pair (each end called eth0), addresses .1 and .2 of `subnet`.
- `cluster(prefix, n, subnet)`: n namespaces "<prefix>0".."<prefix>{n-1}", each
  with an eth0 whose peer ("v<i>") sits on a bridge in a hub namespace
  "<prefix>hub". Shaping a node's eth0 limits what it sends; shaping its peer in
  the hub limits what it receives. Nothing is added to the host's own namespace.

Every veth end takes packets of at most GSO_MAX_BYTES, so the shaper's small
burst holds (see the constant).

Both are context managers that remove every namespace they made on exit, and
remove stale ones with the same names before they start (a crashed run).
`destroy_prefix` removes every namespace whose name starts with a prefix.

Namespaces are created with the `ip` command (argument lists, no shell); traffic
shaping is not done here but in `flexcomm.emulation.shaping`, through pyroute2.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

NODE_IFNAME = "eth0"
BRIDGE = "br0"
# The largest packet TCP may hand a lab veth. At the 64 KB default one segment
# crosses a shaped link inside the HTB bucket, so a 15 KB message at 10 Mbit/s took
# 0.3 ms instead of 12; at 16 KB messages of 64 KB and
# more arrive within 3% of their wire time, and 1 Gbit/s still holds both ways
# (smaller caps cost CPU: 8 KB measured 836 Mbit/s). Set before any connection:
# TCP reads it when a connection starts.
GSO_MAX_BYTES = 16384
# The smallest cap `cap_segments` sets, a slow link's segments (see
# LinkGroup.cap_segments): one packet at the lab's MTU, no offload batching.
GSO_MIN_BYTES = 1500


class NetnsError(RuntimeError):
    """An `ip` command failed; the message carries the command and its stderr."""


def ip(*args: str) -> str:
    """Run `ip ARGS...`, return stdout, raise NetnsError with stderr on failure."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


@dataclass(frozen=True)
class Node:
    """One emulated host: a namespace, its interface and its address.

    peer_ns/peer_ifname name the other end of the node's veth link (the hub side in
    a cluster, the other node in a pair), so both directions can be shaped.
    """

    ns: str
    ifname: str
    address: str
    prefixlen: int
    peer_ns: str
    peer_ifname: str

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """`cmd` prefixed so that it runs inside this node's namespace."""
        return ["ip", "netns", "exec", self.ns, *cmd]

    def run(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(cmd), **kwargs)

    def popen(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(self.argv(cmd), **kwargs)


def list_namespaces() -> list[str]:
    names = []
    for line in ip("netns", "list").splitlines():
        if line.strip():
            names.append(line.split()[0])
    return names


def destroy_prefix(prefix: str) -> list[str]:
    """Delete every namespace whose name starts with `prefix` (their veths go with
    them). Returns the names deleted."""
    if not prefix:
        raise ValueError("prefix: must not be empty (it would match every namespace)")
    gone = []
    for name in list_namespaces():
        if name.startswith(prefix):
            ip("netns", "delete", name)
            gone.append(name)
    return gone


def _hosts(subnet: str, count: int) -> tuple[list[str], int]:
    try:
        net = ipaddress.ip_network(subnet, strict=False)
    except ValueError as exc:
        raise ValueError(f"subnet: {exc}") from None
    hosts = [str(h) for _, h in zip(range(count), net.hosts(), strict=False)]
    if len(hosts) < count:
        raise ValueError(f"subnet: {subnet} has fewer than {count} host addresses")
    return hosts, net.prefixlen


def _add_namespace(name: str) -> None:
    if name in list_namespaces():
        ip("netns", "delete", name)
    ip("netns", "add", name)
    ip("-n", name, "link", "set", "lo", "up")


def _address(node: Node) -> None:
    ip("-n", node.ns, "addr", "add", f"{node.address}/{node.prefixlen}", "dev", node.ifname)
    cap_segments(node.ns, node.ifname)
    ip("-n", node.ns, "link", "set", node.ifname, "up")


def cap_segments(ns: str, ifname: str, max_bytes: int = GSO_MAX_BYTES) -> None:
    """The largest packet TCP may hand `ifname` (its gso_max_size); connections
    made from then on use it."""
    ip("-n", ns, "link", "set", "dev", ifname, "gso_max_size", str(max_bytes))


@contextmanager
def netns_pair(prefix: str, subnet: str = "10.201.0.0/24") -> Iterator[tuple[Node, Node]]:
    """Two namespaces joined by one veth pair; removed on exit."""
    (addr_a, addr_b), plen = _hosts(subnet, 2)
    ns_a, ns_b = f"{prefix}a", f"{prefix}b"
    try:
        _add_namespace(ns_a)
        _add_namespace(ns_b)
        ip("-n", ns_a, "link", "add", NODE_IFNAME, "type", "veth",
           "peer", "name", NODE_IFNAME, "netns", ns_b)
        a = Node(ns_a, NODE_IFNAME, addr_a, plen, ns_b, NODE_IFNAME)
        b = Node(ns_b, NODE_IFNAME, addr_b, plen, ns_a, NODE_IFNAME)
        _address(a)
        _address(b)
        yield a, b
    finally:
        _delete_quietly([ns_a, ns_b])


@contextmanager
def cluster(prefix: str, n: int, subnet: str = "10.213.0.0/24") -> Iterator[list[Node]]:
    """`n` namespaces on a bridge in "<prefix>hub"; removed on exit."""
    if n < 1:
        raise ValueError(f"n: need at least one node, got {n}")
    addresses, plen = _hosts(subnet, n)
    hub = f"{prefix}hub"
    names = [hub] + [f"{prefix}{i}" for i in range(n)]
    try:
        _add_namespace(hub)
        ip("-n", hub, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", hub, "link", "set", BRIDGE, "up")
        nodes = []
        for i, address in enumerate(addresses):
            node = Node(f"{prefix}{i}", NODE_IFNAME, address, plen, hub, f"v{i}")
            _add_namespace(node.ns)
            ip("-n", hub, "link", "add", node.peer_ifname, "type", "veth",
               "peer", "name", NODE_IFNAME, "netns", node.ns)
            ip("-n", hub, "link", "set", node.peer_ifname, "master", BRIDGE)
            cap_segments(hub, node.peer_ifname)
            ip("-n", hub, "link", "set", node.peer_ifname, "up")
            _address(node)
            nodes.append(node)
        yield nodes
    finally:
        _delete_quietly(names)


def _delete_quietly(names: Sequence[str]) -> None:
    present = set(list_namespaces())
    for name in names:
        if name in present:
            with contextlib.suppress(NetnsError):  # a concurrent cleanup won the race
                ip("netns", "delete", name)
