"""How well a look reads a shaped path, and how long it holds the link.

For each rate, two namespaces joined by a veth, segments capped and the sender's
end shaped as the lab does it (`Shaper`, ceil 1.2x the rate with a 5 ms bucket):
`--repeats` looks of each kind, one after another, 0.2 s apart:
- train: `probe.train.train_look` of LOOK_BYTES (and of 64 KB), the receiving
  kernel's stamps;
- iperf3: a 64 KB iperf3 test, the kind of look before trains.
Each reading is given over the shaped rate (a short burst crosses at up to the
ceil, 1.2x; a UDP payload is 0.972 of what the wire carries at MTU 1500, so a
train inside the ceil reads 1.167) and over what the estimate takes from it
(`LinkBucket.at_rate_s`, as `LinkEstimate.observe_look` reads it: 1.0 is the
rate). Figures: median, min and max per kind and rate, and each look's median
time. Run it on a quiet host and beside load (`--hogs N` CPU hogs) to see what a
busy host does to each. Needs root. The last printed line is one JSON object.

    sudo .venv/bin/python bench/looks.py [--rates 20,160,410,980] [--repeats 8] [--hogs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from flexcomm.emulation.shaping import CEIL_OVER_RATE, RATE_BUCKET_SECONDS, LinkState, Shaper
from flexcomm.lab.cluster import segment_cap
from flexcomm.lab.netns import cap_segments, netns_pair
from flexcomm.policy.linkestimate import LOOK_BYTES
from flexcomm.policy.types import LinkBucket
from flexcomm.probe.iperf import IperfServer, run_test
from flexcomm.probe.train import TrainServer, train_look

PREFIX, SUBNET, PORT = "fcblk", "10.242.0.0/24", 5298
SMALL = 64 << 10
HOG = "while True: pass"


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)} if values else {}


def looks(kind: str, read, rate_bps: float, bucket: LinkBucket, nbytes: int, repeats: int) -> dict[str, object]:
    ratios, estimated, seconds, failed = [], [], [], 0
    for _ in range(repeats):
        started = time.monotonic()
        try:
            bps = read()
        except Exception:  # a failed look is counted, not a reading
            failed += 1
            continue
        finally:
            seconds.append(time.monotonic() - started)
            time.sleep(0.2)
        ratios.append(bps / rate_bps)
        estimated.append(nbytes * 8 / bucket.at_rate_s(nbytes * 8 / bps) / rate_bps)
    return {"kind": kind, "bytes": nbytes, "over_rate": summary(ratios), "as_estimated": summary(estimated),
            "seconds_median": round(statistics.median(seconds), 4), "failed": failed}


def measure(rate_bps: float, repeats: int) -> list[dict[str, object]]:
    bucket = LinkBucket(CEIL_OVER_RATE, RATE_BUCKET_SECONDS)
    with netns_pair(PREFIX, SUBNET) as (sender, receiver):
        for node in (sender, receiver):
            cap_segments(node.ns, node.ifname, segment_cap(rate_bps))
        Shaper(sender.ifname, netns=sender.ns).apply(LinkState(rate_bps))
        server = TrainServer(PORT, bind=receiver.address, netns=receiver.ns).start()
        try:
            rows = [looks(f"train {n >> 10} KB", lambda n=n: train_look(receiver.address, PORT, n,
                                                                         netns=sender.ns).bandwidth_bps,
                          rate_bps, bucket, n, repeats) for n in sorted({LOOK_BYTES, SMALL})]
        finally:
            server.stop()
        with IperfServer(PORT, bind=receiver.address, netns=receiver.ns):
            rows.append(looks("iperf3 64 KB", lambda: run_test(receiver.address, port=PORT, bytes_=SMALL,
                                                                 netns=sender.ns).bandwidth_bps,
                              rate_bps, bucket, SMALL, repeats))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="20,160,410,980", help="Mbit/s, comma-separated")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--hogs", type=int, default=0, help="CPU hogs to run beside the looks")
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    results = {}
    try:
        for rate in [float(r) for r in args.rates.split(",")]:
            results[f"{rate:g}"] = rows = measure(rate * 1e6, args.repeats)
            for row in rows:
                print(f"{rate:6g} Mbit/s  {row['kind']:14s} over rate {row['over_rate']}  as estimated "
                      f"{row['as_estimated']}  {row['seconds_median'] * 1e3:.1f} ms  failed {row['failed']}",
                      flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(json.dumps({"bench": "looks", "repeats": args.repeats, "hogs": args.hogs, "look_bytes": LOOK_BYTES,
                      "rates_mbit": results}))


if __name__ == "__main__":
    main()
