"""`flexcomm lab calibrate`: validate the cost model on the emulated cluster.

    flexcomm lab calibrate [--out DIR] [--quick] [--rates 1Gbit,10Mbit] [--nodes 2,4]
                           [--sizes 1MB,16MB] [--crs 0.1,0.001] [--repeats 3]
    flexcomm lab calibrate --out DIR --from EARLIER_RUN   # re-analyse, measure nothing

Times dense ring AllReduce, AG-Topk, AR-Topk Ring and AR-Topk Tree over a grid of
link rates, node counts, gradient sizes and CRs (`flexcomm.lab.calibrate`), then
compares the cost model's predictions, raw and calibrated on a held-out half, and
the regret of its choices (`flexcomm.lab.model_accuracy`). Writes measured.json,
table.csv, predicted_vs_measured.png and model_accuracy.json to --out (default
runs/calibrate-<time>). Needs root (network namespaces and shaped links).
"""
# Not a top-level command: flexcomm/commands/lab.py adds it under `lab` with
# add_parser(sub); bench/model_accuracy.py is the same code.

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any

from flexcomm.policy.types import PLAIN_LINK, LinkBucket
from flexcomm.units import parse_bytes, parse_duration, parse_rate

PREFIX = "flexcal"
SUBNET = "10.215.0.0/24"


def add_arguments(p: argparse.ArgumentParser, prefix: str = PREFIX, subnet: str = SUBNET) -> None:
    p.add_argument("--out", type=Path, help="run directory (default runs/calibrate-<time>)")
    p.add_argument("--quick", action="store_true", help="a small grid (about 2 minutes)")
    p.add_argument("--rates", help="link rates, e.g. 1Gbit,200Mbit (default 1Gbit,200Mbit,50Mbit,10Mbit)")
    p.add_argument("--nodes", help="node counts, e.g. 2,4 (default 2,4)")
    p.add_argument("--sizes", help="gradient sizes, e.g. 1MB,16MB (default 1MB,4MB,16MB)")
    p.add_argument("--crs", help="compression ratios (default 0.1,0.033,0.011,0.004,0.001)")
    p.add_argument("--repeats", type=int, help="repetitions per point (default 3; short operations get more)")
    p.add_argument("--prefix", default=prefix, help=f"namespace name prefix (default {prefix})")
    p.add_argument("--subnet", default=subnet, help=f"the nodes' subnet (default {subnet})")
    p.add_argument("--from", dest="from_dir", type=Path, help="re-analyse DIR/measured.json, measure nothing")
    p.add_argument("--link-bucket", metavar="PEAK,BURST",
                   help="with --from: the links' token bucket for a run that did not record it, e.g. 1.2,5ms "
                        "(runs before the bucket was recorded were all taken as plain links)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `calibrate` under `flexcomm lab`."""
    p = sub.add_parser("calibrate", help="validate the cost model on the emulated cluster",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_calibrate)


def _list(field: str, text: str, parse: Callable[[str], Any]) -> tuple:
    items = tuple(parse(part.strip()) for part in text.split(",") if part.strip())
    if not items:
        raise ValueError(f"{field}: give at least one value, got {text!r}")
    return items


def _number(field: str, kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise ValueError(f"{field}: expected {what}, got {text!r}") from None
    return parse


def grid_from(args: argparse.Namespace) -> Any:
    from flexcomm.lab.calibrate import QUICK_GRID, Grid

    base = QUICK_GRID if args.quick else Grid()
    return Grid(
        rates_bps=_list("rates", args.rates, lambda t: parse_rate("rates", t)) if args.rates else base.rates_bps,
        nodes=_list("nodes", args.nodes, _number("nodes", int)) if args.nodes else base.nodes,
        sizes=_list("sizes", args.sizes, lambda t: int(parse_bytes("sizes", t))) if args.sizes else base.sizes,
        crs=_list("crs", args.crs, _number("crs", float)) if args.crs else base.crs,
        repeats=base.repeats if args.repeats is None else args.repeats,
    )


def parse_bucket(text: str) -> LinkBucket:
    """'1.2,5ms' -> LinkBucket(1.2, 0.005)."""
    peak, sep, burst = text.partition(",")
    if not sep:
        raise ValueError(f"link-bucket: expected PEAK,BURST such as 1.2,5ms, got {text!r}")
    names = ("link-bucket PEAK", "link-bucket BURST")
    return LinkBucket.checked(_number(names[0], float)(peak.strip()), parse_duration(names[1], burst.strip()),
                              names)


def with_bucket(rows: list[Any], bucket: LinkBucket) -> list[Any]:
    """The rows taken on links with `bucket`; refused where a row recorded another."""
    recorded = {r.bucket for r in rows} - {PLAIN_LINK, bucket}
    if recorded:
        raise ValueError(f"link-bucket: the run recorded its links' bucket ({min(recorded, key=astuple)}); "
                         "leave --link-bucket out")
    return [replace(r, peak_over_rate=bucket.peak_over_rate, bucket_s=bucket.burst_s) for r in rows]


def run(args: argparse.Namespace, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure (or reload) and write the report; returns model_accuracy.json's object."""
    from flexcomm.lab.accuracy_report import load_measured, write_report
    from flexcomm.lab.calibrate import run_grid

    if args.out is None:
        args.out = Path(f"runs/calibrate-{time.strftime('%Y%m%d-%H%M%S')}")
        say(f"run directory: {args.out}")
    meta: dict[str, Any] = {"machine": platform.machine(), "cpus": os.cpu_count(),
                            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.link_bucket and not args.from_dir:
        raise ValueError("link-bucket: only with --from (a new run records its links' bucket itself)")
    if args.from_dir:
        rows = load_measured(args.from_dir / "measured.json")
        meta["reanalysed_from"] = str(args.from_dir)
        if args.link_bucket:
            rows = with_bucket(rows, parse_bucket(args.link_bucket))
            meta["link_bucket_given"] = args.link_bucket
    else:
        from flexcomm.lab.cluster import can_use_namespaces

        usable, why = can_use_namespaces()
        if not usable:
            raise ValueError(f"namespaces: calibrating needs network namespaces and shaped links ({why})")
        grid = grid_from(args)
        est = grid.estimate_seconds()
        say(f"grid: {len(grid.rates_bps)} rates x {len(grid.nodes)} node counts x {len(grid.sizes)} sizes "
            f"x {len(grid.crs)} CRs, {grid.repeats}+ repeats; estimated {est / 60:.1f} min")
        t0, load0 = time.monotonic(), os.getloadavg()[0]
        rows = run_grid(grid, args.prefix, args.subnet, args.out, say)
        meta.update(grid=grid.to_dict(), wall_s=round(time.monotonic() - t0, 1), estimated_s=round(est, 1),
                    load_avg_start=round(load0, 2), load_avg_end=round(os.getloadavg()[0], 2))
    return write_report(args.out, rows, meta)


def cmd_calibrate(args: argparse.Namespace) -> int:
    result = run(args, say=lambda s: print(s, flush=True))
    print(json.dumps(result, separators=(",", ":")))
    return 0
