"""Alpha and beta per peer, from active probes and passive sync times.

alpha: per-message latency (s); beta: seconds per byte (DESIGN.md section 3).

- Active probes: a latency burst gives alpha (half the smallest RTT), a bandwidth
  test gives beta (8 / bits per second): `Estimator.observe(measurement)`.
- Passive observations: a measured sync time at a known message size is linear in
  alpha and beta, t = a*alpha + b*beta, with a and b read off the cost model
  (`sync_observation`). A window of them is fitted by least squares when their
  sizes differ enough to tell alpha from beta; otherwise the time left after the
  current alpha is charged to beta. The results feed the same smoothing as the
  active probes, so both kinds of evidence end in one estimate per peer.
- Smoothing: an exponentially weighted mean, `smoothing` the weight of a new value.
- `bottleneck(peers)`: the slowest path among a job's peers (highest alpha, highest
  beta, each possibly from a different peer), as the policy's NetworkObservation.
- `ChangeDetector`: says when alpha or beta moved by >= threshold (relative) from
  what was last reported, so the caller re-informs the policy only then.

Pure: no I/O and no clock (timestamps are whatever the caller passes).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flexcomm.policy.costmodel import ModelForms, alpha_beta_terms
from flexcomm.policy.types import NetworkObservation
from flexcomm.store.records import BANDWIDTH, LATENCY, PASSIVE, Measurement

DEFAULT_SMOOTHING = 0.3
DEFAULT_CHANGE_THRESHOLD = 0.10
DEFAULT_ALPHA_FLOOR_S = 1e-4  # the policy's own floor (policy.moo) agrees
PASSIVE_WINDOW = 32
# Two sizes must differ by this factor in beta-bytes per alpha before a fit can
# tell latency from bandwidth.
FIT_SPREAD = 2.0


@dataclass(frozen=True)
class SyncObservation:
    """One passive observation: `seconds` = alpha_coeff*alpha + beta_bytes*beta."""

    alpha_coeff: float
    beta_bytes: float
    seconds: float

    def __post_init__(self) -> None:
        for name in ("alpha_coeff", "beta_bytes", "seconds"):
            v = getattr(self, name)
            if math.isnan(v) or math.isinf(v) or v < 0:
                raise ValueError(f"{name}: must be finite and >= 0, got {v!r}")
        if self.beta_bytes == 0:
            raise ValueError("beta_bytes: must be > 0 (an observation with no bytes says nothing of beta)")


def sync_observation(collective: str, message_bytes: float, cr: float, nodes: int,
                     seconds: float, forms: ModelForms | None = None) -> SyncObservation:
    """The observation a measured sync of `collective` makes: the cost model's
    formula is linear in alpha and beta, so its two coefficients are read off it."""
    alpha_coeff, beta_bytes = alpha_beta_terms(collective, message_bytes, cr, nodes, forms or ModelForms())
    return SyncObservation(alpha_coeff, beta_bytes, seconds)


def fit_alpha_beta(observations: Sequence[SyncObservation]) -> tuple[float, float] | None:
    """Least-squares (alpha, beta) with alpha >= 0, beta > 0; None when the
    observations cannot separate the two (all at one size) or fit no positive beta."""
    ratios = [o.beta_bytes / o.alpha_coeff for o in observations if o.alpha_coeff > 0]
    if len(ratios) < 2 or max(ratios) < FIT_SPREAD * min(ratios):
        return None
    saa = sum(o.alpha_coeff ** 2 for o in observations)
    sbb = sum(o.beta_bytes ** 2 for o in observations)
    sab = sum(o.alpha_coeff * o.beta_bytes for o in observations)
    sat = sum(o.alpha_coeff * o.seconds for o in observations)
    sbt = sum(o.beta_bytes * o.seconds for o in observations)
    det = saa * sbb - sab * sab
    alpha = (sat * sbb - sbt * sab) / det
    beta = (saa * sbt - sab * sat) / det
    if alpha < 0:  # latency too small to see: all of the time is bandwidth
        alpha, beta = 0.0, sbt / sbb
    return (alpha, beta) if beta > 0 else None


def ewma(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new


@dataclass
class PeerEstimate:
    """The smoothed figures for one peer; None until observed. `ts` is the
    caller's timestamp of the last observation."""

    alpha_s: float | None = None
    beta_s_per_byte: float | None = None
    alpha_samples: int = 0
    beta_samples: int = 0
    ts: float | None = None
    passive: deque[SyncObservation] = field(default_factory=lambda: deque(maxlen=PASSIVE_WINDOW))

    @property
    def bandwidth_bps(self) -> float | None:
        return None if not self.beta_s_per_byte else 8.0 / self.beta_s_per_byte


class Estimator:
    """Per-peer alpha/beta from active and passive observations."""

    def __init__(self, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing: must be in (0, 1], got {smoothing!r}")
        self.smoothing = smoothing
        self._peers: dict[str, PeerEstimate] = {}

    def peer(self, peer: str) -> PeerEstimate:
        """The estimate for `peer` (empty if never observed)."""
        return self._peers.setdefault(peer, PeerEstimate())

    @property
    def peers(self) -> list[str]:
        return sorted(self._peers)

    def observe_alpha(self, peer: str, alpha_s: float, ts: float | None = None) -> None:
        est = self.peer(peer)
        est.alpha_s = ewma(est.alpha_s, alpha_s, self.smoothing)
        est.alpha_samples += 1
        est.ts = ts if ts is not None else est.ts

    def observe_beta(self, peer: str, beta_s_per_byte: float, ts: float | None = None) -> None:
        if beta_s_per_byte <= 0:
            raise ValueError(f"beta_s_per_byte: must be > 0, got {beta_s_per_byte!r}")
        est = self.peer(peer)
        est.beta_s_per_byte = ewma(est.beta_s_per_byte, beta_s_per_byte, self.smoothing)
        est.beta_samples += 1
        est.ts = ts if ts is not None else est.ts

    def observe(self, m: Measurement) -> None:
        """Feed a stored measurement; failed ones carry no figures and are skipped."""
        if not m.ok:
            return
        if m.kind in (LATENCY, PASSIVE) and m.alpha_s is not None:
            self.observe_alpha(m.peer, m.alpha_s, m.ts)
        if m.kind in (BANDWIDTH, PASSIVE) and m.beta_s_per_byte:
            self.observe_beta(m.peer, m.beta_s_per_byte, m.ts)

    def observe_sync(self, peer: str, obs: SyncObservation,
                     ts: float | None = None) -> tuple[float | None, float]:
        """Feed a passive observation; return the (alpha, beta) it contributed
        (alpha None when only beta could be inferred)."""
        est = self.peer(peer)
        est.passive.append(obs)
        fit = fit_alpha_beta(list(est.passive))
        if fit is not None:
            alpha, beta = fit
            self.observe_alpha(peer, alpha, ts)
            self.observe_beta(peer, beta, ts)
            return alpha, beta
        known_alpha = est.alpha_s or 0.0
        # what the current alpha does not explain is bandwidth; never below a
        # tenth of the time (alpha may be overestimated)
        rest = max(obs.seconds - obs.alpha_coeff * known_alpha, 0.1 * obs.seconds)
        beta = rest / obs.beta_bytes
        if beta <= 0:
            raise ValueError("seconds: must be > 0 for a passive observation")
        self.observe_beta(peer, beta, ts)
        return None, beta

    def bottleneck(self, peers: Iterable[str], nodes: int | None = None) -> NetworkObservation | None:
        """The slowest path to any of `peers`: highest alpha and highest beta.
        None until every one of them has a beta (an unmeasured peer could be the
        bottleneck). nodes defaults to the peers plus this node."""
        peers = list(peers)
        if not peers:
            raise ValueError("peers: need at least one")
        ests = [self._peers.get(p) for p in peers]
        if any(e is None or e.beta_s_per_byte is None for e in ests):
            return None
        alpha = max((e.alpha_s or 0.0) for e in ests if e)
        beta = max(e.beta_s_per_byte for e in ests if e and e.beta_s_per_byte)
        return NetworkObservation(alpha, beta, nodes if nodes is not None else len(peers) + 1)


def relative_change(old: float, new: float) -> float:
    """|new - old| / old; infinite when old is 0 and new is not."""
    if old == 0:
        return 0.0 if new == 0 else math.inf
    return abs(new - old) / abs(old)


class ChangeDetector:
    """Remembers the alpha/beta last reported and says when a new pair moved by
    >= threshold (relative) in either; the reported pair then becomes the new
    reference. The first pair seen is the reference and is not a change. An
    alpha move must also be >= alpha_floor_s: tens of microseconds of jitter on
    a fast link are a large relative change but no news."""

    def __init__(self, threshold: float = DEFAULT_CHANGE_THRESHOLD,
                 alpha_floor_s: float = DEFAULT_ALPHA_FLOOR_S) -> None:
        if not threshold > 0:
            raise ValueError(f"threshold: must be > 0, got {threshold!r}")
        if alpha_floor_s < 0:
            raise ValueError(f"alpha_floor_s: must be >= 0, got {alpha_floor_s!r}")
        self.threshold = threshold
        self.alpha_floor_s = alpha_floor_s
        self.reference: tuple[float, float] | None = None

    def update(self, alpha_s: float, beta_s_per_byte: float) -> bool:
        if self.reference is None:
            self.reference = (alpha_s, beta_s_per_byte)
            return False
        old_alpha, old_beta = self.reference
        at_least = self.threshold * (1 - 1e-9)  # exactly 10% is a 10% change, despite rounding
        alpha_moved = (relative_change(old_alpha, alpha_s) >= at_least
                       and abs(alpha_s - old_alpha) >= self.alpha_floor_s)
        moved = alpha_moved or relative_change(old_beta, beta_s_per_byte) >= at_least
        if moved:
            self.reference = (alpha_s, beta_s_per_byte)
        return moved
