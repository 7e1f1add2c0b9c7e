"""The lab's emulated cluster: N nodes whose links are shaped together, and the
processes started on them, all removed however the run ends.

    with LabCluster.open(prefix="flexlab", n=4, subnet="10.213.0.0/24", run_dir=out) as c:
        c.links.apply(LinkState(50e6))                 # every node's link, both ways
        proc = c.spawn(0, [sys.executable, "-m", ...], log=out / "rank0.log")
        ...
    # processes stopped, links restored, namespaces gone

With root it is a `flexcomm.lab.netns.cluster` (namespaces on a bridge); each
node's link is shaped in both directions (its eth0, and its peer on the hub's
bridge) through `flexcomm.emulation.shaping`, the original qdiscs recorded with
`flexcomm.emulation.revert` in the run directory. Without root it is "loopback": every
node is 127.0.0.1 in this namespace and nothing is shaped (`shaped` is False).
Before it starts, whatever a killed run with the same prefix left is removed
(`flexcomm.lab.cleanup`).

The cost-model sweep (`flexcomm lab calibrate`) reuses it: one cluster, many
`links.apply(...)`, many spawned jobs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexcomm.emulation.revert import Revert
from flexcomm.emulation.shaping import BURST_SECONDS, CEIL_OVER_RATE, LinkState, Shaper, burst_bytes
from flexcomm.lab import cleanup, netns
from flexcomm.policy.types import PLAIN_LINK, LinkBucket
from flexcomm.probe.process_group import end_group

STOP_GRACE_S = 3.0


@dataclass(frozen=True)
class LabNode:
    """One node: its address, its interface (for GLOO_SOCKET_IFNAME) and how to
    run a command on it. `ns` is None on loopback."""

    index: int
    address: str
    ifname: str
    ns: str | None

    def argv(self, cmd: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *cmd] if self.ns else list(cmd)


def can_use_namespaces() -> tuple[bool, str]:
    """(True, "") when this process may create namespaces, else (False, why)."""
    if os.geteuid() != 0:
        return False, "not running as root"
    if shutil.which("ip") is None:
        return False, "the `ip` command (iproute2) is missing"
    if not os.path.exists("/proc/self/ns/net"):
        return False, "the kernel has no network namespaces"
    return True, ""


def segment_cap(rate_bps: float) -> int:
    """What `rate_bps` carries in the shaper's burst time (BURST_SECONDS), held to one packet to 16 KB."""
    return int(min(netns.GSO_MAX_BYTES, max(netns.GSO_MIN_BYTES, rate_bps / 8 * BURST_SECONDS)))


def burst_after_idle(rate_bps: float) -> int:
    """Bytes a link shaped to `rate_bps`, its segments capped for that rate
    (`LinkGroup.cap_segments`), passes at line rate after idle: the HTB burst
    (`burst_bytes`, the ceil bucket) or one segment, whichever is larger."""
    return max(burst_bytes(rate_bps), segment_cap(rate_bps))


class LinkGroup:
    """Every shaped link end of the cluster, changed together: a drop-in for one
    `Shaper` where `flexcomm.emulation.emulator.Emulator` expects one."""

    def __init__(self, shapers: Sequence[Shaper], state_dir: Path) -> None:
        self.shapers = list(shapers)
        self.reverts = [Revert(s, directory=state_dir) for s in self.shapers]
        self.state: LinkState | None = None

    @property
    def where(self) -> str:
        return f"{len(self.shapers)} link ends"

    @property
    def bucket(self) -> LinkBucket:
        """The links' token bucket (every end is shaped alike)."""
        return self.shapers[0].bucket

    def apply(self, state: LinkState) -> None:
        for shaper, revert in zip(self.shapers, self.reverts, strict=True):
            revert.record("run")
            shaper.apply(state)
        self.state = state

    def cap_segments(self, rate_bps: float) -> int:
        """Cap every link end's segments at what `rate_bps` carries in the shaper's
        burst time (one packet to 16 KB): with 16 KB segments below 500 Mbit/s one
        segment outlasts the burst yet leaves whole after idle, so AR-Topk Tree's
        4-16 KB messages would beat the rate. TCP
        reads the cap when a connection starts: call it before the job connects.
        A run that changes rate mid-job keeps the 16 KB default, because small
        segments cost CPU at 1 Gbit/s. Returns the cap in bytes."""
        cap = segment_cap(rate_bps)
        for shaper in self.shapers:
            assert shaper.netns is not None  # lab link ends always live in a namespace
            netns.cap_segments(shaper.netns, shaper.ifname, cap)
        return cap

    def restore(self) -> None:
        """Put every link end back as it was (kernel default qdisc)."""
        errors = []
        for revert in self.reverts:
            try:
                revert.restore()
            except Exception as exc:  # keep restoring the others
                errors.append(str(exc))
        self.state = None
        if errors:
            raise RuntimeError("; ".join(errors))


class LabCluster:
    def __init__(self, nodes: list[LabNode], links: LinkGroup | None, prefix: str,
                 reason_unshaped: str = "") -> None:
        self.nodes = nodes
        self.links = links
        self.prefix = prefix
        self.reason_unshaped = reason_unshaped
        self._procs: list[subprocess.Popen] = []

    @property
    def shaped(self) -> bool:
        return self.links is not None

    @property
    def bucket(self) -> LinkBucket:
        """What the cost model should take the links to be: their shaper's token
        bucket, or a plain link on loopback."""
        return self.links.bucket if self.links is not None else PLAIN_LINK

    @classmethod
    @contextlib.contextmanager
    def open(cls, *, prefix: str, n: int, subnet: str, run_dir: Path,
             namespaces: bool | None = None,
             ceil_over_rate: float = CEIL_OVER_RATE) -> Iterator[LabCluster]:
        """The cluster; `namespaces=None` uses them when this process can.
        `ceil_over_rate` goes to every link's `Shaper`."""
        usable, why = can_use_namespaces()
        if namespaces is None:
            namespaces = usable
        elif namespaces and not usable:
            raise ValueError(f"namespaces: cannot create network namespaces ({why})")
        with ExitStack() as stack:
            stack.enter_context(cleanup.held(prefix))
            cleanup.clean(prefix, own=True)  # what a killed run with this prefix left
            if namespaces:
                found = stack.enter_context(netns.cluster(prefix, n, subnet))
                nodes = [LabNode(i, nd.address, nd.ifname, nd.ns) for i, nd in enumerate(found)]
                links = LinkGroup(_link_shapers(found, ceil_over_rate), Path(run_dir) / "emulation-state")
                stack.callback(links.restore)
                lab = cls(nodes, links, prefix)
            else:
                nodes = [LabNode(i, "127.0.0.1", "lo", None) for i in range(n)]
                lab = cls(nodes, None, prefix, why or "namespaces turned off")
            stack.callback(lab.stop_all)  # runs first: processes go before links
            yield lab

    def spawn(self, index: int, cmd: Sequence[str], *, log: Path,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start `cmd` on node `index` in its own process group, output to `log`,
        marked with the cluster's prefix (`flexcomm lab clean` finds it by that)."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                self.nodes[index].argv(cmd), stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {}), cleanup.LAB_ENV: self.prefix}, start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process's group, SIGKILL it after `grace_s` (never once the
        process was reaped: its group's id may be another's by then)."""
        end_group(proc, grace_s, signal.SIGTERM)
        if proc in self._procs:
            self._procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self._procs):
            self.stop(proc)
        # What the group of a process reaped before (a rank that ended) left carries the mark.
        cleanup.kill_all(cleanup.marked_pids(self.prefix), lambda: cleanup.marked_pids(self.prefix))


def _link_shapers(nodes: Sequence[netns.Node], ceil_over_rate: float) -> list[Shaper]:
    shapers = []
    for node in nodes:
        shapers.append(Shaper(node.ifname, netns=node.ns, ceil_over_rate=ceil_over_rate))
        shapers.append(Shaper(node.peer_ifname, netns=node.peer_ns, ceil_over_rate=ceil_over_rate))
    return shapers


def describe(lab: LabCluster) -> dict[str, Any]:
    return {
        "prefix": lab.prefix,
        "nodes": [{"address": n.address, "ifname": n.ifname, "ns": n.ns} for n in lab.nodes],
        "shaped": lab.shaped,
        "reason_unshaped": lab.reason_unshaped,
    }
