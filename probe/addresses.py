"""This host's own addresses, and the one it reaches a peer from (netlink, through
pyroute2, in the calling process's network namespace).

- `local_addresses()`: every address configured on this host's interfaces
  (loopback included), so that a prober can refuse to measure a path to itself.
- `source_address_toward(peer)`: the address the kernel's routing would send
  from to reach `peer`, so that a server can listen where that peer connects.
- `serving_addresses(peers)`: the addresses a set of peers (a job's nodes) reach
  this host by, and `addresses_within(networks)`: this host's addresses in
  configured networks. A server bound to each of these is never on the wildcard.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _ipr():
    from pyroute2 import IPRoute

    return IPRoute()


def local_addresses() -> frozenset[str]:
    """Every IPv4 and IPv6 address on this host's interfaces, normalised."""
    with _ipr() as ipr:
        found = {msg.get_attr("IFA_ADDRESS") or msg.get_attr("IFA_LOCAL") for msg in ipr.get_addr()}
    return frozenset(_normal(a) for a in found if a)


def is_local(address: str, local: frozenset[str] | None = None) -> bool:
    """True when `address` (an IP literal) is one of this host's own: loopback,
    or configured on one of its interfaces. A name that is not an IP is not."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified:
        return True
    return str(ip) in (local if local is not None else local_addresses())


def source_address_toward(peer: str) -> str | None:
    """This host's address on the route to `peer` (an IP literal), or None when no
    route reaches it."""
    from pyroute2.netlink.exceptions import NetlinkError

    dst = _normal(peer)
    with _ipr() as ipr:
        try:
            routes = ipr.route("get", dst=dst)
        except NetlinkError:
            return None
    for route in routes:
        src = route.get_attr("RTA_PREFSRC")
        if src:
            return _normal(src)
    return None


def host_of(node: str) -> str:
    """The host of a job's node entry: "10.0.0.2", "10.0.0.2:5201", "[fd00::2]:5201",
    "fd00::2" or a name."""
    if node.startswith("["):
        return node[1:].split("]", 1)[0]
    if node.count(":") == 1:
        return node.split(":", 1)[0]
    return node


def resolve(host: str) -> str | None:
    """An IP literal as is (normalised), a name through the resolver; None if it
    does not resolve."""
    try:
        return _normal(host)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    return _normal(str(infos[0][4][0])) if infos else None


def serving_addresses(peers: Iterable[str], local: frozenset[str] | None = None) -> list[str]:
    """The addresses `peers` reach this host by: a peer that is this host at that
    address, any other at this host's source address toward it. Peers that do not
    resolve or that no route reaches are left out."""
    local = local_addresses() if local is None else local
    found = set()
    for node in peers:
        ip = resolve(host_of(node))
        if ip is None:
            continue
        source = ip if is_local(ip, local) and not ipaddress.ip_address(ip).is_unspecified else (
            source_address_toward(ip))
        if source is not None:
            found.add(source)
    return _sorted(found)


def parse_networks(field: str, text: str) -> tuple[Network, ...]:
    """Comma-separated addresses or networks ("10.0.0.5, 10.1.0.0/16"); ValueError
    naming `field`. The wildcard address is refused: it is not one address."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            net = ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise ValueError(f"{field}: {item!r} is not an IP address or network (e.g. 10.0.0.5, "
                             "10.0.0.0/24)") from None
        if net.prefixlen == net.max_prefixlen and net.network_address.is_unspecified:
            raise ValueError(f"{field}: {item} is the wildcard; give this node's addresses or "
                             "networks (e.g. 10.0.0.0/24)")
        out.append(net)
    return tuple(out)


def addresses_within(networks: Sequence[Network], local: frozenset[str] | None = None) -> list[str]:
    """This host's addresses that lie in any of `networks`."""
    local = local_addresses() if local is None else local
    inside = {a for a in local if any(ipaddress.ip_address(a) in net for net in networks)}
    return _sorted(inside)


def _sorted(addresses: Iterable[str]) -> list[str]:
    """IPv4 first, each family in numeric order."""
    ips = [ipaddress.ip_address(a) for a in addresses]
    return [str(ip) for ip in sorted(ips, key=lambda ip: (ip.version, ip))]


def _normal(address: str) -> str:
    return str(ipaddress.ip_address(address.split("%")[0]))


def socket_address(peer: str, port: int, kind: int) -> tuple[int, tuple]:
    """(family, socket address) of `peer` (a name or either family's literal) for
    sockets of `kind` (SOCK_STREAM, SOCK_DGRAM); ValueError naming it if it does not resolve."""
    try:
        family, _, _, _, address = socket.getaddrinfo(peer, port, type=kind)[0]
    except socket.gaierror as exc:
        raise ValueError(f"peer: cannot resolve {peer!r} ({exc.strerror})") from None
    return family, address


def socket_in(netns: str | None, family: int, kind: int) -> socket.socket:
    """A socket of `family` and `kind`, inside network namespace `netns` (None: this one)."""
    if netns is None:
        return socket.socket(family, kind)
    from pyroute2.netns import create_socket  # only the lab and tests need it

    return create_socket(netns, family, kind, flags=0)  # flags=0: never create
