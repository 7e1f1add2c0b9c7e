"""`flexcomm model`: what would the cost model and the MOO choose here?

Prints the predicted time of every collective at every candidate CR for the
given network and gradient, and the decision with its reason. Nothing is
measured: this is the model alone (gains unknown unless --gains gives them).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, replace
from typing import Any

from flexcomm.policy.costmodel import AG_FORMS, TREE_FORMS, predict
from flexcomm.policy.moo import MooConfig, MooPolicy
from flexcomm.policy.types import COLLECTIVES, DENSE_COLLECTIVES, LinkBucket, NetworkObservation, check_cr
from flexcomm.units import (
    format_bytes,
    format_rate,
    format_seconds,
    parse_bytes,
    parse_duration,
    parse_rate,
)

EXAMPLES = """examples:
  flexcomm model --nodes 8 --size 100MB --latency 1ms --bandwidth 1Gbit --sweep
  flexcomm model --nodes 4 --size 25MB --latency 50us --bandwidth 200Mbit --gains 0.1=0.95,0.01=0.7
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="predict sync time per collective and CR, and the choice",
                       description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, required=True, help="number of workers N (>= 2)")
    p.add_argument("--size", required=True, help="dense gradient size, e.g. 100MB, 25MiB")
    p.add_argument("--latency", required=True, help="per-message latency alpha, e.g. 1ms, 50us")
    p.add_argument("--bandwidth", required=True, help="link bandwidth, e.g. 10Gbit, 200Mbit")
    p.add_argument("--link-peak-over-rate", default="1.0",
                   help="token-bucket link: peak rate over the bandwidth (default 1.0, a plain link)")
    p.add_argument("--link-burst", default="0s",
                   help="token-bucket link: credit at the bandwidth, e.g. 5ms (default 0s, a plain link)")
    p.add_argument("--cr", help="consider only this compression ratio (0 < cr < 1)")
    p.add_argument("--t-comp", help="compression time of a Top-k option (default: the model's estimate)")
    p.add_argument("--t-compute", default="0s", help="forward+backward time per step (default 0s)")
    p.add_argument("--gains", help="compression gains per CR, e.g. 0.1=0.95,0.01=0.7; CRs between are "
                   "interpolated in log CR (default: unknown)")
    p.add_argument("--ag-form", choices=AG_FORMS, default="paper", help="AllGather formula (default paper)")
    p.add_argument("--tree-form", choices=TREE_FORMS, default="paper", help="tree formula (default paper)")
    p.add_argument("--sweep", action="store_true", help="show where the choice changes across bandwidths")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace, size: float) -> MooConfig:
    kw: dict[str, Any] = {"ag_form": args.ag_form, "tree_form": args.tree_form, "warmup_steps": 0}
    if args.cr is not None:
        cr = check_cr(args.cr, "cr")
        if cr == 1.0:
            raise ValueError("cr: 1 is dense; give a ratio below 1 or leave --cr out")
        kw.update(c_low=cr, c_high=cr)
    if args.t_comp is not None:
        t = parse_duration("t-comp", args.t_comp)
        kw.update(comp_per_byte=t / size, comp_per_selected_byte=0.0)
    return MooConfig(**kw)


def _gains(text: str | None) -> dict[float, float]:
    gains: dict[float, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        cr_text, sep, gain_text = item.partition("=")
        if not sep:
            raise ValueError(f"gains: expected CR=GAIN, got {item!r}")
        try:
            gain = float(gain_text)
        except ValueError:
            raise ValueError(f"gains: gain {gain_text!r} is not a number") from None
        if not (0 < gain <= 1):
            raise ValueError(f"gains: gain must be in (0, 1], got {gain_text!r}")
        gains[check_cr(cr_text, "gains")] = gain
    return gains


def fill_gains(given: dict[float, float], crs: tuple[float, ...]) -> dict[float, float]:
    """A gain for every candidate CR: the given ones, the others on the line in log
    CR through the nearest two of the given ones and gain 1 at CR 1 (extended below
    the smallest, kept within [0.01, 1]). Nothing given: nothing filled."""
    if not given:
        return {}
    points = sorted({**given, 1.0: given.get(1.0, 1.0)}.items())
    out = {}
    for cr in crs:
        if cr in given:
            out[cr] = given[cr]
            continue
        i = next((k for k, (c, _) in enumerate(points) if c > cr), len(points) - 1)
        (c0, g0), (c1, g1) = points[max(i - 1, 0)], points[max(i, 1)]
        where = math.log(cr / c0) / math.log(c1 / c0)
        out[cr] = min(1.0, max(0.01, g0 + where * (g1 - g0)))
    return out


def decide(config: MooConfig, size: float, net: NetworkObservation, t_compute: float,
           gains: dict[float, float]) -> dict[str, Any]:
    """The MOO's choice from the model alone, as plain data."""
    from flexcomm.policy.types import StepReport

    policy = MooPolicy(size, config)
    policy.observe_network(net)
    if t_compute > 0 or gains:
        gains = fill_gains(gains, config.crs)
        policy.observe_step(StepReport(step=0, cr=1.0, collective="dense_ring", t_comp_s=0.0, t_sync_s=0.0,
                                       gain=1.0, t_compute_s=t_compute, gains=gains))
    rows = policy.evaluate()
    best = policy.choose(rows)
    reason = policy.explain(best, rows)
    return {"cr": best.cr, "collective": best.collective, "seconds": best.t_step_s,
            "sync_s": best.t_sync_s, "comp_s": best.t_comp_s, "reason": reason}


def table(config: MooConfig, size: float, net: NetworkObservation) -> list[dict[str, Any]]:
    comp = config.comp_cost
    rows = []
    for collective in COLLECTIVES:
        crs = (1.0,) if collective in DENSE_COLLECTIVES else config.crs
        for cr in crs:
            p = predict(collective, size, cr, net, config.forms, comp)
            rows.append({"collective": collective, "cr": cr, "seconds": p.total_s,
                         "sync_s": p.sync_s, "comp_s": p.comp_s})
    return rows


def _bucket(args: argparse.Namespace) -> LinkBucket:
    try:
        peak = float(args.link_peak_over_rate)
    except ValueError:
        raise ValueError(f"link-peak-over-rate: expected a number, got {args.link_peak_over_rate!r}") from None
    burst = parse_duration("link-burst", args.link_burst)
    return LinkBucket.checked(peak, burst, ("link-peak-over-rate", "link-burst"))


def sweep(config: MooConfig, size: float, net: NetworkObservation, t_compute: float,
          gains: dict[float, float]) -> list[dict[str, Any]]:
    """Decisions at 4 bandwidths per decade from 1 Mbit/s to 100 Gbit/s."""
    points = []
    for i in range(0, 21):
        bw = 1e6 * 10 ** (i / 4)
        d = decide(config, size, replace(net, beta_s_per_byte=8.0 / bw), t_compute, gains)
        points.append({"bandwidth_bps": bw, "cr": d["cr"], "collective": d["collective"], "seconds": d["seconds"]})
    return points


def run(args: argparse.Namespace) -> int:
    size = parse_bytes("size", args.size)
    latency = parse_duration("latency", args.latency)
    bandwidth = parse_rate("bandwidth", args.bandwidth)
    t_compute = parse_duration("t-compute", args.t_compute)
    bucket = _bucket(args)
    net = NetworkObservation.from_link(latency, bandwidth, args.nodes, bucket)
    config = _config(args, size)
    gains = _gains(args.gains)
    out: dict[str, Any] = {
        "inputs": {"nodes": args.nodes, "size_bytes": size, "latency_s": latency, "bandwidth_bps": bandwidth,
                   "link_bucket": asdict(bucket), "ag_form": args.ag_form, "tree_form": args.tree_form,
                   "t_comp_model": "fixed" if args.t_comp else "estimated",
                   "gains": {f"{cr:g}": g for cr, g in fill_gains(gains, config.crs).items()},
                   "gains_given": sorted(f"{cr:g}" for cr in gains)},
        "decision": decide(config, size, net, t_compute, gains),
        "table": table(config, size, net),
    }
    if args.sweep:
        out["sweep"] = sweep(config, size, net, t_compute, gains)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
    return 0


def _print(out: dict[str, Any]) -> None:
    i = out["inputs"]
    print(f"N={i['nodes']}  M={format_bytes(i['size_bytes'])}  alpha={format_seconds(i['latency_s'])}  "
          f"bandwidth={format_rate(i['bandwidth_bps'])}  forms: ag={i['ag_form']} tree={i['tree_form']}")
    if i["gains"]:
        print("gains: " + "  ".join(f"{cr}={g:.2f}{'' if cr in i['gains_given'] else '*'}"
                                    for cr, g in i["gains"].items()) + "  (* interpolated)")
    b = i["link_bucket"]
    if not LinkBucket(**b).plain:
        print(f"link: token bucket, {b['peak_over_rate']:g}x the bandwidth for {format_seconds(b['burst_s'])} "
              "of credit after idle")
    print(f"{'collective':<12}{'cr':>8}{'sync':>12}{'comp':>12}{'total':>12}")
    for r in out["table"]:
        print(f"{r['collective']:<12}{r['cr']:>8g}{format_seconds(r['sync_s']):>12}"
              f"{format_seconds(r['comp_s']):>12}{format_seconds(r['seconds']):>12}")
    d = out["decision"]
    print(f"\nchoice: {d['collective']} at cr={d['cr']:g}  ({d['reason']})")
    if "sweep" in out:
        print("\nwhere the choice changes:")
        last = None
        for p in out["sweep"]:
            choice = (p["collective"], p["cr"])
            if choice != last:
                print(f"  from {format_rate(p['bandwidth_bps']):>12}: {p['collective']} at cr={p['cr']:g}")
                last = choice
    if not math.isfinite(d["seconds"]):
        raise ValueError("size: the prediction overflowed; check the units")


