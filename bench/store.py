"""Benchmark the store's write rate: measurement rows and step reports.

Measurements are written the way the probe scheduler writes them: one row, one
transaction (WAL, synchronous=FULL, so one fsync per commit). Step reports the
way the agent does: a batch of a control interval's reports (--batch, default
50) aggregated and stored in one transaction; the rate is step reports taken in
per second. The database is a fresh file in --dir (default: a temporary
directory); point --dir at the disk a node's store lives on to measure that
disk. The last printed line is one JSON object.

    .venv/bin/python bench/store.py [--seconds S] [--batch N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from flexcomm.policy.types import StepReport
from flexcomm.store import Measurement, Store


def measurement_rate(store: Store, seconds: float) -> tuple[float, int]:
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        store.add_measurement(Measurement(peer=f"10.0.0.{n % 8}", kind="bandwidth",
                                          bandwidth_bps=1e8 + n, beta_s_per_byte=8e-8))
        n += 1
    return n / (time.perf_counter() - start), n


def report_rate(store: Store, seconds: float, batch: int) -> tuple[float, int]:
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        reports = [StepReport(step=n + i, family="topk", param=0.01, collective="ag_topk", t_comp_s=0.01,
                              t_sync_s=0.1, gain=0.5, bytes_sent=1000, epoch=(n + i) // 1000)
                   for i in range(batch)]
        store.add_step_reports("bench", reports)
        n += batch
    return n / (time.perf_counter() - start), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per figure (default 3)")
    parser.add_argument("--batch", type=int, default=50, help="step reports per batch (default 50)")
    parser.add_argument("--dir", help="directory for the database (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, Store(os.path.join(tmp, "bench.db")) as store:
        m_rate, m_rows = measurement_rate(store, args.seconds)
        print(f"measurements: {m_rows} rows in {args.seconds:g} s, one transaction each: {m_rate:.0f}/s")
        r_rate, r_count = report_rate(store, args.seconds, args.batch)
        print(f"step reports: {r_count} in batches of {args.batch}: {r_rate:.0f}/s")
    print(json.dumps({"measurements_per_s": round(m_rate, 1), "reports_per_s": round(r_rate, 1),
                      "batch": args.batch, "synchronous": "FULL", "journal": "wal"}))


if __name__ == "__main__":
    main()
