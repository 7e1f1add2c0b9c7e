"""The vocabulary every part shares: collectives, observations, step reports and
decisions. Plain frozen dataclasses with validation; `to_dict`/`from_dict` give the
JSON/proto/store form. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

# Canonical names (DESIGN.md section 3): the API, CLI, JSON and store use these.
PS = "ps"
DENSE_RING = "dense_ring"
DENSE_TREE = "dense_tree"
AG_TOPK = "ag_topk"
ART_RING = "art_ring"
ART_TREE = "art_tree"
COLLECTIVES: tuple[str, ...] = (PS, DENSE_RING, DENSE_TREE, AG_TOPK, ART_RING, ART_TREE)
DENSE_COLLECTIVES = frozenset({PS, DENSE_RING, DENSE_TREE})
SPARSE_COLLECTIVES = frozenset({AG_TOPK, ART_RING, ART_TREE})
# What the training client can actually run (the parameter server is model-only).
RUNNABLE_COLLECTIVES: tuple[str, ...] = (DENSE_RING, DENSE_TREE, AG_TOPK, ART_RING, ART_TREE)

# AR-Topk root selection: round-robin (STAR-Topk) or largest variance (VAR-Topk).
ROOT_STAR = "star"
ROOT_VAR = "var"
ROOT_SELECTIONS: tuple[str, ...] = (ROOT_STAR, ROOT_VAR)
MAX_PROBE_CRS = 64
MAX_EXACT_INT = 1 << 53  # whole numbers a double (and JSON) holds exactly: versions, steps


def check_collective(name: str, field_name: str = "collective") -> str:
    if name not in COLLECTIVES:
        raise ValueError(f"{field_name}: unknown collective {name!r} (one of {', '.join(COLLECTIVES)})")
    return name


def check_root(name: str, field_name: str = "root") -> str:
    if name not in ROOT_SELECTIONS:
        raise ValueError(f"{field_name}: unknown root selection {name!r} (one of star, var)")
    return name


def check_cr(cr: float, field_name: str = "cr") -> float:
    """A compression ratio k/M must lie in (0, 1]; 1 means dense."""
    try:
        v = float(cr)
    except (TypeError, ValueError):
        raise ValueError(f"{field_name}: expected a number, got {cr!r}") from None
    if math.isnan(v) or not (0.0 < v <= 1.0):
        raise ValueError(f"{field_name}: compression ratio must be in (0, 1], got {cr!r}")
    return v


def check_known_options(options: Mapping[str, Any], config: type, what: str) -> None:
    """Refuse option names that are not fields of the dataclass `config`."""
    known = {f.name for f in fields(config)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown {what} option (known: {', '.join(sorted(known))})")


def check_range(name: str, v: float, lo: float, hi: float, *, open_low: bool = False) -> float:
    """`v` as given if it is a finite number in [lo, hi] ((lo, hi] with open_low)."""
    ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
          and (lo < v if open_low else lo <= v) and v <= hi)
    if not ok:
        raise ValueError(f"{name}: must be in {'(' if open_low else '['}{lo}, {hi}], got {v!r}")
    return v


def _finite(field_name: str, v: float, *, positive: bool = False) -> float:
    v = float(v)
    if math.isnan(v) or math.isinf(v) or v < 0 or (positive and v == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{field_name}: must be finite and {bound}, got {v!r}")
    return v


MAX_PEAK_OVER_RATE = 16.0
MAX_BURST_S = 10.0


@dataclass(frozen=True)
class LinkBucket:
    """What a token-bucket shaped or policed link sends above its sustained rate r
    (RFC 2212's peak rate p and bucket depth b): after idle it runs at
    `peak_over_rate` * r until `burst_s` * r bytes of credit are spent, then at r.
    Cloud NICs and the lab's HTB links are such links. (1, 0) is a plain link.
    """

    peak_over_rate: float = 1.0
    burst_s: float = 0.0

    def __post_init__(self) -> None:
        check_range("peak_over_rate", self.peak_over_rate, 1.0, MAX_PEAK_OVER_RATE)
        check_range("burst_s", self.burst_s, 0.0, MAX_BURST_S)

    @classmethod
    def checked(cls, peak_over_rate: float, burst_s: float,
                names: tuple[str, str] = ("peak_over_rate", "burst_s")) -> LinkBucket:
        """A bucket from a user's settings, each error naming the setting (`names`).
        Half a bucket (a peak without credit, or credit without a peak) is refused:
        it would model a plain link, which is not what whoever set one half meant."""
        peak_name, burst_name = names
        check_range(peak_name, peak_over_rate, 1.0, MAX_PEAK_OVER_RATE)
        check_range(burst_name, burst_s, 0.0, MAX_BURST_S)
        if (peak_over_rate > 1.0) != (burst_s > 0.0):
            missing, given = (burst_name, peak_name) if peak_over_rate > 1.0 else (peak_name, burst_name)
            raise ValueError(f"{missing}: needed with {given} (a token bucket has both; "
                             "leave both out for a plain link)")
        return cls(peak_over_rate, burst_s)

    @property
    def plain(self) -> bool:
        return self.peak_over_rate == 1.0 or self.burst_s == 0.0

    def seconds(self, at_rate_s: float) -> float:
        """Time to send what takes `at_rate_s` at the rate, starting with a full
        bucket: at the peak while credit lasts, at the rate after it."""
        if self.plain:
            return at_rate_s
        return max(at_rate_s / self.peak_over_rate, at_rate_s - self.burst_s)


PLAIN_LINK = LinkBucket()


@dataclass(frozen=True)
class NetworkObservation:
    """The network as the policy sees it: the bottleneck among the job's nodes.

    alpha_s: per-message latency in seconds. beta_s_per_byte: seconds per byte
    (1 / bandwidth in bytes/s) at the sustained rate. nodes: number of workers N.
    bucket: the links' allowance above that rate (plain unless configured);
    a mapping is taken as its fields (the `to_dict` form). evidence: what the
    figures last moved on (e.g. "passive+probe"), for people.
    """

    alpha_s: float
    beta_s_per_byte: float
    nodes: int
    bucket: LinkBucket = PLAIN_LINK
    evidence: str = ""

    def __post_init__(self) -> None:
        _finite("alpha_s", self.alpha_s)
        _finite("beta_s_per_byte", self.beta_s_per_byte, positive=True)
        if not isinstance(self.nodes, int) or self.nodes < 2:
            raise ValueError(f"nodes: need at least 2 workers, got {self.nodes!r}")
        if isinstance(self.bucket, Mapping):
            object.__setattr__(self, "bucket", LinkBucket(**self.bucket))
        elif not isinstance(self.bucket, LinkBucket):
            raise ValueError(f"bucket: expected a LinkBucket, got {self.bucket!r}")
        if not isinstance(self.evidence, str):
            raise ValueError(f"evidence: expected a string, got {self.evidence!r}")

    @property
    def bandwidth_bps(self) -> float:
        """Bandwidth in bits per second."""
        return 8.0 / self.beta_s_per_byte

    @classmethod
    def from_link(cls, latency_s: float, bandwidth_bps: float, nodes: int,
                  bucket: LinkBucket = PLAIN_LINK) -> NetworkObservation:
        bw = _finite("bandwidth", bandwidth_bps, positive=True)
        return cls(alpha_s=_finite("latency", latency_s), beta_s_per_byte=8.0 / bw, nodes=nodes,
                   bucket=bucket)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepReport:
    """What one training step measured, as the client reports it.

    gains maps a candidate CR to the compression gain E||g_c||^2 / E||g_e||^2 that
    CR would have had on this step's gradient (read off one gradient, DESIGN.md
    section 4). t_compute_s is forward + backward time, when known (else 0).
    """

    step: int
    cr: float
    collective: str
    t_comp_s: float
    t_sync_s: float
    gain: float
    bytes_sent: int = 0
    epoch: int = 0
    t_compute_s: float = 0.0
    gains: Mapping[float, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"step: must be >= 0, got {self.step!r}")
        if self.epoch < 0:
            raise ValueError(f"epoch: must be >= 0, got {self.epoch!r}")
        check_cr(self.cr)
        check_collective(self.collective)
        _finite("t_comp_s", self.t_comp_s)
        _finite("t_sync_s", self.t_sync_s)
        _finite("t_compute_s", self.t_compute_s)
        gain = _finite("gain", self.gain)
        if gain > 1.0 + 1e-6:
            raise ValueError(f"gain: must be in [0, 1], got {self.gain!r}")
        if self.bytes_sent < 0:
            raise ValueError(f"bytes_sent: must be >= 0, got {self.bytes_sent!r}")
        for c, g in self.gains.items():
            check_cr(c, "gains (cr)")
            if not (0.0 <= float(g) <= 1.0 + 1e-6):
                raise ValueError(f"gains: gain for cr {c} must be in [0, 1], got {g!r}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gains"] = {str(k): v for k, v in self.gains.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepReport:
        d = dict(d)
        d["gains"] = {float(k): float(v) for k, v in (d.get("gains") or {}).items()}
        return cls(**d)


@dataclass(frozen=True)
class Decision:
    """What every rank runs from the step it is adopted on.

    version increases by one each time the decision changes, so ranks and
    clients can tell a new decision from a repeated one. probe_crs are the CRs
    whose gains the policy wants in the step reports. The predicted_* fields are
    the cost model's figures for the chosen option (0 when unknown), model_forms
    says which formula variants produced them, and reason is for people.
    """

    cr: float
    collective: str
    root: str = ROOT_STAR
    version: int = 0
    predicted_sync_s: float = 0.0
    predicted_comp_s: float = 0.0
    reason: str = ""
    probe_crs: tuple[float, ...] = ()
    model_forms: str = ""

    def __post_init__(self) -> None:
        check_cr(self.cr)
        check_collective(self.collective)
        check_root(self.root)
        # Ranks carry the version as a float64 in the agreement collective.
        if not isinstance(self.version, int) or not (0 <= self.version < MAX_EXACT_INT):
            raise ValueError(f"version: must be a whole number in [0, 2^53), got {self.version!r}")
        # A bad probe CR would fail inside rank 0's backward pass and hang the others.
        if len(self.probe_crs) > MAX_PROBE_CRS:
            raise ValueError(f"probe_crs: at most {MAX_PROBE_CRS}, got {len(self.probe_crs)}")
        for c in self.probe_crs:
            check_cr(c, "probe_crs")
        if self.collective in DENSE_COLLECTIVES and self.cr != 1.0:
            raise ValueError(f"cr: a dense collective ({self.collective}) needs cr = 1, got {self.cr}")
        if self.collective in SPARSE_COLLECTIVES and self.cr == 1.0:
            raise ValueError(f"cr: a Top-k collective ({self.collective}) needs cr < 1")

    @property
    def dense(self) -> bool:
        return self.collective in DENSE_COLLECTIVES

    def same_choice(self, other: Decision | None) -> bool:
        """True when `other` runs exactly the same thing (ignores reason/predictions)."""
        return other is not None and (self.cr, self.collective, self.root) == (
            other.cr, other.collective, other.root
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["probe_crs"] = list(self.probe_crs)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        d = dict(d)
        d["probe_crs"] = tuple(float(c) for c in d.get("probe_crs") or ())
        return cls(**d)


class Policy(Protocol):
    """What every policy offers. Implementations are deterministic: the same
    sequence of calls gives the same decisions (every rank's agreement rests on it).
    """

    name: str

    def observe_network(self, net: NetworkObservation) -> None:
        """The latest bottleneck alpha/beta for the job's nodes."""

    def observe_step(self, report: StepReport) -> None:
        """One step's measurements (the step ran `report.cr`/`report.collective`)."""

    def decide(self) -> Decision:
        """The decision to run next. Cheap (well under a millisecond)."""

    def model_error(self) -> float | None:
        """The cost model's current relative error (Calibration.error), or None
        for a policy that predicts nothing."""

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state (JSON-serialisable) to persist and restore."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
