"""How well a look reads a shaped path, and how long it holds the link.

For each rate, two namespaces joined by a veth, segments capped and the sender's
end shaped as the lab does it (`Shaper`, ceil 1.2x the rate with a 5 ms bucket):
`--repeats` looks of each kind, one after another, 0.2 s apart:
- look: the agent's look (`probe.scheduler.sized_look`: a small train, then one
  sized to 4 ms at its reading, at most LOOK_MAX_BYTES);
- train: one `probe.train.train_look` of 256 KB, and of 64 KB, the receiving
  kernel's stamps;
- iperf3: a 64 KB iperf3 test, the kind of look before trains.
Each reading is given over the shaped rate (a short burst crosses at up to the
ceil, 1.2x; a UDP payload is 0.972 of what the wire carries at MTU 1500, so a
train inside the ceil reads 1.167) and over what the estimate takes from it
(`LinkEstimate.looked_beta`: 1.0 is the rate). Figures: median, min and max per
kind and rate, and the median time a look held the link (what the duty budget
is charged; iperf3's: its whole run). Run it on a quiet host and beside load
(`--hogs N` CPU hogs) to see what a busy host does to each. Needs root. The last printed line is one JSON object.

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
from flexcomm.policy.types import LinkBucket
from flexcomm.probe.iperf import IperfServer, run_test
from flexcomm.probe.scheduler import LOOK_MAX_BYTES, sized_look
from flexcomm.probe.train import TrainServer, train_look

PREFIX, SUBNET, PORT = "fcblk", "10.242.0.0/24", 5298
SMALL = 64 << 10
HOG = "while True: pass"


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)} if values else {}


def looks(kind: str, read, rate_bps: float, bucket: LinkBucket, repeats: int) -> dict[str, object]:
    """`read()` -> (bits/s, bytes it was read over, seconds it held the link)."""
    ratios, estimated, held, failed = [], [], [], 0
    for _ in range(repeats):
        try:
            bps, nbytes, held_s = read()
        except Exception:  # a failed look is counted, not a reading
            failed += 1
            continue
        finally:
            time.sleep(0.2)
        ratios.append(bps / rate_bps)
        estimated.append(nbytes * 8 / bucket.at_rate_s(nbytes * 8 / bps) / rate_bps)
        held.append(held_s)
    return {"kind": kind, "over_rate": summary(ratios), "as_estimated": summary(estimated),
            "held_ms_median": round(1e3 * statistics.median(held), 2) if held else None, "failed": failed}


def measure(rate_bps: float, repeats: int) -> list[dict[str, object]]:
    bucket = LinkBucket(CEIL_OVER_RATE, RATE_BUCKET_SECONDS)
    with netns_pair(PREFIX, SUBNET) as (sender, receiver):
        for node in (sender, receiver):
            cap_segments(node.ns, node.ifname, segment_cap(rate_bps))
        Shaper(sender.ifname, netns=sender.ns).apply(LinkState(rate_bps))
        def train(peer: str, size: int):
            return train_look(peer, PORT, size, netns=sender.ns)

        def reading(m) -> tuple[float, int, float]:
            return m.bandwidth_bps, m.bytes_sent, m.duration_s

        server = TrainServer(PORT, bind=receiver.address, netns=receiver.ns).start()
        try:
            rows = [looks("look", lambda: reading(sized_look(train, receiver.address)), rate_bps, bucket, repeats)]
            rows += [looks(f"train {n >> 10} KB", lambda n=n: reading(train(receiver.address, n)),
                           rate_bps, bucket, repeats) for n in (LOOK_MAX_BYTES, SMALL)]
        finally:
            server.stop()
        with IperfServer(PORT, bind=receiver.address, netns=receiver.ns):
            def iperf3_look() -> tuple[float, int, float]:
                started = time.monotonic()
                bps = run_test(receiver.address, port=PORT, bytes_=SMALL, netns=sender.ns).bandwidth_bps
                return bps, SMALL, time.monotonic() - started
            rows.append(looks("iperf3 64 KB", iperf3_look, rate_bps, bucket, repeats))
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
                      f"{row['as_estimated']}  held {row['held_ms_median']} ms  failed {row['failed']}",
                      flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(json.dumps({"bench": "looks", "repeats": args.repeats, "hogs": args.hogs, "look_max_bytes": LOOK_MAX_BYTES,
                      "rates_mbit": results}))


if __name__ == "__main__":
    main()
