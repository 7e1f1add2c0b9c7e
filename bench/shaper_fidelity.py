"""How faithfully the lab's shaped links carry traffic on this machine.

For each rate, two namespaces joined by a veth, segments capped as the lab caps
them (`flexcomm.lab.cluster.segment_cap`), the sender's end shaped by
`flexcomm.emulation.shaping.Shaper`:

- goodput share: iperf3 goodput over the best TCP carries at MTU 1500 (1.0 is the
  rate exactly; above 1 the shaper passed more than its rate), median of 3 tests;
- message / wire: the median time of a 16 KB message after idle over its wire
  time at the rate (1.0 is honest; under 1 the burst after idle let it through early).

`--stalls ON,OFF` runs, during the goodput tests, one SCHED_FIFO busy loop per CPU,
ON ms busy and OFF ms asleep: it takes the CPUs from the kernel's network work in
bursts, the way a loaded or oversubscribed VM does. Needs root.
Goal: goodput share within 0.95-1.05 at every rate, stalls or not.
The last printed line is one JSON object.

    .venv/bin/python bench/shaper_fidelity.py [--rates 10,50,200,1000] [--stalls 4,16]
        [--ceil-over-rate 1.0]   (1.0: wire-like links, one small bucket)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from flexcomm.emulation.shaping import CEIL_OVER_RATE, RATE_BUCKET_SECONDS, LinkState, Shaper
from flexcomm.lab.cluster import segment_cap
from flexcomm.lab.fidelity import goodput_share, message_seconds
from flexcomm.lab.netns import cap_segments, netns_pair
from flexcomm.probe.iperf import IperfServer, run_test

PREFIX, SUBNET, PORT = "fcbsf", "10.241.0.0/24", 5299
MESSAGE_BYTES = 16384
STALLER = """
import os, sys, time
busy_s, idle_s, cpu, until = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
while time.monotonic() < until:
    end = time.monotonic() + busy_s
    while time.monotonic() < end:
        pass
    time.sleep(idle_s)
"""


def start_stalls(busy_ms: float, idle_ms: float, seconds: float) -> list[subprocess.Popen]:
    until = time.monotonic() + seconds
    return [subprocess.Popen([sys.executable, "-c", STALLER, str(busy_ms / 1e3), str(idle_ms / 1e3),
                              str(cpu), str(until)]) for cpu in sorted(os.sched_getaffinity(0))]


def measure(rate_bps: float, stalls: tuple[float, float] | None,
            ceil_over_rate: float) -> dict[str, float]:
    with netns_pair(PREFIX, SUBNET) as (sender, receiver):
        for node in (sender, receiver):
            cap_segments(node.ns, node.ifname, segment_cap(rate_bps))
        Shaper(sender.ifname, netns=sender.ns, ceil_over_rate=ceil_over_rate).apply(LinkState(rate_bps))
        message_s = message_seconds(sender, receiver, MESSAGE_BYTES, repeats=15)
        staller = start_stalls(*stalls, seconds=30) if stalls else []
        try:
            with IperfServer(PORT, bind=receiver.address, netns=receiver.ns):
                shares = [goodput_share(run_test(receiver.address, port=PORT, duration_s=3, omit_s=1,
                                                 netns=sender.ns).bandwidth_bps, rate_bps)
                          for _ in range(3)]
        finally:
            for proc in staller:
                proc.kill()
                proc.wait()
    return {"goodput_share": statistics.median(shares), "goodput_share_min": min(shares),
            "message_over_wire": message_s / (MESSAGE_BYTES * 8 / rate_bps)}


def parse_stalls(text: str) -> tuple[float, float] | None:
    if not text:
        return None
    try:
        busy, idle = (float(part) for part in text.split(","))
    except ValueError:
        raise SystemExit(f"--stalls: expected BUSY_MS,IDLE_MS such as 4,16, got {text!r}") from None
    if busy <= 0 or idle <= 0:
        raise SystemExit(f"--stalls: both parts must be > 0, got {text!r}")
    return busy, idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10,50,200,1000", help="Mbit/s, comma-separated")
    parser.add_argument("--stalls", default="", help="BUSY_MS,IDLE_MS of per-CPU realtime busy loops")
    parser.add_argument("--ceil-over-rate", type=float, default=CEIL_OVER_RATE,
                        help=f"the shaper's ceil over its rate (default {CEIL_OVER_RATE})")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("shaper_fidelity: needs root (network namespaces, realtime stalls)")
    stalls = parse_stalls(args.stalls)
    print(f"ceil {args.ceil_over_rate}x the rate, rate bucket {RATE_BUCKET_SECONDS * 1e3:g} ms, "
          f"stalls {args.stalls or 'none'}")
    results = {}
    for mbit in (float(r) for r in args.rates.split(",")):
        row = measure(mbit * 1e6, stalls, args.ceil_over_rate)
        results[f"{mbit:g}"] = {k: round(v, 3) for k, v in row.items()}
        print(f"{mbit:6g} Mbit/s  goodput share {row['goodput_share']:.3f} (min {row['goodput_share_min']:.3f})"
              f"  16 KB message / wire {row['message_over_wire']:.2f}")
    print(json.dumps({"bench": "shaper_fidelity", "stalls": args.stalls or None,
                      "ceil_over_rate": args.ceil_over_rate, "rate_bucket_s": RATE_BUCKET_SECONDS,
                      "rates_mbit": results}))


if __name__ == "__main__":
    main()
