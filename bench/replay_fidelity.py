"""How closely a recorded network is replayed: iperf3 goodput per step against
the recording.

Two namespaces joined by a veth (segments capped as the lab caps them), the
sender's end shaped by a time-keyed schedule (`flexcomm.emulation.emulator`)
while one `iperf3 -J -i 1` runs through it; per step of the schedule, the mean
goodput of the 1-s intervals wholly inside it (the first second after a change
left out) over the goodput the step was recorded at (its rate times the TCP
payload share, as `flexcomm emulate record` wrote it). Goal: within 0.90-1.10
for every step. With `--record-shared OUT.json` it instead makes a recording:
a 100 Mbit/s link that a second iperf3 flow joins and leaves (the
examples/schedules/shared-link.toml shape; `--others busy-hour`: flows that
join at different times and overlap, the busy-hour.toml shape) and writes the
measured flow's iperf3 --json log. Needs root. The last printed line is one JSON object.

    .venv/bin/python bench/replay_fidelity.py [--schedule examples/schedules/shared-link.toml]
    .venv/bin/python bench/replay_fidelity.py --record-shared shared.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

from flexcomm.emulation.emulator import Emulator
from flexcomm.emulation.record import TCP_PAYLOAD_SHARE
from flexcomm.emulation.schedule import load_schedule
from flexcomm.emulation.shaping import LinkState, Shaper
from flexcomm.lab.cluster import segment_cap
from flexcomm.lab.netns import cap_segments, netns_pair
from flexcomm.probe.iperf import IperfServer, in_netns

PREFIX, SUBNET, PORT, OTHER_PORT = "fcbrf", "10.242.0.0/24", 5301, 5302
SETTLE_S = 1.0  # after a change, TCP needs a moment to find the new rate
# (start s, end s) of each other flow sharing the link during a recording
OTHERS = {"shared": ((0, 20), (40, 60)),
          "busy-hour": ((15, 45), (30, 60), (35, 50))}


def iperf_json(sender: object, receiver: object, port: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(in_netns(sender.ns, [  # type: ignore[attr-defined]
        "iperf3", "-c", receiver.address, "-p", str(port), "-t", f"{seconds:g}",  # type: ignore[attr-defined]
        "-i", "1", "-J"]), stdout=subprocess.PIPE, text=True)


def replay(path: str) -> dict[str, object]:
    schedule = load_schedule(path)
    seconds = schedule.round_seconds * (schedule.repeat or 1)
    with netns_pair(PREFIX, SUBNET) as (sender, receiver):
        rates = [s.state.rate_bps for s in schedule.steps]
        for node in (sender, receiver):
            cap_segments(node.ns, node.ifname, segment_cap(min(rates)))
        shaper = Shaper(sender.ifname, netns=sender.ns)
        applied = []
        with IperfServer(PORT, bind=receiver.address, netns=receiver.ns):
            shaper.apply(schedule.steps[0].state)
            client = iperf_json(sender, receiver, PORT, seconds)
            start = time.monotonic()
            stop = threading.Event()
            emulator = Emulator(schedule, shaper, on_step=applied.append)
            runner = threading.Thread(target=emulator.run, args=(stop, None, start))
            runner.start()
            log = json.loads(client.communicate()[0])
            stop.set()
            runner.join()
    intervals = [(i["sum"]["start"], i["sum"]["end"], i["sum"]["bits_per_second"])
                 for i in log["intervals"]]
    rows = []
    for offset, _, step in schedule.timeline():
        end = offset + (step.duration_s or 0.0)
        inside = [bps for lo, hi, bps in intervals if lo >= offset + SETTLE_S and hi <= end + 1e-3]
        recorded = step.state.rate_bps * TCP_PAYLOAD_SHARE
        if inside:
            rows.append({"step": step.number, "start_s": offset, "recorded_mbit": recorded / 1e6,
                         "replayed_mbit": statistics.fmean(inside) / 1e6,
                         "ratio": statistics.fmean(inside) / recorded})
    return {"bench": "replay_fidelity", "schedule": path, "steps": rows,
            "worst_ratio_off_by": max(abs(r["ratio"] - 1) for r in rows) if rows else None,
            "within_10pct": all(0.9 <= r["ratio"] <= 1.1 for r in rows) and bool(rows)}


def record_shared(out: Path, others: str, seconds: float = 80.0) -> dict[str, object]:
    """A 100 Mbit/s link that other flows share during OTHERS[others]."""
    with netns_pair(PREFIX, SUBNET) as (sender, receiver):
        for node in (sender, receiver):
            cap_segments(node.ns, node.ifname, segment_cap(100e6))
        shaper = Shaper(sender.ifname, netns=sender.ns)
        shaper.apply(LinkState(100e6))
        flows = sorted(OTHERS[others])
        servers = [IperfServer(port, bind=receiver.address, netns=receiver.ns)
                   for port in range(PORT, OTHER_PORT + len(flows))]
        with contextlib.ExitStack() as stack:
            for server in servers:
                stack.enter_context(server)
            client = iperf_json(sender, receiver, PORT, seconds)
            start, running = time.monotonic(), []
            for port, (lo, hi) in enumerate(flows, start=OTHER_PORT):
                time.sleep(max(0.0, start + lo - time.monotonic()))
                running.append(iperf_json(sender, receiver, port, hi - lo))
            for proc in running:
                proc.communicate()
            out.write_text(client.communicate()[0])
    return {"bench": "replay_fidelity", "recorded": str(out), "others": others,
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="examples/schedules/shared-link.toml")
    parser.add_argument("--record-shared", type=Path, default=None,
                        help="make a recording instead: write the iperf3 --json log here")
    parser.add_argument("--others", choices=sorted(OTHERS), default="shared",
                        help="with --record-shared: when other flows share the link")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("replay_fidelity: needs root (network namespaces)")
    if args.record_shared:
        print(json.dumps(record_shared(args.record_shared, args.others)))
        return
    result = replay(args.schedule)
    for row in result["steps"]:  # type: ignore[union-attr]
        print(f"step {row['step']} from {row['start_s']:5.1f} s: recorded {row['recorded_mbit']:7.2f} "
              f"Mbit/s, replayed {row['replayed_mbit']:7.2f} ({row['ratio']:.3f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
