"""Validate the cost model against real gloo collectives on the emulated cluster.

    sudo .venv/bin/python bench/model_accuracy.py --out runs/model-accuracy [--quick]

Times dense ring AllReduce, AG-Topk, AR-Topk Ring and AR-Topk Tree over a grid
of link rates, node counts, gradient sizes and CRs (flexcomm.lab.calibrate),
then compares the model's predictions, raw and calibrated on a held-out half,
and the regret of its choices (flexcomm.lab.model_accuracy). Writes measured.json,
table.csv, predicted_vs_measured.png and model_accuracy.json to --out; the last
printed line is model_accuracy.json's object.

`--from DIR` re-analyses the measured.json of an earlier run without measuring.
Needs root (network namespaces); namespaces "fcvb*", subnet 10.215.0.0/24 unless
--prefix/--subnet say otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from flexcomm.lab.accuracy_report import load_measured, write_report
from flexcomm.lab.calibrate import Grid, run_grid
from flexcomm.units import parse_bytes, parse_rate

PREFIX = "fcvb"
SUBNET = "10.215.0.0/24"
QUICK = Grid(rates_bps=(200e6, 10e6), nodes=(2, 4), sizes=(1_000_000, 4_000_000), crs=(0.1, 0.011, 0.001))


def _list(text: str, parse) -> tuple:
    return tuple(parse(part.strip()) for part in text.split(",") if part.strip())


def grid_from(args: argparse.Namespace) -> Grid:
    base = QUICK if args.quick else Grid()
    return Grid(
        rates_bps=_list(args.rates, lambda t: parse_rate("rates", t)) if args.rates else base.rates_bps,
        nodes=_list(args.nodes, int) if args.nodes else base.nodes,
        sizes=_list(args.sizes, lambda t: int(parse_bytes("sizes", t))) if args.sizes else base.sizes,
        crs=_list(args.crs, float) if args.crs else base.crs,
        repeats=args.repeats or base.repeats,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="run directory")
    p.add_argument("--quick", action="store_true", help="a small grid (about 2 minutes)")
    p.add_argument("--rates", help="link rates, e.g. 1Gbit,200Mbit")
    p.add_argument("--nodes", help="node counts, e.g. 2,4")
    p.add_argument("--sizes", help="gradient sizes, e.g. 1MB,16MB")
    p.add_argument("--crs", help="compression ratios, e.g. 0.1,0.001")
    p.add_argument("--repeats", type=int, help="repetitions per point (>= 3 advised)")
    p.add_argument("--prefix", default=PREFIX, help=f"namespace name prefix (default {PREFIX})")
    p.add_argument("--subnet", default=SUBNET, help=f"the nodes' subnet (default {SUBNET})")
    p.add_argument("--from", dest="from_dir", type=Path, help="re-analyse DIR/measured.json, measure nothing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                      time.gmtime())}
    if args.from_dir:
        rows = load_measured(args.from_dir / "measured.json")
        meta["reanalysed_from"] = str(args.from_dir)
    else:
        grid = grid_from(args)
        est = grid.estimate_seconds()
        print(f"grid: {len(grid.rates_bps)} rates x {len(grid.nodes)} node counts x {len(grid.sizes)} sizes "
              f"x {len(grid.crs)} CRs, {grid.repeats}+ repeats; estimated {est / 60:.1f} min", flush=True)
        t0 = time.monotonic()
        load0 = os.getloadavg()[0]
        rows = run_grid(grid, args.prefix, args.subnet, args.out, say=lambda s: print(s, flush=True))
        meta.update(grid=grid.to_dict(), wall_s=round(time.monotonic() - t0, 1),
                    estimated_s=round(est, 1), load_avg_start=round(load0, 2),
                    load_avg_end=round(os.getloadavg()[0], 2))
    result = write_report(args.out, rows, meta)
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
