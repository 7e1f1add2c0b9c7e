"""`flexcomm model`: what would the cost model and the MOO choose here?

Prints the predicted time of every option (each compressor family at each of
its parameters, over each collective it runs on) for the given network and
gradient, the fastest of each family, and the decision the MOO would make
among its candidates, with its reason. Nothing
is measured: this is the model alone. Gains are unknown unless --gains gives
them; options without a gain are then left out of the choice.

PowerSGD's cost depends on the gradient's matrices: give them with --matrices
(e.g. 4096x1024*24,1024x4096*24); without them the gradient is one flat vector,
in which PowerSGD finds nothing to compress.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, replace
from typing import Any

from flexcomm.policy.costmodel import AG_FORMS, TREE_FORMS
from flexcomm.policy.evaluation import Evaluation
from flexcomm.policy.moo import MooConfig, MooPolicy
from flexcomm.policy.types import (
    DENSE,
    DENSE_RING,
    FAMILIES,
    FAMILY_COLLECTIVES,
    Compression,
    GradientLayout,
    LinkBucket,
    NetworkObservation,
    StepReport,
    check_cr,
)
from flexcomm.units import (
    format_bytes,
    format_rate,
    format_seconds,
    parse_bytes,
    parse_duration,
    parse_rate,
)

EXAMPLES = (
    "examples:\n"
    "  flexcomm model --nodes 8 --size 100MB --latency 1ms --bandwidth 1Gbit --sweep\n"
    "  flexcomm model --nodes 4 --size 64MB --latency 100us --bandwidth 20Mbit --matrices 1024x4096*2,4096x1024"
    " --gains topk:0.011=0.4,powersgd:4=0.8,powersgd:1=0.6\n"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="predict every option's step time, and the choice",
                       description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, required=True, help="number of workers N (>= 2)")
    p.add_argument("--size", required=True, help="dense gradient size, e.g. 100MB, 25MiB")
    p.add_argument("--latency", required=True, help="per-message latency alpha, e.g. 1ms, 50us")
    p.add_argument("--bandwidth", required=True, help="link bandwidth, e.g. 10Gbit, 200Mbit")
    p.add_argument("--link-peak-over-rate", default="1.0",
                   help="token-bucket link: peak rate over the bandwidth (default 1.0, a plain link)")
    p.add_argument("--link-burst", default="0s",
                   help="token-bucket link: credit at the bandwidth, e.g. 5ms (default 0s, a plain link)")
    p.add_argument("--matrices", help="the gradient's matrices as ROWSxCOLS[*COUNT],... "
                                      "(the rest of --size is taken as vectors)")
    p.add_argument("--value-bytes", type=int, default=4, help="bytes of one gradient value (default 4; 2 for bf16)")
    p.add_argument("--families", default=",".join(FAMILIES),
                   help=f"compressor families to consider (default {','.join(FAMILIES)})")
    p.add_argument("--ranks", default="1,2,4", help="PowerSGD ranks to consider (default 1,2,4)")
    p.add_argument("--cr", help="consider only this Top-k compression ratio (0 < cr < 1)")
    p.add_argument("--t-comp", help="compression time of a Top-k option (default: the model's estimate)")
    p.add_argument("--t-compute", default="0s", help="the rest of a step's time: forward, backward... (default 0s)")
    p.add_argument("--quality-reference",
                   help="what the run may lose, as the MOO's quality_reference: a compression, or one per "
                        f"family joined by + (default {MooConfig.quality_reference})")
    p.add_argument("--gains", help="gains of lossy options as COMPRESSION=GAIN,..., e.g. "
                                   "topk:0.01=0.4,powersgd:2=0.8 (default: unknown)")
    p.add_argument("--ag-form", choices=AG_FORMS, default="paper", help="AllGather formula (default paper)")
    p.add_argument("--tree-form", choices=TREE_FORMS, default="paper", help="tree formula (default paper)")
    p.add_argument("--sweep", action="store_true", help="show where the choice changes across bandwidths")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace, size: float) -> MooConfig:
    kw: dict[str, Any] = {"ag_form": args.ag_form, "tree_form": args.tree_form, "warmup_steps": 0,
                          "families": args.families, "ranks": _ranks(args.ranks)}
    if args.cr is not None:
        cr = check_cr(args.cr, "cr")
        if cr == 1.0:
            raise ValueError("cr: 1 is dense; give a ratio below 1 or leave --cr out")
        kw.update(c_low=cr, c_high=cr)
    if args.t_comp is not None:
        t = parse_duration("t-comp", args.t_comp)
        kw.update(comp_per_byte=t / size, comp_per_selected_byte=0.0)
    if args.quality_reference is not None:
        kw["quality_reference"] = args.quality_reference
    try:
        return MooConfig.from_options(kw)
    except ValueError as exc:
        message = str(exc).replace("dense_collectives", "collectives", 1)
        raise ValueError(message.replace("quality_reference", "quality-reference", 1)) from None


def _ranks(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"ranks: expected whole numbers such as 1,2,4, got {text!r}") from None


def _layout(text: str | None, size: float, value_bytes: int) -> GradientLayout:
    """The gradient: --matrices, and the rest of --size as vector values."""
    if value_bytes not in (1, 2, 4, 8):
        raise ValueError(f"value-bytes: must be 1, 2, 4 or 8, got {value_bytes}")
    values = math.ceil(size / value_bytes)
    matrices: list[tuple[int, int]] = []
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        shape, _, count = item.partition("*")
        rows, sep, cols = shape.partition("x")
        try:
            n, m, k = int(rows), int(cols), int(count or 1)
        except ValueError:
            raise ValueError(f"matrices: expected ROWSxCOLS[*COUNT], got {item!r}") from None
        if not sep or min(n, m, k) < 1:
            raise ValueError(f"matrices: expected ROWSxCOLS[*COUNT] of positive numbers, got {item!r}")
        matrices += [(n, m)] * k
    rest = values - sum(n * m for n, m in matrices)
    if rest < 0:
        raise ValueError(f"matrices: they hold {values - rest} values, more than --size has ({values})")
    return GradientLayout(tuple(matrices), rest, value_bytes)


def _gains(text: str | None) -> dict[str, float]:
    gains: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, gain_text = item.partition("=")
        if not sep:
            raise ValueError(f"gains: expected COMPRESSION=GAIN (e.g. topk:0.01=0.4), got {item!r}")
        c = Compression.parse(name, "gains")
        if not c.lossy:
            raise ValueError(f"gains: {name} loses nothing (its gain is 1); give gains of topk and powersgd")
        try:
            gain = float(gain_text)
        except ValueError:
            raise ValueError(f"gains: gain {gain_text!r} is not a number") from None
        if not (0 < gain <= 1):
            raise ValueError(f"gains: gain must be in (0, 1], got {gain_text!r}")
        gains[c.name] = gain
    return gains


def evaluate(config: MooConfig, layout: GradientLayout, net: NetworkObservation, t_compute: float,
             gains: dict[str, float]) -> tuple[MooPolicy, list[Evaluation]]:
    """Every option as the model predicts it on `net`."""
    policy = MooPolicy(layout.grad_bytes, config, layout)
    policy.observe_network(net)
    unknown = sorted(set(gains) - set(policy.probes))
    if unknown:
        raise ValueError(f"gains: {unknown[0]} is not among the options considered ({', '.join(policy.probes)})")
    if t_compute > 0 or gains:
        policy.observe_steps([StepReport(step=0, family=DENSE, param=0.0, collective=DENSE_RING, t_comp_s=0.0,
                                         t_sync_s=0.0, gain=1.0, t_compute_s=t_compute, gains=gains)])
    return policy, policy.evaluate()


def decide(config: MooConfig, layout: GradientLayout, net: NetworkObservation, t_compute: float,
           gains: dict[str, float]) -> dict[str, Any]:
    """The MOO's choice from the model alone, as plain data."""
    policy, rows = evaluate(config, layout, net, t_compute, gains)
    left_out = [r.label for r in rows if r.gain is None] if gains else []
    rows = [r for r in rows if r.gain is not None] if gains else rows
    if not rows:
        raise ValueError("gains: no option has a gain; give gains of topk and powersgd, or none")
    best = policy.best(rows)
    reason = policy.explain(best, rows)
    if left_out:
        reason += f"; {len(left_out)} option(s) without a gain left out"
    c = best.option.compression
    return {"option": best.label, "family": c.family, "param": c.param, "collective": best.option.collective,
            "seconds": best.t_step_s, "sync_s": best.t_sync_s, "comp_s": best.t_comp_s, "gain": best.gain,
            "reason": reason}


def table(config: MooConfig, layout: GradientLayout, net: NetworkObservation, t_compute: float,
          gains: dict[str, float]) -> list[dict[str, Any]]:
    """Every option, the lossless ones over every dense collective (the model-only
    parameter server too), not only those the MOO would choose among."""
    every = replace(config, dense_collectives=FAMILY_COLLECTIVES[DENSE])
    _policy, rows = evaluate(every, layout, net, t_compute, gains)
    return [r.to_dict() for r in rows]


def best_per_family(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["family"] not in best or r["t_step_s"] < best[r["family"]]["t_step_s"]:
            best[r["family"]] = r
    return best


def _bucket(args: argparse.Namespace) -> LinkBucket:
    try:
        peak = float(args.link_peak_over_rate)
    except ValueError:
        raise ValueError(f"link-peak-over-rate: expected a number, got {args.link_peak_over_rate!r}") from None
    burst = parse_duration("link-burst", args.link_burst)
    return LinkBucket.checked(peak, burst, ("link-peak-over-rate", "link-burst"))


def sweep(config: MooConfig, layout: GradientLayout, net: NetworkObservation, t_compute: float,
          gains: dict[str, float]) -> list[dict[str, Any]]:
    """Decisions at 4 bandwidths per decade from 1 Mbit/s to 100 Gbit/s."""
    points = []
    for i in range(0, 21):
        bw = 1e6 * 10 ** (i / 4)
        d = decide(config, layout, replace(net, beta_s_per_byte=8.0 / bw), t_compute, gains)
        points.append({"bandwidth_bps": bw, "option": d["option"], "seconds": d["seconds"]})
    return points


def run(args: argparse.Namespace) -> int:
    size = parse_bytes("size", args.size)
    latency = parse_duration("latency", args.latency)
    bandwidth = parse_rate("bandwidth", args.bandwidth)
    t_compute = parse_duration("t-compute", args.t_compute)
    bucket = _bucket(args)
    net = NetworkObservation.from_link(latency, bandwidth, args.nodes, bucket)
    layout = _layout(args.matrices, size, args.value_bytes)
    config = _config(args, size)
    gains = _gains(args.gains)
    rows = table(config, layout, net, t_compute, gains)
    out: dict[str, Any] = {
        "inputs": {"nodes": args.nodes, "size_bytes": size, "latency_s": latency, "bandwidth_bps": bandwidth,
                   "link_bucket": asdict(bucket), "ag_form": args.ag_form, "tree_form": args.tree_form,
                   "t_compute_s": t_compute, "matrices": len(layout.matrices), "value_bytes": layout.value_bytes,
                   "t_comp_model": "fixed" if args.t_comp else "estimated"},
        "decision": decide(config, layout, net, t_compute, gains),
        "best_per_family": best_per_family(rows),
        "table": rows,
    }
    if args.sweep:
        out["sweep"] = sweep(config, layout, net, t_compute, gains)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
    return 0


def _print(out: dict[str, Any]) -> None:
    i = out["inputs"]
    print(f"N={i['nodes']}  M={format_bytes(i['size_bytes'])} ({i['matrices']} matrices, "
          f"{i['value_bytes']} bytes a value)  alpha={format_seconds(i['latency_s'])}  "
          f"bandwidth={format_rate(i['bandwidth_bps'])}  forms: ag={i['ag_form']} tree={i['tree_form']}")
    b = i["link_bucket"]
    if not LinkBucket(**b).plain:
        print(f"link: token bucket, {b['peak_over_rate']:g}x the bandwidth for {format_seconds(b['burst_s'])} "
              "of credit after idle")
    print(f"{'option':<26}{'sync':>12}{'comp':>12}{'step':>12}{'gain':>8}")
    for r in out["table"]:
        gain = "?" if r["gain"] is None else f"{r['gain']:.2f}"
        print(f"{r['option']:<26}{format_seconds(r['t_sync_s']):>12}{format_seconds(r['t_comp_s']):>12}"
              f"{format_seconds(r['t_step_s']):>12}{gain:>8}")
    print("\nfastest of each family:")
    for family, r in out["best_per_family"].items():
        print(f"  {family:<10}{r['option']:<26}{format_seconds(r['t_step_s']):>12}")
    d = out["decision"]
    print(f"\nchoice: {d['option']}  ({d['reason']})")
    if "sweep" in out:
        print("\nwhere the choice changes:")
        last = None
        for p in out["sweep"]:
            if p["option"] != last:
                print(f"  from {format_rate(p['bandwidth_bps']):>12}: {p['option']}")
                last = p["option"]
    if not math.isfinite(d["seconds"]):
        raise ValueError("size: the prediction overflowed; check the units")
