"""Time every collective the client offers on the emulated cluster, over a grid.

For each N, one lab cluster of N namespaces (`flexcomm.lab.cluster.LabCluster`);
for each link rate, every node's link is shaped in both directions (its eth0 and
its hub-side peer, replaced in place between rates, never torn down) and one
gloo process group of N real rank processes
(`flexcomm.lab.collective_timer`, GLOO_SOCKET_IFNAME=eth0) times the grid.

Per configuration the runner also measures what the agent's probes would
report between two nodes: the latency a TCP connect sees (half the median
connect RTT) and the iperf3 goodput (one stream, two seconds, the agent's
default test; the median of three), which is the rate less TCP/IP header
overhead. The links' token bucket is recorded with it. The result is one
`Measured` row per (rate, N, size, collective, CR):
the median over repetitions of the operation time (max over ranks of the end
minus max over ranks of the start), and the repetitions themselves.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from flexcomm.emulation.shaping import LinkState
from flexcomm.lab.cluster import LabCluster, LabNode, burst_after_idle
from flexcomm.policy.costmodel import sync_time
from flexcomm.policy.types import (
    AG_TOPK,
    ART_RING,
    ART_TREE,
    DENSE_RING,
    PLAIN_LINK,
    LinkBucket,
    NetworkObservation,
    check_cr,
)
from flexcomm.probe.iperf import IperfServer, run_test
from flexcomm.probe.latency import rtt_burst

COLLECTIVES = (DENSE_RING, AG_TOPK, ART_RING, ART_TREE)
MASTER_PORT = 29561
CLOSED_PORT = 9  # nothing listens: the RST answer is the round trip
IPERF_PORT = 5299
PROBE_SECONDS = 2  # one whole-duration iperf3 test (the agent's are shorter: docs/CONFIGURATION.md)
# Probes per configuration, their median taken: one disturbed 2 s test read 30%
# of a 50 Mbit/s link whose collectives then ran at its rate (docs/BENCHMARKS.md).
PROBES = 3
LAUNCH_S = 20.0  # torch import + process group start on a loaded 2-core machine
PER_OP_OVERHEAD_S = 0.01  # barrier + Python per timed operation
# Repetitions by the model's estimate of an operation: (shorter than, repetitions).
# Operations of a few ms see 3-4 ms scheduling stalls on a shared 2-core VM in
# 5-25% of repetitions, so the median of 15 moved ~20% between halves of the
# same run; 45 halve that for a fraction of the grid's time.
REPEAT_TIERS = ((0.02, 45), (0.2, 15))


@dataclass(frozen=True)
class Grid:
    rates_bps: tuple[float, ...] = (1000e6, 200e6, 50e6, 10e6)
    nodes: tuple[int, ...] = (2, 4)
    sizes: tuple[int, ...] = (1_000_000, 4_000_000, 16_000_000)
    crs: tuple[float, ...] = (0.1, 0.033, 0.011, 0.004, 0.001)
    repeats: int = 3
    collectives: tuple[str, ...] = COLLECTIVES

    def __post_init__(self) -> None:
        for name in ("rates_bps", "nodes", "sizes", "crs", "collectives"):
            if not getattr(self, name):
                raise ValueError(f"{name}: must not be empty")
        for r in self.rates_bps:
            if not (math.isfinite(r) and r > 0):
                raise ValueError(f"rates: must be > 0, got {r!r}")
        for n in self.nodes:
            if not (isinstance(n, int) and 2 <= n <= 16):
                raise ValueError(f"nodes: must be whole numbers in [2, 16], got {n!r}")
        for s in self.sizes:
            if not (isinstance(s, int) and s >= 4096 and s % 4 == 0):
                raise ValueError(f"sizes: must be whole multiples of 4 bytes >= 4096, got {s!r}")
        for c in self.crs:
            check_cr(c, "crs")
            if c >= 1:
                raise ValueError(f"crs: Top-k ratios must be < 1, got {c!r}")
        for c in self.collectives:
            if c not in COLLECTIVES:
                raise ValueError(f"collectives: {c!r} is not one the client offers ({', '.join(COLLECTIVES)})")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ValueError(f"repeats: must be a whole number >= 1, got {self.repeats!r}")

    def points(self, nodes: int) -> list[tuple[int, str, float]]:
        """(size, collective, cr) of one configuration, in the order ranks run them."""
        return [(s, c, cr) for s in self.sizes for c in self.collectives
                for cr in ([1.0] if c == DENSE_RING else self.crs)]

    def repeats_for(self, estimate_s: float) -> int:
        """Repetitions of an operation the model expects to take `estimate_s`."""
        for shorter_than, repeats in REPEAT_TIERS:
            if estimate_s < shorter_than:
                return max(self.repeats, repeats)
        return self.repeats

    def point_repeats(self, rate_bps: float, nodes: int) -> list[tuple[int, str, float, int]]:
        """(size, collective, cr, repetitions) of one configuration, in run order."""
        net = NetworkObservation.from_link(1e-3, rate_bps, nodes)
        return [(*p, self.repeats_for(_estimate(p, net))) for p in self.points(nodes)]

    def estimate_seconds(self) -> float:
        """Rough wall time of the whole grid: the paper-form model at the shaped
        rate with 1 ms latency, plus per-op and per-launch overheads."""
        total = 0.0
        for rate in self.rates_bps:
            for n in self.nodes:
                net = NetworkObservation.from_link(1e-3, rate, n)
                for size, collective, cr, reps in self.point_repeats(rate, n):
                    total += reps * (_estimate((size, collective, cr), net) + PER_OP_OVERHEAD_S)
                total += LAUNCH_S
        return total

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# `--quick`: two rates, both N, two sizes, three CRs (about two minutes).
QUICK_GRID = Grid(rates_bps=(200e6, 10e6), nodes=(2, 4), sizes=(1_000_000, 4_000_000), crs=(0.1, 0.011, 0.001))


def _estimate(point: tuple[int, str, float], net: NetworkObservation) -> float:
    size, collective, cr = point
    return sync_time(collective, size, cr, net)


@dataclass
class Measured:
    """One grid point: the median operation time over repetitions."""

    rate_bps: float
    nodes: int
    size_bytes: int
    collective: str
    cr: float
    t_sync_s: float
    samples_s: list[float]
    t_comp_s: float  # the slowest rank's median selection time (0 for dense)
    alpha_op_s: float  # tiny AllReduce time / (2 (N - 1)): gloo's per-message cost
    alpha_tcp_s: float  # half the median TCP connect RTT
    load_avg: float = 0.0  # 1-minute load average when the configuration ran
    bandwidth_probe_bps: float = 0.0  # median of the iperf3 probes node 0 -> 1; 0: not measured (older runs)
    burst_bytes: int = 0  # what the link passes at line rate after idle; 0: not recorded (older runs)
    # The links' token bucket (`LabCluster.bucket`); older runs did not record it: plain.
    peak_over_rate: float = 1.0
    bucket_s: float = 0.0
    bandwidth_probes_bps: list[float] = field(default_factory=list)  # each probe (older runs: one, unrecorded)

    @property
    def bucket(self) -> LinkBucket:
        return LinkBucket(self.peak_over_rate, self.bucket_s)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.samples_s), max(self.samples_s)

    @property
    def quartiles(self) -> tuple[float, float]:
        """(25th, 75th) percentile of the repetitions."""
        if len(self.samples_s) < 2:
            return self.t_sync_s, self.t_sync_s
        q1, _, q3 = statistics.quantiles(self.samples_s, n=4, method="inclusive")
        return q1, q3


def tcp_alpha(nodes: Sequence[LabNode]) -> float:
    """Half the median TCP connect RTT from node 0 to node 1. (The agent's probe reports
    half the minimum, `probe.latency.latency_measurement`: tens of microseconds apart
    here, against the milliseconds of per-call overhead the calibration absorbs.)"""
    summary = rtt_burst(nodes[1].address, CLOSED_PORT, count=20, interval_s=0.005, netns=nodes[0].ns)
    if summary.p50_s is None:
        raise RuntimeError(f"latency: no TCP answer from {nodes[1].address}: {summary.error}")
    return summary.p50_s / 2


def probed_bandwidth(nodes: Sequence[LabNode]) -> list[float]:
    """iperf3 goodput from node 0 to node 1: PROBES tests, each as the agent's
    bandwidth probe runs one."""
    with IperfServer(IPERF_PORT, bind=nodes[1].address, netns=nodes[1].ns):
        return [run_test(nodes[1].address, port=IPERF_PORT, duration_s=PROBE_SECONDS,
                         netns=nodes[0].ns).bandwidth_bps for _ in range(PROBES)]


@dataclass(frozen=True)
class LinkFigures:
    """What one configuration measured of its links before timing the grid."""

    alpha_tcp_s: float
    load_avg: float
    bandwidth_probes_bps: tuple[float, ...] = ()
    burst_bytes: int = 0
    bucket: LinkBucket = PLAIN_LINK


def launch_ranks(lab: LabCluster, plan_path: Path, log_dir: Path) -> list[subprocess.Popen]:
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return [lab.spawn(rank, [sys.executable, "-m", "flexcomm.lab.collective_timer", str(plan_path), str(rank)],
                      log=log_dir / f"rank{rank}.log", env=env)
            for rank in range(len(lab.nodes))]


def wait_ranks(lab: LabCluster, procs: list[subprocess.Popen], timeout_s: float, log_dir: Path) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        for rank, proc in enumerate(procs):
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if rc != 0:
                tail = (log_dir / f"rank{rank}.log").read_text(encoding="utf-8")[-2000:]
                raise RuntimeError(f"rank {rank} exited with {rc}:\n{tail}")
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"ranks did not finish within {timeout_s:.0f} s (logs in {log_dir})") from None
    finally:
        for proc in procs:
            lab.stop(proc)


def run_config(lab: LabCluster, rate_bps: float, grid: Grid, run_dir: Path,
               say: Callable[[str], None] = print) -> list[Measured]:
    """Shape every link to `rate_bps`, time the grid with one process group, aggregate."""
    if not lab.shaped:
        raise ValueError(f"namespaces: the calibration needs shaped links ({lab.reason_unshaped})")
    n = len(lab.nodes)
    lab.links.apply(LinkState(rate_bps))
    lab.links.cap_segments(rate_bps)  # before any connection of this configuration
    alpha_tcp = tcp_alpha(lab.nodes)
    probes = probed_bandwidth(lab.nodes)
    out_dir = run_dir / "raw" / f"n{n}_{int(rate_bps)}bps"
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = {"world": n, "master_addr": lab.nodes[0].address, "master_port": MASTER_PORT,
            "ifname": lab.nodes[0].ifname, "sizes": list(grid.sizes), "crs": list(grid.crs),
            "collectives": list(grid.collectives), "out_dir": str(out_dir),
            "point_repeats": grid.point_repeats(rate_bps, n)}
    plan_path = out_dir / "plan.json"
    plan_path.write_text(json.dumps(plan), encoding="utf-8")
    load = os.getloadavg()[0]
    one = replace(grid, rates_bps=(rate_bps,), nodes=(n,))
    t0 = time.monotonic()
    wait_ranks(lab, launch_ranks(lab, plan_path, out_dir), 4 * one.estimate_seconds() + 180, out_dir)
    say(f"  N={n} {rate_bps / 1e6:g} Mbit/s: {time.monotonic() - t0:.0f} s "
        f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})")
    figures = LinkFigures(alpha_tcp, load, tuple(probes), burst_after_idle(rate_bps), lab.bucket)
    return aggregate(read_ranks(out_dir, n), rate_bps, n, figures)


def read_ranks(out_dir: Path, n: int) -> list[list[dict[str, Any]]]:
    ranks = []
    for rank in range(n):
        lines = (out_dir / f"rank{rank}.jsonl").read_text(encoding="utf-8").splitlines()
        ranks.append([json.loads(line) for line in lines if line.strip()])
    return ranks


def _op_times(ranks: list[list[dict[str, Any]]], kind: str, key: Callable[[dict], Any]) -> dict[Any, list[float]]:
    """key -> one time per repetition: max(end) - max(start) over ranks."""
    starts: dict[Any, list[float]] = {}
    ends: dict[Any, list[float]] = {}
    for records in ranks:
        for r in records:
            if r["kind"] == kind:
                k = (key(r), r["rep"])
                starts.setdefault(k, []).append(r["start"])
                ends.setdefault(k, []).append(r["end"])
    times: dict[Any, list[float]] = {}
    for (k, _rep), s in sorted(starts.items(), key=lambda kv: repr(kv[0])):
        if len(s) == len(ranks):
            times.setdefault(k, []).append(max(ends[(k, _rep)]) - max(s))
    return times


def aggregate(ranks: list[list[dict[str, Any]]], rate_bps: float, n: int, link: LinkFigures) -> list[Measured]:
    tiny = _op_times(ranks, "tiny", lambda r: "tiny").get("tiny")
    if not tiny:
        raise RuntimeError("tiny: no rank recorded the tiny AllReduce")
    alpha_op = statistics.median(tiny) / (2 * (n - 1))
    comp: dict[tuple[int, float], float] = {}
    for records in ranks:
        for r in records:
            if r["kind"] == "comp":
                key = (r["size"], r["cr"])
                comp[key] = max(comp.get(key, 0.0), r["t_comp_s"])
    probes = link.bandwidth_probes_bps
    rows = []
    ops = _op_times(ranks, "op", lambda r: (r["size"], r["collective"], r["cr"]))
    for (size, collective, cr), samples in sorted(ops.items()):
        rows.append(Measured(
            rate_bps=rate_bps, nodes=n, size_bytes=size, collective=collective, cr=cr,
            t_sync_s=statistics.median(samples), samples_s=samples,
            t_comp_s=comp.get((size, cr), 0.0) if collective != DENSE_RING else 0.0,
            alpha_op_s=alpha_op, alpha_tcp_s=link.alpha_tcp_s, load_avg=link.load_avg,
            bandwidth_probe_bps=statistics.median(probes) if probes else 0.0, burst_bytes=link.burst_bytes,
            peak_over_rate=link.bucket.peak_over_rate, bucket_s=link.bucket.burst_s,
            bandwidth_probes_bps=list(probes)))
    return rows


def run_grid(grid: Grid, prefix: str, subnet: str, run_dir: Path,
             say: Callable[[str], None] = print) -> list[Measured]:
    """Every configuration of the grid: one cluster per N, one process group per rate."""
    rows: list[Measured] = []
    for n in grid.nodes:
        with LabCluster.open(prefix=prefix, n=n, subnet=subnet, run_dir=run_dir / f"n{n}",
                             namespaces=True) as lab:
            for rate in grid.rates_bps:
                rows.extend(run_config(lab, rate, grid, run_dir, say))
    return rows


__all__ = ["COLLECTIVES", "QUICK_GRID", "Grid", "LinkFigures", "Measured", "aggregate", "run_config", "run_grid",
           "tcp_alpha"]
