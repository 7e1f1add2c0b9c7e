"""The network as the agent knows it: alpha and beta per path, and each job's
bottleneck, from active probes and from the job's own syncs.

alpha: per-message latency (s); beta: seconds per byte (8 / bits per second).

- A peer's path (`PeerPath`) is what active probes measured: a latency burst gives
  alpha (half the smallest RTT; the smallest of the last ALPHA_BURSTS bursts: a
  loaded host once read 8 ms on a 40 us path, and the policy explored on it), a
  bandwidth test beta. Readings within `change_threshold` of the last are
  smoothed; one beyond it replaces it.
- A job's bottleneck bandwidth (`JobEstimate`) fuses its peers' probes with its own
  sync times. Each step report is one passive observation,
  t_sync = A alpha + bucket(B beta), with A and B read off the cost model's formula
  for what it ran (`sync_observation`, through `costmodel.option_terms`),
  and alpha fitted from syncs of different sizes. The beta that explains it
  measures the path only where the bandwidth term explains the time: syncs of the
  whole gradient (dense, bf16: within 10% of iperf3's goodput at 20-100 Mbit/s in
  the lab) give the level; Top-k syncs are mostly gloo's own work the model does not count (they read 0.2x
  to 1.8x of the link), so they say only how far the path moved since they last
  ran (each option against its own first steps since the last move).
- Change detection: the running option's sync time moving by >= `passive_threshold`
  from its own baseline for `persist_steps` steps in a row is a passive move; it
  asks for a probe and waits up to `confirm_s` for it (not at all when the duty
  budget has no room for one that soon). A probe that moved as far from what
  probes read before confirms it ("passive+probe"); one that did not says the
  host, not the path, was slow. A passive move no probe answers in time stands
  on its own ("passive") only when its syncs are dense and bandwidth-bound: a
  Top-k sync's time moves with the host and with gloo's own work as much as with
  the path (in a steady soak, Top-k moves standing alone walked the estimate
  from 100 Mbit/s to 1 kbit/s), so it only asks. Probes share the path with the
  job's traffic, so a probe that reads less while the job's dense syncs are
  steady is not news, one that reads more raises the estimate at once, and one
  that reads less without passive evidence must read it twice ("probe"). The
  job's own reported figures (`NetworkEstimate`) are taken at once ("report").
- A path carries at least what crossed it: a figure is the fastest of what the
  dense, bandwidth-bound syncs (a rank that arrives late only slows them) and
  the fresh probes read; the first dense syncs after a move a probe made refine it.
- `Estimator` owns every path and computes the one bottleneck a policy sees: the
  job's estimate for beta (the slowest probed peer while it has none), the highest
  alpha among its peers.

Pure: no I/O and no clock (timestamps are whatever the caller passes).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flexcomm.policy.costmodel import ModelForms, option_terms
from flexcomm.policy.types import (
    BF16,
    DENSE,
    PLAIN_LINK,
    GradientLayout,
    LinkBucket,
    NetworkObservation,
    StepReport,
    check_range,
)
from flexcomm.store.records import BANDWIDTH, LATENCY, PASSIVE, Measurement

PASSIVE_WINDOW = 32
ALPHA_BURSTS = 5
# Two observations must differ by this factor in beta-bytes per alpha before a
# fit can tell latency from bandwidth.
FIT_SPREAD = 2.0

PROBE, REPORT = "probe", "report"
# Families that send the whole gradient: their bandwidth-bound syncs measure the path.
WHOLE_GRADIENT = frozenset({DENSE, BF16})
# A sync reported faster than this measured nothing (a clock's resolution).
MIN_SYNC_S = 1e-6


@dataclass(frozen=True)
class EstimateConfig:
    """How evidence is weighed (see the module docstring); fractions and seconds."""

    smoothing: float = 0.3
    change_threshold: float = 0.10
    passive_threshold: float = 0.5
    persist_steps: int = 3
    confirm_s: float = 3.0
    settle_steps: int = 3
    informative_share: float = 0.5

    def __post_init__(self) -> None:
        for name in ("smoothing", "change_threshold", "passive_threshold", "confirm_s",
                     "informative_share"):
            check_range(name, getattr(self, name), 0.0, math.inf, open_low=True)
        for name in ("persist_steps", "settle_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class SyncObservation:
    """One passive observation: `seconds` = alpha_coeff*alpha + bucket(beta_bytes*beta)."""

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


def sync_observation(report: StepReport, layout: GradientLayout, nodes: int,
                     forms: ModelForms | None = None) -> SyncObservation | None:
    """The observation one step report makes: its sync time against the cost
    model's coefficients for what it ran (`costmodel.option_terms`: its compression
    over its collective, on the job's gradient). None when it measured no sync time."""
    if report.t_sync_s < MIN_SYNC_S:
        return None
    alpha_coeff, beta_bytes = option_terms(report.compression, report.collective, layout, nodes,
                                           forms or ModelForms())
    return SyncObservation(alpha_coeff, beta_bytes, report.t_sync_s)


def option_key(report: StepReport) -> str:
    return f"{report.compression.name}@{report.collective}"


def fit_alpha_beta(observations: Sequence[SyncObservation]) -> tuple[float, float] | None:
    """Least-squares (alpha, beta) weighted for relative error (1 / seconds^2), with
    alpha >= 0, beta > 0; None when the observations cannot separate the two (all
    at one size) or fit no positive beta."""
    obs = [o for o in observations if o.seconds >= MIN_SYNC_S]
    ratios = [o.beta_bytes / o.alpha_coeff for o in obs if o.alpha_coeff > 0]
    if len(ratios) < 2 or max(ratios) < FIT_SPREAD * min(ratios):
        return None
    w = [1.0 / o.seconds ** 2 for o in obs]
    saa = sum(wi * o.alpha_coeff ** 2 for wi, o in zip(w, obs, strict=True))
    sbb = sum(wi * o.beta_bytes ** 2 for wi, o in zip(w, obs, strict=True))
    sab = sum(wi * o.alpha_coeff * o.beta_bytes for wi, o in zip(w, obs, strict=True))
    sat = sum(wi * o.alpha_coeff * o.seconds for wi, o in zip(w, obs, strict=True))
    sbt = sum(wi * o.beta_bytes * o.seconds for wi, o in zip(w, obs, strict=True))
    det = saa * sbb - sab * sab
    if det <= 0:
        return None
    alpha = (sat * sbb - sbt * sab) / det
    beta = (saa * sbt - sab * sat) / det
    if alpha < 0:  # latency too small to see: all of the time is bandwidth
        alpha, beta = 0.0, sbt / sbb
    return (alpha, beta) if beta > 0 else None


def passive_beta(obs: SyncObservation, alpha_s: float, bucket: LinkBucket = PLAIN_LINK) -> float:
    """The beta that explains `obs` given alpha, through the link's token bucket
    (the inverse of LinkBucket.seconds); 0 when alpha alone explains the time."""
    rest = obs.seconds - obs.alpha_coeff * alpha_s
    if rest <= 0:
        return 0.0
    at_rate = rest if bucket.plain else min(rest * bucket.peak_over_rate, rest + bucket.burst_s)
    return at_rate / obs.beta_bytes


def linearised(obs: SyncObservation, bucket: LinkBucket, beta_s_per_byte: float | None) -> SyncObservation:
    """`obs` as a plain-link observation, for a fit: behind a token bucket its bytes
    cross at the peak (coefficient B / p) while they fit the credit at about
    `beta_s_per_byte`, else at the rate after the credit (its time plus b)."""
    if bucket.plain or beta_s_per_byte is None:
        return obs
    p, b = bucket.peak_over_rate, bucket.burst_s
    if obs.beta_bytes * beta_s_per_byte <= b * p / (p - 1):
        return SyncObservation(obs.alpha_coeff, obs.beta_bytes / p, obs.seconds)
    return SyncObservation(obs.alpha_coeff, obs.beta_bytes, obs.seconds + b)


def ewma(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new


def relative_change(old: float, new: float) -> float:
    """|new - old| / old; infinite when old is 0 and new is not."""
    if old == 0:
        return 0.0 if new == 0 else math.inf
    return abs(new - old) / abs(old)


@dataclass
class PeerPath:
    """One peer as active probes measured it; None until measured. Timestamps
    are the caller's (seconds since the epoch in the agent)."""

    address: str
    alpha_s: float | None = None
    beta_s_per_byte: float | None = None
    rtt_s: float | None = None
    rtt_p99_s: float | None = None
    loss: float | None = None
    updated: float | None = None  # the last successful measurement
    measured: float | None = None  # the last bandwidth test
    failures: int = 0
    _alphas: deque[float] = field(default_factory=lambda: deque(maxlen=ALPHA_BURSTS), repr=False)

    @property
    def bandwidth_bps(self) -> float | None:
        return None if not self.beta_s_per_byte else 8.0 / self.beta_s_per_byte

    def observe(self, m: Measurement, ts: float, config: EstimateConfig) -> bool:
        """Take one measurement; True when it was a bandwidth reading."""
        if not m.ok:
            self.failures += 1
            return False
        if m.kind in (LATENCY, PASSIVE) and m.alpha_s is not None:
            self._alphas.append(m.alpha_s)
            self.alpha_s = min(self._alphas)  # a burst that read more was the host's delay
        for name in ("rtt_p50_s", "rtt_p99_s", "loss"):
            value = getattr(m, name)
            if value is not None:
                setattr(self, "rtt_s" if name == "rtt_p50_s" else name, value)
        self.updated = ts
        if m.kind not in (BANDWIDTH, PASSIVE) or not m.beta_s_per_byte:
            return False
        old, new = self.beta_s_per_byte, m.beta_s_per_byte
        moved = old is None or relative_change(old, new) >= config.change_threshold
        self.beta_s_per_byte = new if moved else ewma(old, new, config.smoothing)
        self.measured = ts
        return True


@dataclass
class _Pending:
    """A move seen but not yet taken: its evidence, when it began, its direction
    (+1 slower, -1 faster), and the figures its samples read (or the probe's
    reading, for a probe alone)."""

    kind: str
    since: float
    direction: int
    samples: int = 0
    betas: list[float] = field(default_factory=list)
    probe_asked: bool = False
    settled: bool = False  # every figure came from dense, bandwidth-bound syncs


class JobEstimate:
    """One job's bottleneck beta, fused from its own syncs and its peers' probes
    (see the module docstring). `wants_probe` is set when the job's peers should be
    measured now; the owner clears it once it has asked."""

    def __init__(self, started: float, config: EstimateConfig | None = None) -> None:
        self.config = config or EstimateConfig()
        self.beta_s_per_byte: float | None = None
        self.evidence = ""
        self.moved_at: float | None = None
        self.fresh_after = started  # probes before this predate what the estimate says
        self.wants_probe = False
        self.probe_wait_s = 0.0  # how long the owner was told the probe it asked for will take
        self.alpha_fit: float | None = None
        self.probe_ref: float | None = None  # what probes read while the estimate held
        self._probe: tuple[float, float] | None = None  # the latest probe figure, and when
        self._window: deque[SyncObservation] = deque(maxlen=PASSIVE_WINDOW)
        self._recent: dict[str, deque[tuple[float, float]]] = {}  # option -> (seconds, beta)
        self._baselines: dict[str, float] = {}  # option -> its sync seconds since the last move
        self._dense: list[float] | None = []  # dense betas since the last move, while they refine it
        self._pending: _Pending | None = None
        self._steady_dense = False  # the last sync was dense, bandwidth-bound and did not move

    @property
    def bandwidth_bps(self) -> float | None:
        return None if not self.beta_s_per_byte else 8.0 / self.beta_s_per_byte

    @property
    def pending_bandwidth_bps(self) -> float | None:
        """The bandwidth a move not yet taken reads, when its samples say."""
        pending = self._pending
        if pending is None or not pending.betas:
            return None
        return 8.0 / statistics.median(pending.betas)

    @property
    def probes_since(self) -> float:
        """Probes older than this do not describe the path now: those before the
        last move, or before the passive move now waiting for them."""
        pending = self._pending
        if pending is not None and pending.kind == "passive" and pending.probe_asked:
            return pending.since
        return self.fresh_after

    # -- passive -----------------------------------------------------------------
    def observe_sync(self, option: str, dense: bool, obs: SyncObservation, alpha_s: float,
                     bucket: LinkBucket, ts: float) -> None:
        """One step's sync time of `option` (a `dense` collective or not); `alpha_s`
        is what the probes know of alpha (used until the job's syncs fit one)."""
        raw = passive_beta(obs, self.alpha_fit if self.alpha_fit is not None else alpha_s, bucket)
        level = dense and obs.beta_bytes * raw >= self.config.informative_share * obs.seconds
        recent = self._recent.setdefault(option, deque(maxlen=self.config.settle_steps))
        recent.append((obs.seconds, raw))
        self._steady_dense = False
        if self.beta_s_per_byte is None:
            self._first(recent, level, ts)
        elif option not in self._baselines:
            if len(recent) == recent.maxlen:
                self._baselines[option] = statistics.median(t for t, _ in recent)
        else:
            ratio = obs.seconds / self._baselines[option]
            self._passive_sample(ratio, raw, level, ts)
        if level and raw > 0 and self._pending is None:
            self._refine(raw, ts)
        if self._pending is None:  # a window that mixes two links fits neither
            self._fit(obs, bucket)

    def _first(self, recent: deque[tuple[float, float]], level: bool, ts: float) -> None:
        """Nothing known yet: the first dense, bandwidth-bound syncs are the estimate
        (Top-k syncs read 0.2x-1.8x of the link: a probe must give theirs)."""
        if level and len(recent) == recent.maxlen and all(b > 0 for _, b in recent):
            self._move(min(b for _, b in recent), "passive", ts, settled=True)

    def _fit(self, obs: SyncObservation, bucket: LinkBucket) -> None:
        """alpha from the syncs since the last move, once their sizes differ enough
        (refitted when a size joins: a job that runs one option adds nothing to tell
        alpha from beta, and the agent must ingest tens of thousands of reports a second)."""
        same_size = bool(self._window) and (self._window[-1].alpha_coeff, self._window[-1].beta_bytes) == \
            (obs.alpha_coeff, obs.beta_bytes)
        self._window.append(obs)
        if same_size:
            return
        fit = fit_alpha_beta([linearised(o, bucket, self.beta_s_per_byte) for o in self._window])
        if fit is not None:
            self.alpha_fit = fit[0]

    def _passive_sample(self, ratio: float, raw: float, level: bool, ts: float) -> None:
        """One sync of an option with a baseline: `ratio` its time over the
        baseline's, `raw` the beta that explains it, `level` whether that is the
        path's (dense and bandwidth-bound)."""
        assert self.beta_s_per_byte is not None
        threshold = 1 + self.config.passive_threshold
        direction = 1 if ratio >= threshold else -1 if ratio <= 1 / threshold else 0
        pending = self._pending
        if direction == 0:
            if pending is not None and pending.kind == "passive":
                self._pending = None
            self._steady_dense = level
            return
        if pending is None or pending.kind != "passive" or pending.direction != direction:
            pending = self._pending = _Pending("passive", ts, direction, settled=True)
        pending.samples += 1
        # dense and bandwidth-bound: the path as it is; else (for sizing a probe only)
        # the old figure moved as far as the time
        pending.betas.append(raw if level else self.beta_s_per_byte * ratio)
        pending.settled = pending.settled and level
        if pending.samples < self.config.persist_steps:
            return
        if not pending.probe_asked:
            pending.probe_asked = self.wants_probe = True
        alone = ts - pending.since >= self.config.confirm_s or self.probe_wait_s > self.config.confirm_s
        if alone and pending.settled:  # only dense, bandwidth-bound syncs stand alone
            self._take(pending, "passive", ts)

    def _refine(self, raw: float, ts: float) -> None:
        """The first dense syncs after a move set its figure, then it holds. They
        lower a figure only when no probe stands behind it: at a gigabit gloo on a
        loaded host is CPU-bound, where an idle probe is not."""
        if self._dense is None or self.beta_s_per_byte is None:
            return
        self._dense.append(raw)
        if len(self._dense) < self.config.settle_steps:
            return
        level, self._dense = min(self._dense), None
        slower = level > self.beta_s_per_byte
        if relative_change(self.beta_s_per_byte, level) >= self.config.change_threshold and \
                (not slower or self.evidence == "passive"):
            self._set(level, self.evidence, ts)

    def _take(self, pending: _Pending, evidence: str, ts: float) -> None:
        """Take a move: a path carries at least what crossed it, so the larger of
        what its dense syncs and its fresh probes read (Top-k syncs give no figure)."""
        figures = [min(pending.betas[-self.config.persist_steps:])] if pending.settled else []
        if self._probe is not None and self._probe[1] >= pending.since:
            figures.append(self._probe[0])
            self.probe_ref = self._probe[0]
        if figures:
            settled = pending.settled and (not figures[1:] or figures[0] <= figures[1])
            self._move(min(figures), evidence, ts, since=pending.since, settled=settled)

    # -- active ------------------------------------------------------------------
    def observe_active(self, beta_s_per_byte: float, ts: float, source: str = PROBE) -> None:
        """A fresh figure for the whole job's path: the slowest of its peers probed
        since `probes_since` (source "probe"), or the job's own report ("report")."""
        self._probe = (beta_s_per_byte, ts)
        old, pending = self.beta_s_per_byte, self._pending
        if source == REPORT or old is None:
            self._anchor(beta_s_per_byte, ts, source)
        elif pending is not None and pending.kind == "passive" and pending.probe_asked:
            self._judge(pending, beta_s_per_byte, ts)
        elif beta_s_per_byte <= old / (1 + self.config.change_threshold):
            self._anchor(beta_s_per_byte, ts, PROBE)  # faster than the estimate: it carried that much
        elif beta_s_per_byte < old * (1 + self.config.change_threshold):
            self._pending = None
            self.beta_s_per_byte = ewma(old, beta_s_per_byte, self.config.smoothing)
            self.probe_ref = ewma(self.probe_ref, beta_s_per_byte, self.config.smoothing)
        elif self._steady_dense:  # the job's own traffic shares the path
            self.probe_ref = ewma(self.probe_ref, beta_s_per_byte, self.config.smoothing)
        elif pending is not None and pending.kind == PROBE and \
                relative_change(pending.betas[-1], beta_s_per_byte) < self.config.change_threshold:
            self._anchor(beta_s_per_byte, ts, PROBE, since=pending.since)
        else:  # one probe alone: read it again before believing it
            self._pending = _Pending(PROBE, ts, 1, 1, [beta_s_per_byte])
            self.wants_probe = True

    def _judge(self, pending: _Pending, beta: float, ts: float) -> None:
        """A probe asked for by a passive move: it moved too (from what probes read
        before), or the host, not the path, was slow."""
        reference = self.probe_ref or self.beta_s_per_byte
        assert reference is not None
        threshold = 1 + self.config.passive_threshold
        moved = beta >= reference * threshold if pending.direction > 0 else beta <= reference / threshold
        if moved:
            self._take(pending, "passive+probe", ts)
            return
        self._pending = None
        self.probe_ref = beta
        self._baselines = {}  # the syncs' new level is the host's: each option learns it

    def _anchor(self, beta: float, ts: float, evidence: str, since: float | None = None) -> None:
        """Take an active figure as the estimate."""
        self.probe_ref = beta if evidence != REPORT else self.probe_ref
        self._move(beta, evidence, ts, since=since)

    def _move(self, beta: float, evidence: str, ts: float, since: float | None = None,
              settled: bool = False) -> None:
        """A new figure: options judge moves from their next steps, and unless it
        came from dense syncs (`settled`) the first dense syncs refine it."""
        moved = self.beta_s_per_byte is None or \
            relative_change(self.beta_s_per_byte, beta) >= self.config.change_threshold
        if moved:
            self._set(beta, evidence, ts, since=since)
            self._window.clear()
            self.alpha_fit = None  # the latency moves with the path too: fitted again from here
            self._recent, self._baselines = {}, {}
            self._dense = None if settled else []
        else:
            self.beta_s_per_byte, self._pending = beta, None

    def _set(self, beta: float, evidence: str, ts: float, since: float | None = None) -> None:
        self._pending = None
        self.beta_s_per_byte = beta
        self.evidence = evidence
        self.moved_at = ts
        self.fresh_after = ts if since is None else since


class Estimator:
    """Every path the agent knows: its jobs' peers and the jobs themselves.

    `bucket` is the token bucket every path is taken to have (configured, not probed).
    """

    def __init__(self, bucket: LinkBucket = PLAIN_LINK, config: EstimateConfig | None = None) -> None:
        self.bucket = bucket
        self.config = config or EstimateConfig()
        self.peers: dict[str, PeerPath] = {}
        self.jobs: dict[str, JobEstimate] = {}
        self.job_peers: dict[str, tuple[str, ...]] = {}
        self.reported_alpha: dict[str, float] = {}

    def peer(self, address: str) -> PeerPath:
        return self.peers.setdefault(address, PeerPath(address))

    def add_job(self, job_id: str, peers: Iterable[str], ts: float) -> JobEstimate:
        """Follow a job whose syncs cross the paths to `peers` (this host's own
        addresses already left out); a job added again starts afresh."""
        self.jobs[job_id] = JobEstimate(ts, self.config)
        self.job_peers[job_id] = tuple(dict.fromkeys(peers))
        self.reported_alpha.pop(job_id, None)
        return self.jobs[job_id]

    def remove_job(self, job_id: str) -> None:
        for table in (self.jobs, self.job_peers, self.reported_alpha):
            table.pop(job_id, None)

    def observe(self, m: Measurement, ts: float) -> list[str]:
        """One probe's measurement; the jobs whose paths it measured."""
        bandwidth = self.peer(m.peer).observe(m, ts, self.config)
        affected = [j for j, peers in self.job_peers.items() if m.ok and m.peer in peers]
        for job_id in affected if bandwidth else ():
            job = self.jobs[job_id]
            beta = self._probed_beta(self.job_peers[job_id], since=job.probes_since)
            if beta is not None:
                job.observe_active(beta, ts, PROBE)
        return affected

    def observe_report(self, job_id: str, report: StepReport, layout: GradientLayout, nodes: int,
                       ts: float, forms: ModelForms | None = None) -> None:
        obs = sync_observation(report, layout, nodes, forms)
        if obs is not None:
            self.jobs[job_id].observe_sync(option_key(report), report.family in WHOLE_GRADIENT, obs,
                                           self._alpha(job_id) or 0.0, self.bucket, ts)

    def observe_reported_network(self, job_id: str, alpha_s: float, bandwidth_bps: float,
                                 ts: float) -> None:
        """The job's own estimate of its network, taken as it is."""
        self.reported_alpha[job_id] = alpha_s
        self.jobs[job_id].observe_active(8.0 / bandwidth_bps, ts, REPORT)

    def bottleneck(self, job_id: str, nodes: int) -> NetworkObservation | None:
        """What the job's policy sees: its estimate's beta (the slowest probed peer,
        of any age, until it has one) and the highest alpha known on its paths.
        None while nothing is known."""
        job = self.jobs[job_id]
        beta = job.beta_s_per_byte or self._probed_beta(self.job_peers[job_id], since=None)
        if beta is None:
            return None
        evidence = job.evidence if job.beta_s_per_byte else PROBE
        return NetworkObservation(self._alpha(job_id) or 0.0, beta, nodes, self.bucket, evidence=evidence)

    def _probed_beta(self, peers: Sequence[str], since: float | None) -> float | None:
        """The slowest of `peers` among those tested at or after `since` (any time
        with None); None when none was."""
        betas = [p.beta_s_per_byte for p in (self.peers.get(a) for a in peers)
                 if p is not None and p.beta_s_per_byte
                 and (since is None or (p.measured is not None and p.measured >= since))]
        return max(betas) if betas else None

    def _alpha(self, job_id: str) -> float | None:
        alphas = [p.alpha_s for p in (self.peers.get(a) for a in self.job_peers.get(job_id, ()))
                  if p is not None and p.alpha_s is not None]
        if job_id in self.reported_alpha:
            alphas.append(self.reported_alpha[job_id])
        return max(alphas) if alphas else None
