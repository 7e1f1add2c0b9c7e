"""This host's own addresses, and the one it reaches a peer from (netlink, through
pyroute2, in the calling process's network namespace).

- `local_addresses()`: every address configured on this host's interfaces
  (loopback included), so that a prober can refuse to measure a path to itself.
- `source_address_toward(peer)`: the address the kernel's routing would send
  from to reach `peer`, so that a server can listen where that peer connects.
"""

from __future__ import annotations

import ipaddress


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


def _normal(address: str) -> str:
    return str(ipaddress.ip_address(address.split("%")[0]))
