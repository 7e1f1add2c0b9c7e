"""The alpha-beta cost model of gradient synchronisation.

alpha: per-message latency (s); beta: seconds per byte; M: dense message bytes;
N: workers; c: compression ratio k/M. Logs are base 2.

| collective | paper form                          | variant                            |
|------------|-------------------------------------|------------------------------------|
| ps         | 2a + 2(N-1)Mb                       |                                    |
| dense_ring | 2(N-1)a + 2((N-1)/N)Mb              |                                    |
| dense_tree | 2a logN + 2 logN Mb                 | pipelined (NCCL): 2a logN + 2Mb    |
| ag_topk    | a logN + 2(N-1)Mcb                  | ring: (N-1)a + (N-1)s cM b         |
| art_ring   | a[2(N-1)+logN] + Mcb[2(N-1)/N+logN] |                                    |
| art_tree   | 3a logN + 3Mcb logN                 | pipelined: a logN + Mcb logN + 2a logN + 2Mcb |

s = (value bytes + index bytes) / value bytes: 2 for fp32 values with int32
indices. AR-Topk is an index broadcast (binomial tree: a logN + Mcb logN)
followed by an AllReduce of the values at those indices; its tree variant
swaps the paper's tree AllReduce for the pipelined one.

Every form is alpha * A + beta * B (`alpha_beta_terms`): A message latencies
on the critical path, B the bytes of the bandwidth term. A link with a token bucket
(`NetworkObservation.bucket`: peak rate p, burst credit b, as in RFC 2212) sends
those bytes after idle in max(beta B / p, beta B - b) rather than beta B; a plain
link is the paper's model exactly.

Each compressor family moves its own bytes (`option_terms`): dense M = V v bytes
for V values of v bytes; bf16 2V; topk as in the table at c; powersgd two ring
AllReduces in turn, of the P factors (sum of r n) and then of the Q factors (sum
of r m) with the tensors it leaves dense, over the matrices (n x m) that
PowerSGD's own rule compresses at rank r (`powersgd_split`).

Compressed options also pay compute, t_comp (`CompressionCost`): Top-k its
selection passes over the whole gradient plus packing/scatter of the selected
entries; bf16 two casts; PowerSGD about 6 n m r flops per matrix (P = MQ,
Q = M^T P, the product PQ^T). The defaults were read off this project's
compressors on a 2-core CPU and are scaled by what the client measures.

`Calibration` turns raw predictions into calibrated ones with a per-collective
affine fit (exponentially forgotten least squares) of measured against
predicted sync time, and keeps the model's current relative error. The agent
and the validation benchmark use this same class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from flexcomm.policy.types import (
    AG_TOPK,
    ART_RING,
    ART_TREE,
    BF16,
    COLLECTIVES,
    DENSE,
    DENSE_RING,
    DENSE_TREE,
    POWERSGD,
    PS,
    TOPK,
    Compression,
    GradientLayout,
    NetworkObservation,
    check_collective,
    check_cr,
    check_pairing,
)

AG_FORMS = ("paper", "ring")
TREE_FORMS = ("paper", "pipelined")


def _log2(n: int) -> float:
    return math.log2(n)


@dataclass(frozen=True)
class ModelForms:
    """Which formula variants a prediction uses: the paper's, and a variant of each
    for how NCCL and gloo really run AllGather (a ring) and trees (pipelined)."""

    ag: str = "paper"
    tree: str = "paper"
    value_bytes: int = 4
    index_bytes: int = 4

    def __post_init__(self) -> None:
        if self.ag not in AG_FORMS:
            raise ValueError(f"ag_form: unknown form {self.ag!r} (one of paper, ring)")
        if self.tree not in TREE_FORMS:
            raise ValueError(f"tree_form: unknown form {self.tree!r} (one of paper, pipelined)")
        for name in ("value_bytes", "index_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")

    @property
    def sparse_ratio(self) -> float:
        """s: bytes per sparse entry over bytes per dense entry."""
        return (self.value_bytes + self.index_bytes) / self.value_bytes

    def describe(self) -> str:
        return f"ag={self.ag},tree={self.tree}"


def check_message_bytes(m: float, field_name: str = "size") -> float:
    v = float(m)
    if math.isnan(v) or math.isinf(v) or v <= 0:
        raise ValueError(f"{field_name}: message size must be finite and > 0 bytes, got {m!r}")
    return v


def alpha_beta_terms(collective: str, m: float, c: float, n: int,
                     forms: ModelForms = ModelForms()) -> tuple[float, float]:
    """(A, B) of the collective's time alpha * A + beta * B on a plain link: A
    message latencies on its critical path, B the bytes its bandwidth term counts."""
    check_collective(collective)
    m = check_message_bytes(m)
    c = check_cr(c)
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"nodes: need at least 2 workers, got {n!r}")
    lg = _log2(n)
    mc = m * c
    if collective == PS:
        return 2.0, 2 * (n - 1) * m
    if collective == DENSE_RING:
        return 2.0 * (n - 1), 2 * ((n - 1) / n) * m
    if collective == DENSE_TREE:
        return _tree_allreduce(m, lg, forms)
    if collective == AG_TOPK:
        if forms.ag == "ring":
            return float(n - 1), (n - 1) * forms.sparse_ratio * mc
        return lg, 2 * (n - 1) * mc
    broadcast = (lg, mc * lg)  # the root's indices, binomial tree
    if collective == ART_RING:
        rest = (2.0 * (n - 1), 2 * ((n - 1) / n) * mc)
    else:
        assert collective == ART_TREE
        rest = _tree_allreduce(mc, lg, forms)
    return broadcast[0] + rest[0], broadcast[1] + rest[1]


def _tree_allreduce(m: float, lg: float, forms: ModelForms) -> tuple[float, float]:
    if forms.tree == "pipelined":
        return 2 * lg, 2 * m
    return 2 * lg, 2 * lg * m


def link_time(terms: tuple[float, float], net: NetworkObservation) -> float:
    """Seconds for (A, B) = (latencies, bytes) on `net`'s bottleneck link."""
    messages, link_bytes = terms
    return net.alpha_s * messages + net.bucket.seconds(net.beta_s_per_byte * link_bytes)


def sync_time(collective: str, m: float, c: float, net: NetworkObservation,
              forms: ModelForms = ModelForms()) -> float:
    """Raw predicted seconds to synchronise an M-byte gradient at ratio c."""
    return link_time(alpha_beta_terms(collective, m, c, net.nodes, forms), net)


POWERSGD_MIN_COMPRESSION_RATE = 2  # PowerSGD's own default


def powersgd_compresses(rows: int, cols: int, rank: int) -> int:
    """The rank PowerSGD uses for a rows x cols matrix, or 0 when it sends it dense:
    its rule compresses only when (rows + cols) r * 2 < rows * cols, r = min(rows,
    cols, rank)."""
    r = min(rows, cols, rank)
    return r if (rows + cols) * r * POWERSGD_MIN_COMPRESSION_RATE < rows * cols else 0


@dataclass(frozen=True)
class PowerSgdSplit:
    """What PowerSGD at one rank moves: values sent dense, P and Q factor values,
    and the multiply-adds of its products (n m r per product and matrix)."""

    dense_values: int
    p_values: int
    q_values: int
    macs: int


@lru_cache(maxsize=256)
def powersgd_split(layout: GradientLayout, rank: int) -> PowerSgdSplit:
    dense, p, q, macs = layout.vector_values, 0, 0, 0
    for n, m in layout.matrices:
        r = powersgd_compresses(n, m, rank)
        if r:
            p, q, macs = p + n * r, q + m * r, macs + n * m * r
        else:
            dense += n * m
    return PowerSgdSplit(dense, p, q, macs)


def option_terms(compression: Compression, collective: str, layout: GradientLayout, n: int,
                 forms: ModelForms = ModelForms()) -> tuple[float, float]:
    """(A, B) of synchronising `layout` with `compression` over `collective`."""
    check_pairing(compression.family, collective)
    if forms.value_bytes != layout.value_bytes:
        forms = replace(forms, value_bytes=layout.value_bytes)
    if compression.family == DENSE:
        return alpha_beta_terms(collective, layout.grad_bytes, 1.0, n, forms)
    if compression.family == BF16:
        return alpha_beta_terms(collective, layout.values * 2, 1.0, n, forms)
    if compression.family == TOPK:
        return alpha_beta_terms(collective, layout.grad_bytes, compression.param, n, forms)
    assert compression.family == POWERSGD
    split = powersgd_split(layout, compression.rank)
    # Two AllReduces in turn: the P factors, then the Q factors with what is sent dense.
    p = alpha_beta_terms(DENSE_RING, max(split.p_values, 1) * layout.value_bytes, 1.0, n, forms)
    q = alpha_beta_terms(DENSE_RING, (split.q_values + split.dense_values) * layout.value_bytes, 1.0, n, forms)
    return p[0] + q[0], p[1] + q[1]


def sync_form(compression: Compression, collective: str) -> str:
    """What a sync's own overhead (the host's and gloo's work the terms leave out)
    belongs to: its collective, or PowerSGD's two AllReduces in turn over it
    (about twice a ring's calls, with its orthogonalisation between them)."""
    return f"{POWERSGD}@{collective}" if compression.family == POWERSGD else collective


def option_sync_time(compression: Compression, collective: str, layout: GradientLayout,
                     net: NetworkObservation, forms: ModelForms = ModelForms()) -> float:
    """Raw predicted seconds to synchronise `layout` with one option."""
    return link_time(option_terms(compression, collective, layout, net.nodes, forms), net)


@dataclass(frozen=True)
class CompressionCost:
    """Compute a compression costs per step, by family (dense: nothing).

    topk: per_byte * M + per_selected_byte * M * c (selection passes over the
    whole gradient: error-feedback add, magnitude, threshold; then packing and
    scatter-add of the selected entries). bf16: per_cast_byte * M (to bf16 and
    back). powersgd: per_mac * 3 n m r over the matrices it compresses (its three
    products) + per_byte * M (error feedback, copies).
    """

    per_byte: float = 1.6e-9
    per_selected_byte: float = 2.0e-8
    per_cast_byte: float = 1.0e-9
    per_mac: float = 2.0e-10

    def __post_init__(self) -> None:
        for name in ("per_byte", "per_selected_byte", "per_cast_byte", "per_mac"):
            v = getattr(self, name)
            if math.isnan(v) or math.isinf(v) or v < 0:
                raise ValueError(f"{name}: must be finite and >= 0, got {v!r}")

    def seconds(self, compression: Compression, layout: GradientLayout) -> float:
        m = layout.grad_bytes
        if compression.family == TOPK:
            return self.per_byte * m + self.per_selected_byte * m * compression.param
        if compression.family == BF16:
            return self.per_cast_byte * m
        if compression.family == POWERSGD:
            return self.per_mac * 3 * powersgd_split(layout, compression.rank).macs + self.per_byte * m
        return 0.0


# --- calibration -----------------------------------------------------------------

FIT_WEIGHTING = "1/measured"  # recorded in the state: sums of another weighting are not reused
# A line is fitted only where the predictions explain this share of the measured
# spread (weighted R^2). Else the spread is the host's: the cnn lab's fits from fast
# links (raw 1-5 ms, measured 20-90 ms) drew slopes of 0.12 for Top-k over
# AllGather and ~3 for PowerSGD, and at 16 Mbit/s put Top-k 0.1 (0.37 s of wire)
# at 0.09 s and PowerSGD rank 4 (0.05 s) at 0.28 s. With no relation, R^2 over the
# fit's ~10 effective pairs is under 0.4 nineteen times in twenty.
EXPLAINED_MIN = 0.5

@dataclass
class _Fit:
    """Exponentially forgotten sums for measured = slope * predicted + overhead.

    Each pair is weighted 1/measured. Unweighted, the slowest operations set the
    line and millisecond ones got negative intercepts (predicted 0.01 ms against
    0.6 ms measured); weighted 1/measured**2 (pure relative error) the many noisy
    short operations bent the line for the long ones. 1/measured did best of the
    three on both validation runs (docs/BENCHMARKS.md). The overhead is the
    per-call cost the alpha-beta terms lack, so it is never negative; the line is
    used only where the predictions explain EXPLAINED_MIN of the measurements.
    """

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    yy: float = 0.0
    err: float = 0.0  # EWMA of |measured - prediction before the update| / measured
    n: int = 0

    def observe(self, predicted: float, measured: float, decay: float) -> None:
        if self.n:  # judged before the update; the first judgement starts the average
            judged = abs(measured - self.apply(predicted)) / measured
            self.err = judged if self.n == 1 else decay * self.err + (1 - decay) * judged
        weight = 1.0 / measured
        self.w = decay * self.w + weight
        self.x = decay * self.x + weight * predicted
        self.y = decay * self.y + weight * measured
        self.xx = decay * self.xx + weight * predicted * predicted
        self.xy = decay * self.xy + weight * predicted * measured
        self.yy = decay * self.yy + weight * measured * measured
        self.n += 1

    def apply(self, predicted: float) -> float:
        if self.n == 0:
            return predicted
        affine = self._affine()
        if affine is not None:
            slope, overhead = affine
            return slope * predicted + overhead
        # No spread to tell a ratio from a per-call overhead: the two readings
        # agree at the predictions seen and part away from them, and the faster
        # one is taken, so that an option is measured rather than ruled out on
        # an extrapolation. As a ratio, a fit from a fast link, where gloo's
        # per-call cost dominates (Top-k over AllGather 4.9 ms measured against
        # ~1 ms predicted), put Top-k five times too slow on a slow link (the
        # short lab kept bf16 through 10 Mbit/s at 1.7x Top-k's step); as an
        # overhead, a fit from a slow link puts dense far too slow on a fast one.
        mx, my = self.x / self.w, self.y / self.w
        return min(self.xy / self.xx * predicted, predicted + max(0.0, my - mx))

    def line(self) -> tuple[float, float]:
        """(slope, overhead) of the fit where the predictions seen spread (an
        affine fit whose overhead comes out >= 0), else the ratio through the
        origin (which `apply` weighs against an overhead)."""
        return self._affine() or (self.xy / self.xx, 0.0)

    def _affine(self) -> tuple[float, float] | None:
        mx, my = self.x / self.w, self.y / self.w
        var, var_y = self.xx / self.w - mx * mx, self.yy / self.w - my * my
        if self.n >= 3 and var > (0.05 * mx) ** 2 and var_y > 0:
            cov = self.xy / self.w - mx * my
            slope = cov / var
            overhead = my - slope * mx
            if slope > 0 and overhead >= 0 and cov * cov >= EXPLAINED_MIN * var * var_y:
                return slope, overhead
        return None


class Calibration:
    """Per-collective correction of raw predictions from (predicted, measured) pairs.

    decay is the weight kept by older observations at each new one (0.9 keeps an
    effective window of about ten). error() is the model's current relative error:
    the smoothed |measured - calibrated prediction| / measured, judged before each
    observation updates the fit (an honest, out-of-sample figure).
    """

    def __init__(self, decay: float = 0.9) -> None:
        if not (0.0 < decay < 1.0):
            raise ValueError(f"decay: must be in (0, 1), got {decay!r}")
        self.decay = decay
        self._fits: dict[str, _Fit] = {}

    def observe(self, collective: str, predicted_s: float, measured_s: float) -> None:
        """One pair for fit `collective` (a collective, or "powersgd": see calibration_key)."""
        _check_key(collective)
        for name, v in (("predicted_s", predicted_s), ("measured_s", measured_s)):
            if math.isnan(v) or math.isinf(v) or v <= 0:
                raise ValueError(f"{name}: must be finite and > 0, got {v!r}")
        self._fits.setdefault(collective, _Fit()).observe(predicted_s, measured_s, self.decay)

    def apply(self, collective: str, predicted_s: float) -> float:
        fit = self._fits.get(collective)
        return fit.apply(predicted_s) if fit else predicted_s

    def forget(self, collective: str) -> None:
        """Drop one fit: it starts over from the next pair."""
        self._fits.pop(collective, None)

    def observations(self, collective: str) -> int:
        fit = self._fits.get(collective)
        return fit.n if fit else 0

    def error(self, collective: str | None = None) -> float:
        """Relative error for one collective, or the worst over those observed twice+."""
        if collective is not None:
            fit = self._fits.get(collective)
            return fit.err if fit and fit.n > 1 else 0.0
        errs = [f.err for f in self._fits.values() if f.n > 1]
        return max(errs) if errs else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "weighting": FIT_WEIGHTING,
                "fits": {k: vars(f).copy() for k, f in sorted(self._fits.items())}}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Calibration:
        """The calibration a state holds. Fits saved with another weighting (older
        versions summed unweighted pairs) are dropped and relearned: read as
        weighted sums they would be wrong."""
        cal = cls(float(state.get("decay", 0.9)))
        if state.get("weighting") != FIT_WEIGHTING:
            return cal
        for name, fit in (state.get("fits") or {}).items():
            if "yy" in fit:  # older fits lack the measurements' spread: relearned
                cal._fits[_check_key(name)] = _Fit(**fit)
        return cal


def _check_key(key: str) -> str:
    return key if key == POWERSGD else check_collective(key, "calibration")


@dataclass(frozen=True)
class Prediction:
    compression: Compression
    collective: str
    sync_s: float  # calibrated
    raw_sync_s: float
    comp_s: float

    @property
    def total_s(self) -> float:
        return self.sync_s + self.comp_s


def calibration_key(compression: Compression, collective: str) -> str:
    """Which fit corrects an option: its collective's, except PowerSGD's two
    AllReduces in a row, which have a fit of their own (two calls' overhead)."""
    return POWERSGD if compression.family == POWERSGD else collective


def predict(compression: Compression, collective: str, layout: GradientLayout, net: NetworkObservation,
            forms: ModelForms = ModelForms(), comp: CompressionCost = CompressionCost(),
            calibration: Calibration | None = None) -> Prediction:
    """Calibrated sync time plus compression time for one option."""
    raw = option_sync_time(compression, collective, layout, net, forms)
    cal = calibration.apply(calibration_key(compression, collective), raw) if calibration else raw
    return Prediction(compression, collective, cal, raw, comp.seconds(compression, layout))


def crossover_ratio(kind: str, n: int, m: float, c: float) -> float:
    """The paper's alpha/beta boundaries: below the returned value the first-named
    collective is cheaper (paper forms). kind: ring_vs_tree, ring_vs_ag, tree_vs_ag."""
    lg = _log2(n)
    mc = m * c
    if kind == "ring_vs_tree":
        return (lg - (n - 1) / n) / (n - 1 - lg) * mc
    if kind == "ring_vs_ag":
        return (1 - 1 / n - lg / (2 * (n - 1))) * mc
    if kind == "tree_vs_ag":
        return ((n - 1) / lg - 1.5) * mc
    raise ValueError(f"kind: unknown crossover {kind!r}")


__all__ = [
    "AG_FORMS",
    "COLLECTIVES",
    "TREE_FORMS",
    "Calibration",
    "CompressionCost",
    "ModelForms",
    "Prediction",
    "alpha_beta_terms",
    "calibration_key",
    "crossover_ratio",
    "link_time",
    "option_sync_time",
    "option_terms",
    "powersgd_split",
    "predict",
    "sync_time",
]
