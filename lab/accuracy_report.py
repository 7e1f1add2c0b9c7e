"""The cost-model accuracy report in a run directory.

`write_report(run_dir, rows, meta)` writes:
- `measured.json`: the measured rows (re-analyse with `load_measured`);
- `table.csv`: one line per grid point with the measurement, its repetitions'
  spread, the raw prediction of every variant, the headline calibrated
  prediction and whether the point was fitted or held out;
- `predicted_vs_measured.png`: log-log, raw and calibrated (held-out) headline
  predictions against measured time, one colour per collective;
- `model_accuracy.json`: the headline figures, every variant, and every regret
  above 1.05 with its reason. Returned as a dict too.
"""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flexcomm.lab.calibrate import Measured
from flexcomm.lab.model_accuracy import (
    AGENT_DECAY,
    ALPHAS,
    BETAS,
    FORMS,
    FULL_WINDOW_DECAY,
    HEADLINE,
    LINKS,
    REGRET_OK,
    SCOPES,
    Variant,
    build_variant,
    error_summary,
    raw_prediction,
    regrets_per_cr,
    regrets_with_dense,
    repetition_spread,
    share_ok,
    split,
    variant_name,
)


def load_measured(path: Path) -> list[Measured]:
    return [Measured(**row) for row in json.loads(path.read_text(encoding="utf-8"))]


def analyse(rows: list[Measured]) -> tuple[dict[str, Any], Variant, set[int]]:
    """The figures, the headline variant, and the ids of held-out rows."""
    if not rows:
        raise ValueError("rows: nothing was measured")
    fit, held = split(rows)
    if not fit or not held:
        raise ValueError("rows: the grid is too small to split into fitted and held-out halves")
    variants = {}
    for combo in itertools.product(FORMS, ALPHAS, BETAS, LINKS):
        for decay in (AGENT_DECAY, FULL_WINDOW_DECAY):
            for scope in SCOPES:
                v = build_variant(fit, *combo, decay, scope)
                name = f"{variant_name(*combo)}@decay{decay:g}/per_{scope}"
                variants[name] = (v, error_summary(rows, held, v))
    probed = all(r.bandwidth_probe_bps > 0 for r in rows)
    headline = f"{variant_name(*HEADLINE)}@decay{AGENT_DECAY:g}"
    head, summary = variants[f"{headline}/per_job"]
    grid_wide = variants[f"{headline}/per_grid"][1]
    per_cr = regrets_per_cr(rows, head.calibrated)
    with_dense = regrets_with_dense(rows, head.calibrated)
    held_ids = {id(r) for r in held}
    per_cr_held = [g for g in per_cr if id(g.chosen) in held_ids]
    raw_per_cr = regrets_per_cr(rows, head.raw)
    result = {
        "median_abs_error_raw": summary["median_abs_error_raw"],
        "median_abs_error_calibrated": summary["median_abs_error_calibrated"],
        # Headline on the held-out half: the calibration never saw those points.
        "regret_within_5pct_share": round(share_ok(per_cr_held), 4),
        "regret_within_5pct_share_all_points": round(share_ok(per_cr), 4),
        "regret_within_5pct_share_raw_model": round(share_ok(raw_per_cr), 4),
        "regret_within_5pct_or_noise_share": round(share_ok(per_cr_held, noise_ok=True), 4),
        "regret_with_dense_within_5pct_share": round(share_ok(with_dense), 4),
        "median_abs_error_calibrated_one_for_the_grid": grid_wide["median_abs_error_calibrated"],
        "repetition_spread_median": repetition_spread(rows),
        "headline": {"forms": HEADLINE[0], "alpha": HEADLINE[1], "link": HEADLINE[3],
                     "link_bucket": _buckets(rows), "decay": AGENT_DECAY, "scope": "job",
                     "beta": "8 / iperf3 goodput between two nodes (s per byte)" if probed
                     else "8 / shaped link rate (s per byte): this run did not probe",
                     "errors": summary},
        "variants": {name: s for name, (_v, s) in variants.items()},
        "points": len(rows), "fitted_points": len(fit), "heldout_points": len(held),
        "regret_points": len(per_cr_held), "regret_points_all": len(per_cr),
        "regret_with_dense_points": len(with_dense),
        "regret_worse_than_1_05": [g.to_dict() for g in per_cr if g.ratio > REGRET_OK],
        "regret_with_dense_worse_than_1_05": [g.to_dict() for g in with_dense if g.ratio > REGRET_OK],
        "regret_with_dense": [g.to_dict() for g in with_dense],
    }
    return result, head, held_ids


def _buckets(rows: list[Measured]) -> list[dict[str, float]]:
    """The links' token buckets the rows were measured on."""
    return [asdict(b) for b in sorted({r.bucket for r in rows}, key=lambda b: (b.peak_over_rate, b.burst_s))]


def write_table(path: Path, rows: list[Measured], head: Variant, held_ids: set[int]) -> None:
    combos = list(itertools.product(FORMS, ALPHAS, BETAS, LINKS))
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["rate_mbit", "nodes", "size_bytes", "collective", "cr", "measured_s", "min_s", "max_s",
                    "repeats", "t_comp_s", "alpha_op_s", "alpha_tcp_s", "bandwidth_probe_mbit", "load_avg",
                    *(f"raw_{variant_name(*c)}_s" for c in combos), "calibrated_s", "half"])
        for r in rows:
            raws = [raw_prediction(r, *c) for c in combos]
            w.writerow([r.rate_bps / 1e6, r.nodes, r.size_bytes, r.collective, r.cr, f"{r.t_sync_s:.6g}",
                        f"{r.spread[0]:.6g}", f"{r.spread[1]:.6g}", len(r.samples_s), f"{r.t_comp_s:.6g}",
                        f"{r.alpha_op_s:.6g}", f"{r.alpha_tcp_s:.6g}", f"{r.bandwidth_probe_bps / 1e6:.4g}",
                        f"{r.load_avg:.2f}",
                        *(f"{x:.6g}" for x in raws), f"{head.calibrated(r):.6g}",
                        "heldout" if id(r) in held_ids else "fit"])


def write_plot(path: Path, rows: list[Measured], head: Variant, held_ids: set[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5), sharex=True, sharey=True)
    colours = {"dense_ring": "tab:blue", "ag_topk": "tab:orange", "art_ring": "tab:green",
               "art_tree": "tab:red"}
    panels = [(axes[0], rows, head.raw, f"raw ({variant_name(*HEADLINE)})"),
              (axes[1], [r for r in rows if id(r) in held_ids], head.calibrated,
               "calibrated (the agent's Calibration, one per job), held-out half")]
    values = [r.t_sync_s for r in rows] + [head.raw(r) for r in rows]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    for ax, subset, predict, title in panels:
        for coll, colour in colours.items():
            pts = [r for r in subset if r.collective == coll]
            if pts:
                ax.scatter([r.t_sync_s for r in pts], [predict(r) for r in pts], s=14, c=colour, label=coll,
                           alpha=0.8)
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.2,
                        label="±10%")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=title,
               xlabel="measured sync time (s)")
        ax.grid(True, which="both", lw=0.3)
    axes[0].set_ylabel("predicted sync time (s)")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle("flexcomm cost model vs gloo collectives on the emulated cluster")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(run_dir: Path, rows: list[Measured], meta: dict[str, Any]) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "measured.json").write_text(json.dumps([asdict(r) for r in rows], indent=1), encoding="utf-8")
    result, head, held_ids = analyse(rows)
    result = {**result, **meta}
    write_table(run_dir / "table.csv", rows, head, held_ids)
    write_plot(run_dir / "predicted_vs_measured.png", rows, head, held_ids)
    (run_dir / "model_accuracy.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


__all__ = ["analyse", "load_measured", "write_report"]
