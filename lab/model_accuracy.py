"""How well the cost model predicts measured collectives, and what its choices cost.

Input: the `Measured` rows of `flexcomm.lab.calibrate`. For every row the raw
model (`flexcomm.policy.costmodel.sync_time`) is evaluated with

- two formula sets: "paper" (the paper's forms, what the MOO policy uses by
  default) and "ring" (AG-Topk as a ring AllGather, trees pipelined);
- two latencies: "tcp" (half the TCP connect RTT, what the agent's probe
  reports) and "op" (a tiny gloo AllReduce divided by its 2(N-1) messages);

- two bandwidths: "probe" (the iperf3 goodput between two nodes, what the
  agent's bandwidth probe reports) and "rate" (the shaped link rate, headers
  and all);
- two links: "bucket" (the links' token bucket, recorded with each row, which
  the lab's agents are given) and "plain" (the paper's alpha-beta link).

Calibration uses the very class the agent uses (`costmodel.Calibration`): it is
fed the raw prediction and the measured time of the points of one half of the
grid (a checkerboard over the rate, N, size and CR indices, so the split is
deterministic and every held-out point has fitted neighbours) and judged on the
other half.

Decision regret, per (rate, N, size, CR): the measured time of the Top-k
collective the calibrated model picks, over the fastest measured one. And per
(rate, N, size) over every option including dense AllReduce, on sync plus the
measured compression time (the agent knows t_comp from the client's reports).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from flexcomm.lab.calibrate import Measured
from flexcomm.lab.cluster import burst_after_idle
from flexcomm.policy.costmodel import Calibration, ModelForms, alpha_beta_terms, sync_time
from flexcomm.policy.types import DENSE_RING, PLAIN_LINK, NetworkObservation

FORMS = {"paper": ModelForms("paper", "paper"), "ring": ModelForms("ring", "pipelined")}
ALPHAS = ("tcp", "op")
BETAS = ("probe", "rate")
LINKS = ("bucket", "plain")
# What the agent runs with: default forms, probed latency and bandwidth, the links' bucket.
HEADLINE = ("paper", "tcp", "probe", "bucket")
SCOPES = ("job", "grid")
AGENT_DECAY = Calibration().decay
FULL_WINDOW_DECAY = 0.999  # the same fit, forgetting (almost) nothing
REGRET_OK = 1.05
NOISE = 0.03
# Operations shorter than this are dominated by per-call overhead and scheduling
# noise on a loaded 2-core machine; longer ones by the link (reported apart).
BANDWIDTH_BOUND_S = 0.05


def variant_name(forms: str, alpha: str, beta: str, link: str) -> str:
    return f"{forms}+alpha_{alpha}+beta_{beta}+{link}"


def raw_prediction(row: Measured, forms: str, alpha: str, beta: str, link: str) -> float:
    """The model's prediction; beta "probe" falls back to the rate for runs that
    did not probe (older measurement files)."""
    a = row.alpha_tcp_s if alpha == "tcp" else row.alpha_op_s
    bps = row.bandwidth_probe_bps if beta == "probe" and row.bandwidth_probe_bps > 0 else row.rate_bps
    bucket = row.bucket if link == "bucket" else PLAIN_LINK
    net = NetworkObservation(alpha_s=a, beta_s_per_byte=8.0 / bps, nodes=row.nodes, bucket=bucket)
    return sync_time(row.collective, row.size_bytes, row.cr, net, FORMS[forms])


def rel_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


def split(rows: Sequence[Measured]) -> tuple[list[Measured], list[Measured]]:
    """(fit half, held-out half): checkerboard parity of the grid indices."""
    axes = [sorted({r.rate_bps for r in rows}), sorted({r.nodes for r in rows}),
            sorted({r.size_bytes for r in rows}), sorted({r.cr for r in rows})]

    def parity(r: Measured) -> int:
        values = (r.rate_bps, r.nodes, r.size_bytes, r.cr)
        return sum(axis.index(v) for axis, v in zip(axes, values, strict=True)) % 2

    fit = [r for r in rows if parity(r) == 0]
    held = [r for r in rows if parity(r) == 1]
    return fit, held


def fit_calibration(rows: Iterable[Measured], forms: str, alpha: str, beta: str, link: str,
                    decay: float) -> Calibration:
    """The agent's Calibration fed (raw, measured) in grid order."""
    cal = Calibration(decay)
    for r in sorted(rows, key=lambda r: (r.nodes, -r.rate_bps, r.size_bytes, r.collective, -r.cr)):
        cal.observe(r.collective, raw_prediction(r, forms, alpha, beta, link), r.t_sync_s)
    return cal


def job_of(r: Measured) -> tuple[int, int]:
    """What one agent's policy serves: a job of N ranks with one gradient size."""
    return (r.nodes, r.size_bytes)


@dataclass(frozen=True)
class Variant:
    """One (forms, alpha, beta, link, decay, scope) choice and its fitted calibrations.

    scope "job": one Calibration per job (N, gradient size), as at run time, where
    each job's MooPolicy holds its own; scope "grid": one Calibration for the
    whole grid (every size and N mixed), a harder test than the agent ever faces.
    """

    forms: str
    alpha: str
    beta: str
    link: str
    decay: float
    scope: str
    calibrations: dict[Any, Calibration]

    def _key(self, r: Measured) -> Any:
        return job_of(r) if self.scope == "job" else None

    def raw(self, r: Measured) -> float:
        return raw_prediction(r, self.forms, self.alpha, self.beta, self.link)

    def calibrated(self, r: Measured) -> float:
        cal = self.calibrations.get(self._key(r))
        return cal.apply(r.collective, self.raw(r)) if cal else self.raw(r)

    def reported_error(self) -> float:
        """What the agent would report as the model's error (Calibration.error()),
        the median over the calibrations."""
        return statistics.median(c.error() for c in self.calibrations.values())


def build_variant(fit_rows: Sequence[Measured], forms: str, alpha: str, beta: str, link: str, decay: float,
                  scope: str = "job") -> Variant:
    if scope not in SCOPES:
        raise ValueError(f"scope: unknown calibration scope {scope!r} (one of job, grid)")
    groups: dict[Any, list[Measured]] = {}
    for r in fit_rows:
        groups.setdefault(job_of(r) if scope == "job" else None, []).append(r)
    cals = {key: fit_calibration(rows, forms, alpha, beta, link, decay) for key, rows in groups.items()}
    return Variant(forms, alpha, beta, link, decay, scope, cals)


def median_error(rows: Iterable[Measured], predict: Callable[[Measured], float]) -> float:
    errs = [rel_error(predict(r), r.t_sync_s) for r in rows]
    return statistics.median(errs) if errs else float("nan")


def by_regime(rows: Iterable[Measured], predict: Callable[[Measured], float]) -> dict[str, float | int]:
    rows = list(rows)
    slow = [r for r in rows if r.t_sync_s >= BANDWIDTH_BOUND_S]
    fast = [r for r in rows if r.t_sync_s < BANDWIDTH_BOUND_S]
    return {"bandwidth_bound": round(median_error(slow, predict), 4), "bandwidth_bound_points": len(slow),
            "overhead_bound": round(median_error(fast, predict), 4), "overhead_bound_points": len(fast)}


def repetition_spread(rows: Iterable[Measured]) -> float:
    """Median over points of the repetitions' interquartile range over their median:
    how noisy one measurement is."""
    spreads = [(r.quartiles[1] - r.quartiles[0]) / r.t_sync_s for r in rows]
    return round(statistics.median(spreads), 4) if spreads else float("nan")


def error_summary(rows: Sequence[Measured], held: Sequence[Measured], v: Variant) -> dict[str, Any]:
    by_coll = {}
    for c in sorted({r.collective for r in rows}):
        mine = [r for r in rows if r.collective == c]
        mine_held = [r for r in held if r.collective == c]
        by_coll[c] = {"raw": round(median_error(mine, v.raw), 4),
                      "calibrated_heldout": round(median_error(mine_held, v.calibrated), 4)}
    return {
        "median_abs_error_raw": round(median_error(rows, v.raw), 4),
        "median_abs_error_raw_heldout": round(median_error(held, v.raw), 4),
        "median_abs_error_calibrated": round(median_error(held, v.calibrated), 4),
        "calibration_reported_error": round(v.reported_error(), 4),
        "raw_by_regime": by_regime(rows, v.raw),
        "calibrated_heldout_by_regime": by_regime(held, v.calibrated),
        "by_collective": by_coll,
    }


# --- decision regret ---------------------------------------------------------------

@dataclass(frozen=True)
class Regret:
    key: dict[str, Any]
    chosen: Measured
    fastest: Measured
    predicted: dict[str, float]  # option label -> predicted time the choice used
    ratio: float
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = {**self.key, "chosen": label(self.chosen), "fastest": label(self.fastest),
             "regret": round(self.ratio, 4),
             "measured_chosen_s": round(total(self.chosen, self.key.get("with_comp", False)), 6),
             "measured_fastest_s": round(total(self.fastest, self.key.get("with_comp", False)), 6),
             "predicted_s": {k: round(v, 6) for k, v in self.predicted.items()}}
        if self.reason:
            d["reason"] = self.reason
        return d


def label(r: Measured) -> str:
    return r.collective if r.collective == DENSE_RING else f"{r.collective}@{r.cr:g}"


def total(r: Measured, with_comp: bool) -> float:
    return r.t_sync_s + (r.t_comp_s if with_comp else 0.0)


def _regret(options: Sequence[Measured], predict: Callable[[Measured], float], key: dict[str, Any],
            with_comp: bool) -> Regret:
    predicted = {label(r): predict(r) + (r.t_comp_s if with_comp else 0.0) for r in options}
    chosen = min(options, key=lambda r: (predicted[label(r)], -r.cr, r.collective))
    fastest = min(options, key=lambda r: total(r, with_comp))
    ratio = total(chosen, with_comp) / total(fastest, with_comp)
    key = {**key, "with_comp": with_comp}
    regret = Regret(key, chosen, fastest, predicted, ratio)
    return replace(regret, reason=explain(regret, with_comp)) if ratio > REGRET_OK else regret


def regrets_per_cr(rows: Sequence[Measured], predict: Callable[[Measured], float]) -> list[Regret]:
    """Among the Top-k collectives at each (rate, N, size, CR)."""
    out = []
    sparse = sorted((r for r in rows if r.collective != DENSE_RING), key=_point)
    for (rate, n, size, cr), group in itertools.groupby(sparse, key=_point):
        options = list(group)
        if len(options) > 1:
            key = {"rate_mbit": rate / 1e6, "nodes": n, "size_bytes": size, "cr": cr}
            out.append(_regret(options, predict, key, with_comp=False))
    return out


def regrets_with_dense(rows: Sequence[Measured], predict: Callable[[Measured], float]) -> list[Regret]:
    """Among every option (dense and each Top-k collective at each CR) at each
    (rate, N, size), on sync + measured compression time."""
    out = []
    ordered = sorted(rows, key=_config)
    for (rate, n, size), group in itertools.groupby(ordered, key=_config):
        options = list(group)
        key = {"rate_mbit": rate / 1e6, "nodes": n, "size_bytes": size}
        out.append(_regret(options, predict, key, with_comp=True))
    return out


def _point(r: Measured) -> tuple[float, int, int, float]:
    return (r.rate_bps, r.nodes, r.size_bytes, r.cr)


def _config(r: Measured) -> tuple[float, int, int]:
    return (r.rate_bps, r.nodes, r.size_bytes)


def explain(g: Regret, with_comp: bool) -> str:
    """Why the choice missed the fastest option by more than REGRET_OK."""
    a, b = g.chosen, g.fastest
    ma, mb = total(a, with_comp), total(b, with_comp)
    pa, pb = g.predicted[label(a)], g.predicted[label(b)]
    qa, qb = _quartiles(a, with_comp), _quartiles(b, with_comp)
    if ma <= mb * (1 + NOISE):
        return f"within noise: the two measured times differ by < {NOISE:.0%}"
    if qa[0] <= qb[1]:
        return (f"within noise: the middle halves of the repetitions overlap ({label(a)} {_ms(qa)}, "
                f"{label(b)} {_ms(qb)}; medians {ma * 1e3:.1f} vs {mb * 1e3:.1f} ms)")
    burst = _burst_message(b)
    if burst:
        return (f"the shaper's burst: {label(b)} sends {burst / 1e3:.0f} KB per message, below the "
                f"{link_burst(b) / 1024:.0f} KB the link passes at line rate after idle, which crosses a "
                f"{b.rate_bps / 1e6:g} Mbit/s link "
                f"faster than its rate (measured {mb:.3g} s, predicted {pb:.3g} s); {label(a)} measured "
                f"{ma:.3g} s, predicted {pa:.3g} s")
    if a.t_sync_s < BANDWIDTH_BOUND_S and b.t_sync_s < BANDWIDTH_BOUND_S:
        return (f"overhead-bound ({ma * 1e3:.1f} vs {mb * 1e3:.1f} ms measured, predicted {pa * 1e3:.2f} vs "
                f"{pb * 1e3:.2f} ms): the model misses gloo's per-call overhead, which differs between "
                f"{a.collective} and {b.collective} (calls, threads, scheduling on a loaded CPU)")
    return (f"mis-ranked: predicted {label(a)}/{label(b)} = {pa / pb:.2f}, measured {ma / mb:.2f}; "
            f"{label(a)} measured {ma:.3g} s against {pa:.3g} s predicted, {label(b)} {mb:.3g} s against "
            f"{pb:.3g} s")


def _burst_message(r: Measured) -> float:
    """The bytes per message when `r` ran faster than its link allows because its
    messages fit the HTB burst, else 0."""
    message = r.size_bytes * r.cr
    link_bytes = alpha_beta_terms(r.collective, r.size_bytes, r.cr, r.nodes, FORMS["paper"])[1]
    fast = r.t_sync_s < 0.75 * link_bytes * 8 / r.rate_bps  # the plain link's bandwidth term
    return message if r.collective != DENSE_RING and message <= link_burst(r) and fast else 0.0


def link_burst(r: Measured) -> int:
    """Bytes `r`'s link passed at line rate after idle (as its run recorded it;
    runs that did not record it get today's rule)."""
    return r.burst_bytes or burst_after_idle(r.rate_bps)


def _quartiles(r: Measured, with_comp: bool) -> tuple[float, float]:
    extra = r.t_comp_s if with_comp else 0.0
    return r.quartiles[0] + extra, r.quartiles[1] + extra


def _ms(spread: tuple[float, float]) -> str:
    return f"{spread[0] * 1e3:.1f}-{spread[1] * 1e3:.1f} ms"


def share_ok(regrets: Sequence[Regret], noise_ok: bool = False) -> float:
    """Share of points with regret <= REGRET_OK (or, with noise_ok, explained as noise)."""
    if not regrets:
        return float("nan")
    ok = [g.ratio <= REGRET_OK or (noise_ok and g.reason.startswith("within noise")) for g in regrets]
    return sum(ok) / len(ok)


__all__ = [
    "ALPHAS",
    "BETAS",
    "FORMS",
    "HEADLINE",
    "LINKS",
    "Regret",
    "Variant",
    "build_variant",
    "error_summary",
    "raw_prediction",
    "regrets_per_cr",
    "regrets_with_dense",
    "share_ok",
    "split",
]
