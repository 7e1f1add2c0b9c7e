"""Traffic shaping of one interface through pyroute2 (never a `tc` subprocess).

Usage::

    from flexcomm.emulation.shaping import LinkState, Shaper

    shaper = Shaper("veth0", netns="node1")              # netns=None: this namespace
    Shaper("eth1", allowed={"eth0"})                    # ValueError: not allow-listed
    shaper.apply(LinkState(50e6))                       # 50 Mbit/s, rate only
    shaper.apply(LinkState(20e6, delay_s=0.01, jitter_s=0.002, loss=0.001))
    shaper.show()                                       # kernel state read back, a dict
    shaper.remove()                                     # our tree gone: kernel default

`LinkState(rate_bps, delay_s=0, jitter_s=0, loss=0)` is the full state of a link:
rate in bits/s, delay and jitter in seconds, loss a fraction in [0, 1].

The tree `apply` builds (handles as tc prints them)::

    root  htb 1: default 1        (default 0 when peers are given: others go unshaped)
      class 1:1  rate, ceil 1.2x  (or one class 1:10, 1:11, ... per peer)
        leaf 201: netem           (delay/jitter/loss), or 101: pfifo when none is asked
    u32 filters on 1: sending dst <peer>/32 to that peer's class

Every `apply` sends the whole tree with `replace`, so a step changes the link in
place (no teardown, no moment unshaped) and applying twice is harmless.
`plan(state)` returns the requests `apply` would send; `str()` of one reads like
the tc command it matches (tcconfig style, for --dry-run).

Delay, jitter and loss need the kernel's sch_netem; a kernel without it makes
`apply` raise `NetemUnavailable`, naming the module. Rate-only shaping needs HTB
alone. Recording and restoring the interface's original qdisc is `revert.py`'s job.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flexcomm.policy.types import PLAIN_LINK, LinkBucket
from flexcomm.units import format_rate, format_seconds, require_finite_positive

ROOT_HANDLE = 0x10000  # 1:
TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1
ETH_P_IP = 0x0800
FILTER_PRIO = 1
LEAF_LIMIT = 1000  # packets, the kernel's default txqueuelen
NETEM_MODULE = "sch_netem"
# Each HTB class has two buckets. The ceil bucket is the burst after idle: a
# quarter millisecond at the rate, never under one full Ethernet frame, so a 16 KB
# message crosses a 50 Mbit/s lab link in about its 2.6 ms wire time (a 1 ms bucket
# let it through in 1.2 ms). The rate bucket is what the link may win back after
# the CPU that runs it stalls: a late qdisc timer finds the ceil bucket full and
# loses the rest of the stall, and on a noisy VM that lost 22% of 50 Mbit/s to
# iperf3 (a loaded CI machine). With the rate bucket holding RATE_BUCKET_SECONDS
# and the ceil set CEIL_OVER_RATE above the rate, a backlogged link makes up each
# stall of up to 5 ms at that margin; the long-run rate stays the rate bucket's,
# and after idle a message of under ~25 ms of wire time crosses at the ceil, at
# 1/1.2 of its wire time (docs/BENCHMARKS.md). A packet larger than the ceil
# bucket still leaves at once after idle, so a segmentation offload of 64 KB
# (TSO/GSO) makes the effective burst 64 KB whatever is set here; the lab caps its
# veths' segments (`flexcomm.lab.netns.cap_segments`) so that small messages see
# the rate.
BURST_SECONDS = 0.00025
CEIL_OVER_RATE = 1.2
RATE_BUCKET_SECONDS = 0.005
BURST_FLOOR_BYTES = 1514  # MTU 1500 plus the Ethernet header


class InterfaceMissing(ValueError):
    """The interface (or its namespace) does not exist."""


class NetemUnavailable(RuntimeError):
    """The kernel has no sch_netem, so delay, jitter and loss cannot be emulated."""


@dataclass(frozen=True)
class LinkState:
    """The full emulated state of a link: rate (bits/s), delay and jitter (s),
    loss (fraction of packets dropped, 0..1)."""

    rate_bps: float
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        require_finite_positive("rate", self.rate_bps)
        require_finite_positive("delay", self.delay_s, allow_zero=True)
        require_finite_positive("jitter", self.jitter_s, allow_zero=True)
        require_finite_positive("loss", self.loss, allow_zero=True)
        if self.loss > 1:
            raise ValueError(f"loss: must be between 0 and 1, got {self.loss!r}")
        if self.jitter_s > 0 and self.delay_s == 0:
            raise ValueError("jitter: needs a delay (jitter varies the delay)")

    @property
    def needs_netem(self) -> bool:
        return self.delay_s > 0 or self.jitter_s > 0 or self.loss > 0

    def describe(self) -> str:
        parts = [format_rate(self.rate_bps)]
        if self.delay_s:
            parts.append(f"delay {format_seconds(self.delay_s)}")
        if self.jitter_s:
            parts.append(f"jitter {format_seconds(self.jitter_s)}")
        if self.loss:
            parts.append(f"loss {self.loss * 100:g}%")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, float]:
        return {"rate_bps": self.rate_bps, "delay_s": self.delay_s,
                "jitter_s": self.jitter_s, "loss": self.loss}


@dataclass(frozen=True)
class TcRequest:
    """One pyroute2 `IPRoute.tc(command, kind, index, **kwargs)` call."""

    command: str
    kind: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the tc command line this request matches

    def send(self, ipr: Any, index: int) -> None:
        ipr.tc(self.command, self.kind, index, **self.kwargs)

    def __str__(self) -> str:
        return self.text


def format_handle(handle: int) -> str:
    if handle == TC_H_ROOT:
        return "root"
    if handle == TC_H_INGRESS:
        return "ingress"
    major, minor = handle >> 16, handle & 0xFFFF
    return f"{major:x}:" if minor == 0 else f"{major:x}:{minor:x}"


def class_ids(peers: Sequence[str]) -> list[int]:
    """The HTB class of each shaped flow: 1:1 for the whole link, 1:10+i per peer."""
    if not peers:
        return [ROOT_HANDLE | 0x1]
    return [ROOT_HANDLE | (0x10 + i) for i in range(len(peers))]


def leaf_handle(classid: int, kind: str) -> int:
    """The leaf qdisc's handle: 1xx: for pfifo, 2xx: for netem. They differ because
    the kernel refuses to replace a qdisc by one of another kind under one handle."""
    base = 0x200 if kind == "netem" else 0x100
    return (base + (classid & 0xFFFF)) << 16


def burst_bytes(rate_bps: float) -> int:
    """What a link shaped to `rate_bps` passes at once after idle (HTB's cburst), bytes."""
    return max(int(rate_bps / 8 * BURST_SECONDS), BURST_FLOOR_BYTES)


def rate_bucket_bytes(rate_bps: float) -> int:
    """HTB's rate bucket (burst) for `rate_bps`: the stall a backlogged link makes up, bytes."""
    return max(int(rate_bps / 8 * RATE_BUCKET_SECONDS), BURST_FLOOR_BYTES)


def _htb_root(dev: str, peers: Sequence[str]) -> TcRequest:
    default = 0 if peers else 1
    return TcRequest(
        "replace", "htb", {"handle": ROOT_HANDLE, "parent": TC_H_ROOT, "default": default},
        f"tc qdisc replace dev {dev} root handle 1: htb default {default:x}",
    )


def _htb_class(dev: str, classid: int, state: LinkState, ceil_over_rate: float) -> TcRequest:
    rate, ceil = f"{int(state.rate_bps)}bit", f"{int(state.rate_bps * ceil_over_rate)}bit"
    burst, cburst = rate_bucket_bytes(state.rate_bps), burst_bytes(state.rate_bps)
    quantum = min(max(int(state.rate_bps / 8 / 10), 1600), 200_000)
    return TcRequest(
        "replace-class", "htb",
        {"handle": classid, "parent": ROOT_HANDLE, "rate": rate, "ceil": ceil,
         "burst": burst, "cburst": cburst, "quantum": quantum},
        f"tc class replace dev {dev} parent 1: classid {format_handle(classid)} htb "
        f"rate {rate} ceil {ceil} burst {burst}b cburst {cburst}b quantum {quantum}",
    )


def _leaf(dev: str, classid: int, state: LinkState) -> TcRequest:
    kind = "netem" if state.needs_netem else "pfifo"
    parent, handle = format_handle(classid), format_handle(leaf_handle(classid, kind))
    if kind == "pfifo":
        return TcRequest(
            "replace", "pfifo",
            {"handle": leaf_handle(classid, kind), "parent": classid, "limit": LEAF_LIMIT},
            f"tc qdisc replace dev {dev} parent {parent} handle {handle} pfifo limit {LEAF_LIMIT}",
        )
    delay_us, jitter_us = round(state.delay_s * 1e6), round(state.jitter_s * 1e6)
    loss_pct = state.loss * 100
    return TcRequest(
        "replace", "netem",
        {"handle": leaf_handle(classid, kind), "parent": classid, "delay": delay_us,
         "jitter": jitter_us, "loss": loss_pct, "limit": LEAF_LIMIT},
        f"tc qdisc replace dev {dev} parent {parent} handle {handle} netem "
        f"delay {delay_us}us {jitter_us}us loss {loss_pct:g}% limit {LEAF_LIMIT}",
    )


def _u32_filter(dev: str, position: int, peer: str, classid: int) -> TcRequest:
    address = int(ipaddress.IPv4Address(peer))
    handle = 0x80000800 + position + 1  # 800::<n>: fixed, so `replace` is idempotent
    return TcRequest(
        "replace-filter", "u32",
        {"handle": handle, "parent": ROOT_HANDLE, "prio": FILTER_PRIO, "protocol": ETH_P_IP,
         "target": classid, "keys": [f"0x{address:08x}/0xffffffff+16"]},
        f"tc filter replace dev {dev} parent 1: protocol ip prio {FILTER_PRIO} handle "
        f"800::{0x800 + position + 1:x} u32 match ip dst {peer}/32 flowid {format_handle(classid)}",
    )


def our_root(peers: Sequence[str] = ()) -> dict[str, Any]:
    """The root `build_requests` leaves behind, as it describes a current root."""
    return {"kind": "htb", "handle": ROOT_HANDLE, "default": 0 if peers else 1,
            "classes": class_ids(peers)}


def build_requests(dev: str, state: LinkState, peers: Sequence[str] = (),
                   root: dict[str, Any] | None = None,
                   ceil_over_rate: float = CEIL_OVER_RATE) -> list[TcRequest]:
    """Every request that puts `state` on `dev`, in order. `root` describes the
    current root qdisc ({"kind", "handle", "default", "classes"}, or None): HTB has
    no change operation, so an HTB root of ours is kept and only its classes and
    leaves are replaced; one built for other peers is deleted and rebuilt.
    `ceil_over_rate` 1.0 makes no stalls up: one small bucket, as a wire."""
    requests = []
    ours = root is not None and root["kind"] == "htb" and root["handle"] == ROOT_HANDLE
    same_tree = ours and root.get("default") == (0 if peers else 1) and set(
        root.get("classes", ())) == set(class_ids(peers))
    if ours and not same_tree:
        requests.append(TcRequest("del", None, {"parent": TC_H_ROOT},
                                  f"tc qdisc del dev {dev} root"))
    if not same_tree:
        requests.append(_htb_root(dev, peers))
    for classid in class_ids(peers):
        requests.append(_htb_class(dev, classid, state, ceil_over_rate))
        requests.append(_leaf(dev, classid, state))
    for position, peer in enumerate(peers):
        requests.append(_u32_filter(dev, position, peer, class_ids(peers)[position]))
    return requests


def check_peers(peers: Iterable[str]) -> list[str]:
    checked = []
    for peer in peers:
        try:
            checked.append(str(ipaddress.IPv4Address(peer)))
        except ValueError:
            raise ValueError(f"peer: not an IPv4 address: {peer!r}") from None
    if len(set(checked)) != len(checked):
        raise ValueError(f"peer: given twice in {checked}")
    return checked


NETNS_DIR = "/var/run/netns"
CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0


def netlink_socket_in(netns: str) -> socket.socket:
    """A NETLINK_ROUTE socket that lives in namespace `netns` (a name under
    /var/run/netns, or a path). It is opened by a short-lived thread that enters
    the namespace (setns changes only the calling thread). pyroute2's own
    `IPRoute(netns=...)` forks a helper instead and stops it with SIGTERM; in a
    process with threads (gRPC) or its own SIGTERM handling that fork is a hazard."""
    path = netns if "/" in netns else os.path.join(NETNS_DIR, netns)
    made: dict[str, Any] = {}

    def enter_and_open() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(path, "rb") as handle:
                if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns: {os.strerror(code)}", path)
            made["socket"] = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
        except BaseException as exc:  # handed to the caller's thread
            made["error"] = exc

    worker = threading.Thread(target=enter_and_open, name=f"netns-{netns}")
    worker.start()
    worker.join()
    if "error" in made:
        if isinstance(made["error"], FileNotFoundError):
            raise InterfaceMissing(f"netns: no network namespace named {netns!r}") from None
        raise made["error"]
    return made["socket"]


def _default_ipr_factory(netns: str | None) -> Any:
    from pyroute2 import IPRoute

    if netns is None:
        return IPRoute()
    sock = netlink_socket_in(netns)
    try:
        return IPRoute(fileno=sock.detach())
    except BaseException:
        sock.close()
        raise


class Shaper:
    """Shapes egress of one interface `ifname` (in namespace `netns`); traffic to
    `peers` only when peers are given. It touches no other interface.
    `ceil_over_rate` is how far over its rate a backlogged link may run to make
    up time a stalled CPU lost (see CEIL_OVER_RATE); 1.0 makes none up."""

    def __init__(self, ifname: str, netns: str | None = None, peers: Iterable[str] = (),
                 allowed: Collection[str] | None = None,
                 ipr_factory: Callable[[str | None], Any] = _default_ipr_factory,
                 ceil_over_rate: float = CEIL_OVER_RATE) -> None:
        if not ifname:
            raise ValueError("dev: an interface name is required")
        if not 1.0 <= ceil_over_rate <= 2.0:
            raise ValueError(f"ceil_over_rate: must be between 1 and 2, got {ceil_over_rate!r}")
        if allowed is not None and ifname not in allowed:
            raise ValueError(f"dev: {ifname!r} is not in the allow-list of interfaces that may "
                             f"be shaped ({', '.join(sorted(allowed)) or 'empty'})")
        self.ifname = ifname
        self.netns = netns
        self.peers = check_peers(peers)
        self._ipr_factory = ipr_factory
        self.ceil_over_rate = ceil_over_rate

    @property
    def bucket(self) -> LinkBucket:
        """The token bucket the shaped link has, as the cost model takes it: the
        ceil over the rate, and the rate bucket as the credit it may spend there
        (a plain link when the ceil is the rate)."""
        if self.ceil_over_rate == 1.0:
            return PLAIN_LINK
        return LinkBucket(self.ceil_over_rate, RATE_BUCKET_SECONDS)

    @property
    def where(self) -> str:
        return f"{self.ifname} (netns {self.netns})" if self.netns else self.ifname

    def _open(self) -> tuple[Any, int]:
        ipr = self._ipr_factory(self.netns)
        found = ipr.link_lookup(ifname=self.ifname)
        if not found:
            ipr.close()
            place = f" in netns {self.netns!r}" if self.netns else ""
            raise InterfaceMissing(f"dev: no interface named {self.ifname!r}{place}")
        return ipr, found[0]

    def plan(self, state: LinkState, *, after_apply: bool = False) -> list[TcRequest]:
        """The requests `apply(state)` would send now (reads the current root), or,
        with `after_apply`, once an earlier `apply` has built the tree."""
        if after_apply:
            return self._requests(state, our_root(self.peers))
        ipr, index = self._open()
        try:
            return self._requests(state, _root_qdisc(ipr, index))
        finally:
            ipr.close()

    def _requests(self, state: LinkState, root: dict[str, Any] | None) -> list[TcRequest]:
        return build_requests(self.ifname, state, self.peers, root, self.ceil_over_rate)

    def apply(self, state: LinkState) -> None:
        """Put `state` on the link: the whole tree, each part with `replace`."""
        from pyroute2.netlink.exceptions import NetlinkError

        ipr, index = self._open()
        try:
            for request in self._requests(state, _root_qdisc(ipr, index)):
                try:
                    request.send(ipr, index)
                except NetlinkError as exc:
                    if request.kind == "netem" and exc.code == errno.ENOENT:
                        raise NetemUnavailable(
                            f"delay/jitter/loss need the kernel module {NETEM_MODULE}, which "
                            f"this kernel does not have (try `modprobe {NETEM_MODULE}`); "
                            "rate-only shaping works without it"
                        ) from None
                    raise RuntimeError(f"{self.where}: `{request}` failed: {exc}") from exc
        finally:
            ipr.close()

    def remove(self) -> bool:
        """Delete our root qdisc (the kernel then attaches its default one).
        Returns False when the root is not ours, in which case nothing is done."""
        ipr, index = self._open()
        try:
            root = _root_qdisc(ipr, index)
            if root is None or root["kind"] != "htb" or root["handle"] != ROOT_HANDLE:
                return False
            ipr.tc("del", index=index, parent=TC_H_ROOT)
            return True
        finally:
            ipr.close()

    def show(self) -> dict[str, Any]:
        """The interface's tc state read back from the kernel (no counters, so two
        reads of an unchanged interface are equal)."""
        ipr, index = self._open()
        try:
            qdiscs = [_qdisc_view(m) for m in ipr.get_qdiscs(index)]
            classes = [_class_view(m) for m in ipr.get_classes(index)]
            filters = [
                view for m in ipr.get_filters(index, parent=ROOT_HANDLE)
                if (view := _filter_view(m)) is not None
            ] if _is_ours(root_qdisc({"qdiscs": qdiscs})) else []
        finally:
            ipr.close()
        shown: dict[str, Any] = {
            "dev": self.ifname, "netns": self.netns,
            "qdiscs": sorted(qdiscs, key=lambda q: (q["parent"] != "root", q["handle"])),
            "classes": sorted(classes, key=lambda c: c["classid"]),
            "filters": sorted(filters, key=lambda f: f["handle"]),
        }
        shown["shaping"] = shaping_summary(shown)
        return shown


def _root_qdisc(ipr: Any, index: int) -> dict[str, Any] | None:
    for message in ipr.get_qdiscs(index):
        if message["parent"] == TC_H_ROOT:
            root = {"kind": message.get_attr("TCA_KIND"), "handle": message["handle"]}
            options = message.get_attr("TCA_OPTIONS")
            init = options.get_attr("TCA_HTB_INIT") if root["kind"] == "htb" and options else None
            if init is not None:
                root["default"] = init["defcls"]
                root["classes"] = [c["handle"] for c in ipr.get_classes(index)]
            return root
    return None


def root_qdisc(view: dict[str, Any]) -> dict[str, Any] | None:
    """The root qdisc entry of a `Shaper.show()` result."""
    return next((q for q in view["qdiscs"] if q["parent"] == "root"), None)


def _is_ours(root: dict[str, Any] | None) -> bool:
    return root is not None and root["kind"] == "htb" and root["handle"] == "1:"


def _qdisc_view(message: Any) -> dict[str, Any]:
    kind = message.get_attr("TCA_KIND")
    view: dict[str, Any] = {"kind": kind, "handle": format_handle(message["handle"]),
                            "parent": format_handle(message["parent"])}
    options = message.get_attr("TCA_OPTIONS")
    if kind == "htb" and options is not None:
        init = options.get_attr("TCA_HTB_INIT")
        if init is not None:
            view["default"] = f"{init['defcls']:x}"
    elif kind == "netem" and options is not None:
        from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

        view["delay_s"] = options["delay"] / tick_in_usec / 1e6
        view["jitter_s"] = options["jitter"] / tick_in_usec / 1e6
        view["loss"] = options["loss"] / (2**32 - 1)
        view["limit"] = options["limit"]
    elif kind in ("pfifo", "bfifo") and options is not None:
        view["limit"] = options["limit"]
    return view


def _class_view(message: Any) -> dict[str, Any]:
    view: dict[str, Any] = {"kind": message.get_attr("TCA_KIND"),
                            "classid": format_handle(message["handle"]),
                            "parent": format_handle(message["parent"])}
    options = message.get_attr("TCA_OPTIONS")
    parms = options.get_attr("TCA_HTB_PARMS") if options is not None else None
    if parms is not None:
        rate = options.get_attr("TCA_HTB_RATE64") or parms["rate"]
        ceil = options.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
        view["rate_bps"] = rate * 8
        view["ceil_bps"] = ceil * 8
    return view


def _filter_view(message: Any) -> dict[str, Any] | None:
    if message.get_attr("TCA_KIND") != "u32":
        return None
    options = message.get_attr("TCA_OPTIONS")
    classid = options.get_attr("TCA_U32_CLASSID") if options is not None else None
    if classid is None:
        return None  # the hash table u32 creates by itself, not a rule
    return {"kind": "u32", "handle": f"{message['handle'] >> 20:x}::{message['handle'] & 0xFFF:x}",
            "classid": format_handle(classid), "match": _u32_matches(message)}


def _u32_matches(message: Any) -> list[str]:
    """'dst 10.0.0.2/32'-style text of a u32 filter's keys, read from the raw
    message (pyroute2 0.9.7 decodes tc_u32_key fields shifted by one)."""
    sel = _find_nla(message.data, message.offset + 16 + 20, message["header"]["length"] - 36,
                    [2, 5])  # TCA_OPTIONS -> TCA_U32_SEL
    if sel is None:
        return []
    nkeys = sel[2]
    matches = []
    for i in range(nkeys):
        mask, value = struct.unpack_from(">II", sel, 16 + 16 * i)
        (offset,) = struct.unpack_from("=i", sel, 16 + 16 * i + 8)
        if offset in (12, 16):
            prefix = bin(mask).count("1")
            side = "src" if offset == 12 else "dst"
            matches.append(f"{side} {socket.inet_ntoa(struct.pack('>I', value))}/{prefix}")
        else:
            matches.append(f"{value:08x}/{mask:08x} at {offset}")
    return matches


def _find_nla(data: bytes, start: int, length: int, path: list[int]) -> bytes | None:
    end = start + length
    position = start
    while position + 4 <= end:
        nla_len, nla_type = struct.unpack_from("=HH", data, position)
        if nla_len < 4:
            return None
        if nla_type & 0x3FFF == path[0]:
            body = position + 4
            if len(path) == 1:
                return data[body:position + nla_len]
            return _find_nla(data, body, nla_len - 4, path[1:])
        position += (nla_len + 3) & ~3
    return None


def shaping_summary(view: dict[str, Any]) -> dict[str, Any] | None:
    """The LinkState of each flexcomm class in a `show()` result, or None when
    the interface is not shaped by flexcomm."""
    if not _is_ours(root_qdisc(view)):
        return None
    leaves = {q["parent"]: q for q in view["qdiscs"]}
    peers = {f["classid"]: f["match"] for f in view["filters"]}
    summary: dict[str, Any] = {}
    for cls in view["classes"]:
        if "rate_bps" not in cls:
            continue
        leaf = leaves.get(cls["classid"], {})
        summary[cls["classid"]] = {
            "rate_bps": cls["rate_bps"],
            "delay_s": leaf.get("delay_s", 0.0),
            "jitter_s": leaf.get("jitter_s", 0.0),
            "loss": leaf.get("loss", 0.0),
            "match": peers.get(cls["classid"], ["all"]),
        }
    return summary
