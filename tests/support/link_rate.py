"""Whether a bandwidth test read the link, judged against what this host carries now."""

from __future__ import annotations

from flexcomm.probe.iperf import run_test


def reads_the_link(read_bps: float, shaped_bps: float, peer: str, port: int, netns: str) -> bool:
    """Whether `read_bps` is what the link carries for this host now: within 20% of
    a plain timed 1 s test to `peer` from `netns`, run at once after it, and never
    above the shaped rate. A loaded host's iperf3 reads 72-83 Mbit/s of a
    100 Mbit/s link, so a fixed floor fails in a slow hour; a test too short to
    read the link (a 1 MB test reads ~65% of it) still fails."""
    carried = run_test(peer, port=port, duration_s=1.0, netns=netns).bandwidth_bps
    return 0.8 * min(carried, shaped_bps) < read_bps < 1.05 * shaped_bps
