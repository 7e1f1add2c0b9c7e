"""Bandwidth tests on a shaped link, judged against what this host carries now."""

from __future__ import annotations

from collections.abc import Callable

from flexcomm.probe.iperf import IperfResult, run_test


def reads_the_link(read_bps: float, shaped_bps: float, peer: str, port: int, netns: str) -> bool:
    """Whether `read_bps` is what the link carries for this host now: within 20% of
    a plain timed 1 s test to `peer` from `netns`, run at once after it, and never
    above the shaped rate. A loaded host's iperf3 reads 72-83 Mbit/s of a
    100 Mbit/s link, so a fixed floor fails in a slow hour; a test too short to
    read the link (a 1 MB test reads ~65% of it) still fails."""
    carried = run_test(peer, port=port, duration_s=1.0, netns=netns).bandwidth_bps
    return 0.8 * min(carried, shaped_bps) < read_bps < 1.05 * shaped_bps


def best_reading(read: Callable[[], IperfResult], shaped_bps: float, tries: int = 3) -> IperfResult:
    """The best of up to `tries` readings of a shaped link, read again while one
    falls below 95% of the shaped rate. A loaded host only lowers a reading: in
    one suite run iperf3 read 87-90% of a 100 Mbit/s link for minutes while the
    other worker ran, and alone 99.5%. A probe that misreads the link, high or
    low, misreads it every time, so the test still fails."""
    readings = [read()]
    while len(readings) < tries and readings[-1].bandwidth_bps < 0.95 * shaped_bps:
        readings.append(read())
    return max(readings, key=lambda r: r.bandwidth_bps)
