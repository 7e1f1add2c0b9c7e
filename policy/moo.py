"""The multi-objective policy (after Tyagi & Swany 2023), over every compressor family.

Candidates are options, a compression over a collective (a `Choice`): dense and
bf16 over the dense collectives, PowerSGD at each of `ranks`, Top-k at each CR of
the geometric grid c_high..c_low over each Top-k collective. Each option has a
step time t_step = t_compute + t_comp + t_sync and a compression error 1 - gain.
By default (objective "budget", policy.budget) the choice is the fastest
option whose error is within what a step may deliver: the error
`quality_reference` would have delivered, plus what the run saved so far spread
over the next steps; "asf" (an achievement scalarising function on the Pareto
front, weights time/gain 0.6/0.4) and "progress" (gain / t_step) stay
selectable.

Where each figure comes from:
- t_sync: measured for the options run since the network last changed (the
  running one: the median of its latest steps); otherwise the calibrated
  alpha-beta model (policy.costmodel) of the job's gradient layout.
- t_comp: measured per compression once it ran, else the model scaled by what
  the compressions of that family measured say about this machine.
- t_compute: what the client reports (a step's wall time less its t_comp and
  t_sync), the median of recent steps.
- gain: 1 for dense and bf16; for a lossy choice what its steps delivered, else
  what the client's probes read for its compression; smoothed per step elapsed;
  for a family with a reference of its own (quality_reference's later entries),
  priced as its share of what that reference keeps, of what the first keeps.

Its parts, each with its own state: the quality budget (policy.budget), the
critical-regime detector (policy.regime: in a critical regime a step may
deliver at most `critical_share` of the reference's error), the exploring
budget (policy.exploring), the reconsideration rule (policy.reconsider), the
gain figures (policy.gains), the compute and compression times
(policy.steptimes) and the calibration (policy.costmodel); a candidate as it
is judged and the rules that compare candidates are policy.evaluation.

Phases: warm-up (a lossless option, to measure the job), exploring (run the few
options the calibrated model puts nearest the best choice, one or two steps each;
never more than `explore_share` of all steps, charged as the job ran them),
exploiting. A change, the network observed moving (alpha or beta by >=
change_threshold; the policy sees the network only through observe_network, the
agent's estimator being the one detector of a move), is judged by what it would
change: every option is predicted again under the network as it now is, and only
when another option would beat the running one by more than the margin does the
policy explore again; otherwise it keeps its choice and re-bases. A switch needs
the new choice to beat the current one by more than the margin (the hysteresis,
or the error of the fits behind the compared predictions), so near-equal options
do not flap.

Pure and deterministic: same calls, same decisions.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from flexcomm.policy import pareto
from flexcomm.policy.budget import QualityBudget
from flexcomm.policy.costmodel import (
    Calibration,
    CompressionCost,
    ModelForms,
    calibration_key,
    link_time,
    option_sync_time,
    option_terms,
    powersgd_split,
)
from flexcomm.policy.evaluation import (
    Evaluation,
    budget_rank,
    error_cap,
    fastest_within,
    objectives,
    outdone,
    share_left,
    uncalibrated,
    with_best_lossless,
    with_second,
    within,
    worth_its_error,
)
from flexcomm.policy.exploring import ExploreBudget
from flexcomm.policy.gains import GainFigures
from flexcomm.policy.linkestimate import BURST_BYTES, SYNC, SYNC_BOUND
from flexcomm.policy.outliers import OutlierGate, Verdict
from flexcomm.policy.plan import ExplorationPlan
from flexcomm.policy.reconsider import RUNNING_SAMPLES, Reconsideration
from flexcomm.policy.regime import CriticalRegime
from flexcomm.policy.steptimes import StepTimes
from flexcomm.policy.types import (
    AG_TOPK,
    ART_RING,
    ART_TREE,
    BF16,
    DENSE,
    DENSE_RING,
    FAMILIES,
    FAMILY_COLLECTIVES,
    MAX_PROBES,
    MAX_RANK,
    POWERSGD,
    ROOT_STAR,
    TOPK,
    Choice,
    Compression,
    Decision,
    GradientLayout,
    NetworkObservation,
    StepReport,
    check_cr,
    check_family,
    check_options,
    check_pairing,
    check_range,
    check_root,
    plain_fields,
)

WARMUP, EXPLORE, EXPLOIT = "warmup", "explore", "exploit"
OBJECTIVES = ("budget", "asf", "progress")
STATE_FORMAT = 16
LOOK_AGAIN_STEPS = 10  # steps between looks, while exploiting, for an untimed option the model puts first
# An untimed option the model puts ahead is run only when predicted at least this much
# better: fits in the lab were off by up to 0.80, and a margin of the fits' own error
# (0 for a fit never observed) measured option after option on a steady network.
UNTIMED_MARGIN = 1.0
# The collective a fixed choice of a lossy family runs over: what users pick, as the lab's rivals.
REFERENCE_COLLECTIVE = {TOPK: AG_TOPK, POWERSGD: DENSE_RING}
PREDICTION_TRUSTED = 3  # pairs a fit needs before its predictions may be chosen unmeasured
# A new choice may lose this share of the reference's error more than the
# allowance, and a running option twice that: options' errors are few and far
# apart (lossless at 0, the lossy ones near the reference's or above), so a strict
# allowance sent a job 7% of the reference's error in debt to bf16 at 10 Mbit/s, ten
# times slower, to repay it; and without the running option's wider band a
# simulated noisy host switched 243 times in 3,000 steps.
ERROR_BAND = 0.25
# Error is spent where it buys at least this share of what it buys where bandwidth
# is dearest (error_price): there the choice keeps twice the margin it needs.
PRICE_SHARE = 0.5
PROBE_UP_FACTOR = 4.0  # a lower-bound bandwidth is probed when this much more would change the choice
PROBE_UP_AGE_S = 300.0  # a bandwidth confirmed longer ago than this counts as a lower bound too
PROBE_UP_EVERY = 100  # steps between two probes up
SHOWN_SAMPLES = 2  # the running option's syncs on a new network that make its figure there
SYNC_FELL = 0.3  # the running lossy option's sync this much below its chosen figure: measure lossless
MAX_CANDIDATE_CRS = MAX_PROBES


def candidate_crs(c_low: float, c_high: float, factor: float) -> tuple[float, ...]:
    """c_high, c_high/factor, ... ending at c_low, rounded to c_low's decimal
    precision: (0.001, 0.1, 3) -> (0.1, 0.033, 0.011, 0.004, 0.001). The grid's
    size is computed before it is built and refused above MAX_CANDIDATE_CRS."""
    check_cr(c_low, "c_low")
    check_cr(c_high, "c_high")
    if c_low > c_high:
        raise ValueError(f"c_low: must be <= c_high ({c_high}), got {c_low}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (factor > 1.0 and math.isfinite(factor)):
        raise ValueError(f"factor: must be a finite number > 1, got {factor!r}")
    # Counted before anything is built: a factor near 1 asks for millions (and the
    # logs' difference, unlike the log of the ratio, holds for a subnormal c_low).
    steps = max(0, round((math.log(c_high) - math.log(c_low)) / math.log(factor)))
    if steps + 1 > MAX_CANDIDATE_CRS:
        raise ValueError(f"factor: {factor!r} from c_high {c_high} down to c_low {c_low} makes {steps + 1} CRs, "
                         f"at most {MAX_CANDIDATE_CRS}")
    decimals = max(0, -math.floor(math.log10(c_low)))
    crs = [round(c_high / factor**i, decimals) for i in range(steps)] + [c_low]
    out: list[float] = []
    for c in crs:
        if c > 0 and c not in out:
            out.append(c)
    return tuple(sorted(out, reverse=True))


@dataclass(frozen=True)
class MooConfig:
    families: tuple[str, ...] = FAMILIES
    ranks: tuple[int, ...] = (1, 2, 4)
    c_low: float = 0.001
    c_high: float = 0.1
    factor: float = 3.0
    collectives: tuple[str, ...] = (AG_TOPK, ART_RING, ART_TREE)
    dense_collectives: tuple[str, ...] = (DENSE_RING,)
    objective: str = "budget"
    quality_reference: str = "topk:0.1+powersgd:4"
    budget_payback_steps: int = 100
    critical_share: float = 1.0
    critical_window: int = 5
    critical_change: float = 0.5
    weight_time: float = 0.6
    weight_gain: float = 0.4
    change_threshold: float = 0.10
    alpha_floor_s: float = 1e-4
    hysteresis: float = 0.05
    warmup_steps: int = 1
    explore_steps: int = 2
    explore_share: float = 0.05
    explore_horizon: int = 100
    explore_max: int = 4
    explore_prune: float = 3.0
    gain_smoothing: float = 0.05
    root: str = ROOT_STAR
    ag_form: str = "paper"
    tree_form: str = "paper"
    index_bytes: int = 4
    comp_per_byte: float = CompressionCost.per_byte
    comp_per_selected_byte: float = CompressionCost.per_selected_byte
    comp_per_cast_byte: float = CompressionCost.per_cast_byte
    comp_per_mac: float = CompressionCost.per_mac

    def __post_init__(self) -> None:
        if not self.families:
            raise ValueError("families: at least one compressor family is needed")
        for f in self.families:
            check_family(f, "families")
        for r in self.ranks:
            if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_RANK:
                raise ValueError(f"ranks: a PowerSGD rank is a whole number in 1..{MAX_RANK}, got {r!r}")
        if len(self.ranks) > MAX_PROBES // 2:
            raise ValueError(f"ranks: at most {MAX_PROBES // 2}, got {len(self.ranks)}")
        candidate_crs(self.c_low, self.c_high, self.factor)
        for c in self.collectives:
            check_pairing(TOPK, c, "collectives")
        for c in self.dense_collectives:
            check_pairing(DENSE, c, "dense_collectives")
        for name in ("families", "ranks", "collectives", "dense_collectives"):
            listed = getattr(self, name)
            if len(set(listed)) != len(listed):  # each would be one more candidate, or none
                raise ValueError(f"{name}: {sorted(listed, key=str)} lists one twice")
        if not self.options:
            raise ValueError("families: no option is left (check collectives, dense_collectives and ranks)")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective: unknown objective {self.objective!r} (one of {', '.join(OBJECTIVES)})")
        self.references  # noqa: B018 -- validates quality_reference
        check_root(self.root)
        check_range("weight_time", self.weight_time, 0, 1)
        check_range("weight_gain", self.weight_gain, 0, 1)
        if self.weight_time + self.weight_gain <= 0:
            raise ValueError("weight_time: weights must not both be 0")
        check_range("change_threshold", self.change_threshold, 0, 10, open_low=True)
        check_range("alpha_floor_s", self.alpha_floor_s, 0, 10)
        check_range("hysteresis", self.hysteresis, 0, 1)
        check_range("gain_smoothing", self.gain_smoothing, 0, 1, open_low=True)
        check_range("explore_share", self.explore_share, 0, 1)
        check_range("explore_prune", self.explore_prune, 1, 1e6)
        check_range("critical_share", self.critical_share, 0, 1)
        check_range("critical_change", self.critical_change, 0, 10, open_low=True)
        for name, low in (("warmup_steps", 0), ("explore_steps", 1), ("budget_payback_steps", 1),
                          ("explore_horizon", 0), ("explore_max", 1), ("critical_window", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= 1_000_000:
                raise ValueError(f"{name}: must be a whole number in {low}..1000000, got {v!r}")
        ModelForms(self.ag_form, self.tree_form, 4, self.index_bytes)
        self.comp_cost  # noqa: B018 -- validates the compute coefficients

    @cached_property
    def references(self) -> tuple[Compression, ...]:
        """quality_reference's compressions, joined by "+" (a comma would split the
        lab's policy options): the budget's reference first, then at most one more
        per other lossy family, which prices that family's options."""
        if not isinstance(self.quality_reference, str):
            raise ValueError(f"quality_reference: expected text, got {self.quality_reference!r}")
        refs = tuple(Compression.parse(t.strip(), "quality_reference") for t in self.quality_reference.split("+"))
        families = [r.family for r in refs]
        if len(set(families)) != len(families):
            raise ValueError(f"quality_reference: at most one per family, got {self.quality_reference!r}")
        if len(refs) > 1 and not all(r.lossy for r in refs):
            raise ValueError(f"quality_reference: a lossless reference stands alone, got {self.quality_reference!r}")
        return refs

    @cached_property
    def crs(self) -> tuple[float, ...]:
        return candidate_crs(self.c_low, self.c_high, self.factor)

    @cached_property
    def options(self) -> tuple[Choice, ...]:
        """Every candidate, lossless ones first."""
        out: list[Choice] = []
        for family in (DENSE, BF16):
            if family in self.families:
                out += [Choice(Compression(family), c) for c in self.dense_collectives
                        if c in FAMILY_COLLECTIVES[family]]
        if POWERSGD in self.families:
            out += [Choice(Compression(POWERSGD, r), DENSE_RING) for r in sorted(set(self.ranks))]
        if TOPK in self.families:
            out += [Choice(Compression(TOPK, cr), c) for cr in self.crs for c in self.collectives]
        return tuple(out)

    def forms(self, layout: GradientLayout) -> ModelForms:
        return ModelForms(self.ag_form, self.tree_form, layout.value_bytes, self.index_bytes)

    @cached_property
    def comp_cost(self) -> CompressionCost:
        return CompressionCost(self.comp_per_byte, self.comp_per_selected_byte, self.comp_per_cast_byte,
                               self.comp_per_mac)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> MooConfig:
        """Build from plain options (CLI, TOML, RPC); unknown keys and values of
        the wrong type are refused, naming the option."""
        return cls(**check_options(options, cls, "MOO"))

    def to_dict(self) -> dict[str, Any]:
        d = plain_fields(self)
        for key in ("families", "collectives", "dense_collectives", "ranks"):
            d[key] = list(getattr(self, key))
        return d


@dataclass
class _State:
    phase: str = WARMUP
    phase_steps: int = 0
    net: NetworkObservation | None = None  # the network as the policy takes it now
    observed: NetworkObservation | None = None  # the last one observe_network was given
    dear: NetworkObservation | None = None  # the slowest network (not a lower bound) seen (error_price)
    sync: dict[str, list[float]] = field(default_factory=dict)  # option label -> latest syncs, since the last change
    current: Decision | None = None
    version: int = 0
    probed_up_at: int | None = None  # steps seen when a lossless option last ran to probe up
    next_look: int = 0  # phase_steps from which the next look for an untimed option is due

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the decision and the networks by their own to_dict."""
        d = plain_fields(self)
        d["current"] = self.current.to_dict() if self.current else None
        for key in ("net", "observed", "dear"):
            d[key] = d[key].to_dict() if d[key] is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> _State:
        d = dict(d)
        d["current"] = Decision.from_dict(d["current"]) if d.get("current") else None
        for key in ("net", "observed", "dear"):
            d[key] = NetworkObservation(**d[key]) if d.get(key) else None
        return cls(**d)


class MooPolicy:
    """Multi-objective choice of (compression, collective); see the module docstring."""

    name = "moo"

    def __init__(self, grad_bytes: float, config: MooConfig | None = None,
                 layout: GradientLayout | None = None) -> None:
        if not (isinstance(grad_bytes, (int, float)) and math.isfinite(grad_bytes) and grad_bytes > 0):
            raise ValueError(f"grad_bytes: must be finite and > 0, got {grad_bytes!r}")
        self.layout = layout or GradientLayout.flat(grad_bytes)
        self.config = config or MooConfig()
        self._new_parts()
        self._price: float | None = None  # error_price(), cached until an observation arrives
        self._fresh = True  # observed since the last choice
        self._reset_caches()
        self._set_current(self._warmup_option(), "warm-up: measuring the job on a known-good option")
        if self.config.warmup_steps == 0:
            self._start_exploration("first exploration")

    def _new_parts(self) -> None:
        """Every part's state as a new job's, with the settings of `config`."""
        self.calibration = Calibration()
        self.budget = QualityBudget(self.config.budget_payback_steps)
        self.regime = CriticalRegime(self.config.critical_window, self.config.critical_change)
        self.exploring = ExploreBudget()
        self.watch = Reconsideration()
        self.gains = GainFigures(self.config.gain_smoothing)
        self.times = StepTimes()
        self.plan = ExplorationPlan()
        self.outliers = OutlierGate()
        self._s = _State()

    def _reset_caches(self) -> None:
        """Figures derived from the layout and config alone, computed once each."""
        self._term_cache: dict[tuple[Choice, int], tuple[float, float]] = {}
        self._comp_models: dict[str, tuple[Compression, float]] = {}
        self._link_times: tuple[NetworkObservation | None, dict[str, float]] = (None, {})

    @property
    def grad_bytes(self) -> int:
        return self.layout.grad_bytes

    @cached_property
    def forms(self) -> ModelForms:
        return self.config.forms(self.layout)

    @cached_property
    def options(self) -> tuple[Choice, ...]:
        """The config's options this gradient can use (PowerSGD only where its
        rule compresses some matrix at that rank)."""
        return tuple(o for o in self.config.options if o.compression.family != POWERSGD
                     or powersgd_split(self.layout, o.compression.rank).p_values > 0)

    @cached_property
    def _labels(self) -> frozenset[str]:
        return frozenset(o.label for o in self.options)

    @cached_property
    def _by_label(self) -> dict[str, Choice]:
        return {o.label: o for o in self.options}

    @cached_property
    def probes(self) -> tuple[str, ...]:
        names = [o.compression.name for o in self.options if o.compression.lossy]
        # the references' errors on each step are what the budget allows and prices by
        if self.reference.lossy:
            names.append(self.reference.name)
        names += [c.compression.name for c in self._family_references.values()]
        return tuple(dict.fromkeys(names))

    @cached_property
    def reference(self) -> Compression:
        """The budget's reference: what the run may lose, step for step."""
        return self.config.references[0]

    @cached_property
    def _family_references(self) -> dict[str, Choice]:
        """The other candidate families' references, as a user runs them."""
        families = {o.compression.family for o in self.options}
        return {r.family: Choice(r, REFERENCE_COLLECTIVE[r.family]) for r in self.config.references[1:]
                if r.family in families}

    # --- observations --------------------------------------------------------

    def observe_network(self, net: NetworkObservation) -> None:
        """The network as probed (or estimated by the agent). The same observation
        again is no news: it must not undo what the step reports have shown since."""
        if net == self._s.observed:
            return
        version = self._s.version
        self._on_network(net)
        if self._s.version != version:
            self.exploring.change_untimed()

    def _on_network(self, net: NetworkObservation) -> None:
        self._price, self._fresh = None, True
        self._s.observed = self._s.net = net
        if not net.lower_bound and (self._s.dear is None or net.beta_s_per_byte > self._s.dear.beta_s_per_byte):
            self._s.dear = net  # a lower bound may be far below the link
        if self._s.phase == WARMUP and self._s.phase_steps == 0:  # warm up on what this network favours
            self._set_current(self._warmup_option(), self._s.current.reason)
        moved = self.watch.moved(net, self.config.change_threshold, self.config.alpha_floor_s)
        if moved:
            # Outliers were judged against the network just left: kept, a fit whose
            # last fast-link steps swung 3x on host jitter (2 against 6 ms) stayed
            # untrusted through a short lab's 10 Mbit/s phase, and Top-k 0.1 with it.
            self.outliers.clear()
        if self._s.phase == EXPLOIT and moved:
            self._s.sync = {}  # measured on the old network
            self._reconsider(self.watch.change_reason(net))
        elif self._s.phase == EXPLORE and moved and not self.watch.blind:
            # What was measured so far ran on the old network: averaged with what
            # runs on this one it describes neither (the lab once chose an option
            # measured half at 100 and half at 20 Mbit/s). Plan again from here.
            # An exploration that ran blind measured this same network: it goes on
            # (restarted, the lab's first exploration ran three times).
            self._start_exploration(f"{self.watch.change_reason(net)} while exploring", running_free=False)
        elif self._s.phase == EXPLORE and moved:
            self._replan_blind_rest()
        elif self._s.phase == EXPLOIT and (choice := self._worth_probing_up(net)) is not None:
            self._probe_up(net, choice)

    def _worth_probing_up(self, net: NetworkObservation) -> Choice | None:
        """The lossless option to probe up with, if any: the bandwidth is only known
        to be at least this (or was last confirmed long ago), a lossy option runs,
        and on a link PROBE_UP_FACTOR times as fast the model would run a lossless
        one: only running one shows which. Once per PROBE_UP_EVERY steps, and only
        inside the exploring budget."""
        s = self._s
        if not (net.lower_bound or net.age_s >= PROBE_UP_AGE_S):
            return None
        if s.current is None or not s.current.compression.lossy:
            return None
        if s.probed_up_at is not None and self.exploring.steps_seen - s.probed_up_at < PROBE_UP_EVERY:
            return None
        if not self._budget_covers_an_item():
            return None
        return self._faster_choice(net)

    def _faster_choice(self, net: NetworkObservation) -> Choice | None:
        """The best lossless option if the model, on a link PROBE_UP_FACTOR times
        as fast, would choose it over the running option."""
        faster = replace(net, beta_s_per_byte=net.beta_s_per_byte / PROBE_UP_FACTOR)
        rows = self.evaluate(predicted=True, on=faster)
        if not rows:
            return None
        best = self.best(rows)
        return best.option if best.option.lossless else None

    def _probe_up(self, net: NetworkObservation, choice: Choice) -> None:
        """Run `choice`, the best lossless option, for one item, as an exploration of one."""
        s = self._s
        s.probed_up_at = self.exploring.steps_seen
        why = (f"bandwidth {'at least' if net.lower_bound else 'last confirmed'} {net.bandwidth_bps / 1e6:.4g} Mbit/s"
               f"{'' if net.lower_bound else f' {net.age_s:.0f} s ago'}: probing up with {choice.label}")
        self._new_plan([(choice.label, True), (self._current_label(), False)], why)
        s.sync = {}
        self._measure_plan()

    def observe_steps(self, reports: Sequence[StepReport]) -> None:
        for report in reports:
            self._observe_step(report)

    def _observe_step(self, report: StepReport) -> None:
        s = self._s
        self._price, self._fresh = None, True
        if report.t_compute_s > 0:
            self.times.observe_compute(report.t_compute_s)
        self.regime.observe(report.grad_norm)
        label = report.choice.label
        exploring = self._spent_exploring(label)
        self._observe_gains(report, exploring)
        # Only candidates' figures are kept: a report may name any option, and what
        # no candidate reads would grow the state without bound.
        candidate = label in self._labels
        if candidate and report.family != DENSE:
            self.times.observe_compression(report.compression.name, report.t_comp_s)
        # A step that overlapped a bandwidth test says nothing of its option's sync.
        timed = report.t_sync_s > 0 and not report.disturbed
        if timed and candidate:
            s.sync[label] = [*s.sync.get(label, ()), report.t_sync_s][-RUNNING_SAMPLES:]
            self._calibrate(report)
        self.exploring.observe(exploring, runs_decision=self._runs_current(report))
        # An item being measured counts only steps that measured it: the agent's
        # first bandwidth test overlaps a job's first exploration, and its items,
        # all disturbed, were left untimed and looked at again one by one.
        if self._runs_current(report) and not (s.phase == EXPLORE and report.disturbed):
            s.phase_steps += 1
            if timed:
                self.watch.ran(report.t_sync_s, report.t_sync_s / (report.t_compute_s or self.t_compute or 1.0))
            self._advance()

    def _calibrate(self, report: StepReport) -> None:
        """Fit the model's error on this pair, as the outlier gate lets it."""
        net = self._net()
        if net is None:
            return
        key = calibration_key(report.compression, report.collective)
        raw = self._link_time(report.choice, net)
        fitted = self.calibration.observations(key)
        ratio = report.t_sync_s / max(self.calibration.apply(key, raw), 1e-12) if fitted else None
        verdict = self.outliers.judge(key, ratio)
        if verdict is Verdict.SKIP:
            return
        if verdict is Verdict.REFIT:
            self.calibration.forget(key)
        self.calibration.observe(key, raw, report.t_sync_s)

    def _observe_gains(self, report: StepReport, exploring: bool) -> None:
        """The probes' readings of the candidates' compressions and what a
        candidate's step delivered (policy.gains), then what the step spent of
        the quality budget."""
        for name, g in sorted(report.gains.items()):
            if name in self.probes:
                self.gains.probe(name, float(g), report.step)
        label = report.choice.label
        if report.compression.lossy and label in self._labels:
            self.gains.deliver(label, report.gain, report.step)
        reference = self._reference_error()
        # Exploring steps are bounded by their own share, not charged to the quality
        # budget: the short lab's first exploration (Top-k over the AR collectives,
        # delivering little) left the run 17% in debt, and the debt kept the
        # reference itself out of the allowance through a 10 Mbit/s phase.
        if reference is not None and not exploring:
            self.budget.observe(self._charge(report.choice, report.gain, reference), reference)

    def _charge(self, choice: Choice, gain: float, reference: float) -> float:
        """The error a step of `choice` that delivered `gain` spends of the budget.

        A reference spends what it allows, by definition: charged its own step's
        error, a family reference (PowerSGD rank 4, whose delivered gain falls from
        0.9 to 0.15 as its residual fills) was chosen on its smoothed figure and
        charged each lower step; on lm, where Top-k 0.1 loses 0.3% a step, that was
        250% of the budget in 17 steps. Any other option is charged as it was
        chosen (`_family_priced`), or as delivered; and while the policy measures,
        no more than the reference or the allowance, whichever is more: what it
        delivered beyond a choice's is the price of finding out, which the exploring
        share bounds (charged in full, the lm lab's 12 steps measuring Top-k 0.033
        over the AR collectives, delivering next to nothing, left the run 32% in
        debt, repaid with bf16 at 0.9 s a step through a 30 Mbit/s phase where
        PowerSGD rank 4 ran at 0.18 s)."""
        if self._is_reference(choice):
            return reference
        priced = self._family_priced(choice, reference)
        error = 1.0 - (gain if priced is None else priced)
        if self._s.phase == EXPLORE:
            error = min(error, max(reference, self._allowance() or 0.0))
        return error

    def _is_reference(self, choice: Choice) -> bool:
        """`choice` is the budget's reference or a family's, as a user runs it."""
        return choice.label == self._reference_label or \
            self._family_references.get(choice.compression.family) == choice

    # --- decisions -----------------------------------------------------------

    def choose(self) -> Decision:
        """Choose on what was observed since the last choice (while warming up or
        exploring, the plan moved on as the steps came) and return the decision."""
        if self._fresh and self._s.phase == EXPLOIT:
            self._choose()
        self._fresh = False
        return self.decide()

    def decide(self) -> Decision:
        current = self._s.current
        if current is None:  # only between leaving an exploration and its choice
            raise RuntimeError("the MOO has no decision in force")
        return current

    def evaluate(self, *, predicted: bool = False, on: NetworkObservation | None = None) -> list[Evaluation]:
        """Every candidate with the figures the choice would use (skips those with
        no measured nor predictable sync time). predicted=True ignores what was
        measured: every option as the calibrated model sees it. `on`: the network
        to model the sync times on, when not the one last observed."""
        s = self._s
        net = on if on is not None else self._net()
        rows = []
        running = self._current_label()
        t_compute = self.t_compute
        scales = {family: self._comp_scale(family) for family in FAMILIES}
        delivery = self.gains.delivery_ratios(self._by_label)
        reference_error = self._reference_error()
        for option in self.options:
            raw = self._link_time(option, net) if net else None
            measured = not predicted
            if measured and option.label == running and s.phase == EXPLOIT and self.watch.sync() is not None:
                # The median of its latest steps, else the figure it was chosen on
                # (measured or predicted): one slow step must not switch the job.
                t_sync, measured = self.watch.sync(), self.watch.sync_measured()
            elif measured and option.label in s.sync:
                t_sync = statistics.median(s.sync[option.label])
            elif raw is not None:
                key = calibration_key(option.compression, option.collective)
                t_sync, measured = self.calibration.apply(key, raw), False
            else:
                continue
            t_comp = self._t_comp(option.compression, scales[option.compression.family])
            gain = 1.0 if not option.compression.lossy else self._family_priced(option, reference_error)
            if gain is None:
                gain = self.gains.expected(option, delivery)
            t_step = t_compute + t_comp + t_sync
            rows.append(Evaluation(option, t_sync, t_comp, t_step, gain, measured, raw))
        return rows

    def _family_priced(self, option: Choice, reference_error: float | None) -> float | None:
        """The gain of an option of a family with a reference of its own, in the
        budget's reference's terms: its share of what its family's reference keeps
        (their probes, read off the same gradients), of what the budget's reference
        keeps; the family's reference itself keeps exactly that. None for other
        families, or while a figure is unknown.

        A step's gain orders one family's options but not the families against
        each other (bench/quality_measures.py, cnn: PowerSGD rank 2 kept 11% of the
        compensated norm a step and lost less than Top-k 0.1, which kept 61%)."""
        reference = self._family_references.get(option.compression.family)
        if reference is None or reference_error is None:
            return None
        return self.gains.share_of(option, reference, 1.0 - reference_error)

    @property
    def t_compute(self) -> float:
        return self.times.t_compute

    def best(self, rows: list[Evaluation]) -> Evaluation:
        """The best of `rows` by the rule (no hysteresis): the fastest within the
        allowance, or the Pareto front then ASF or progress. Unknown gains leave
        time as the only objective."""
        if not rows:
            raise ValueError("rows: nothing to choose from")
        allowance = self._allowance()
        if any(r.gain is None for r in rows) or (self.config.objective == "budget" and allowance is None):
            return min(rows, key=lambda r: (r.t_step_s, r.option))
        if self.config.objective == "budget":
            return fastest_within(rows, allowance, self.config.hysteresis, self.error_price())
        points = [objectives(r) for r in rows]
        front = pareto.pareto_front(points)
        if self.config.objective == "progress":
            return max((rows[i] for i in front), key=lambda r: (r.gain / r.t_step_s, r.gain))
        scores = self._asf([points[i] for i in front])
        best = min(range(len(front)), key=lambda j: (scores[j], points[front[j]][0]))
        return rows[front[best]]

    def ranking(self, rows: list[Evaluation]) -> list[Evaluation]:
        """`rows` best first, for planning what to measure: what choose() would run,
        then the rest by its objective. (Sorted by the objective alone, the budget's
        order lost choose()'s tie-break: on the lm lab's recovered link the model put
        PowerSGD rank 4 at 144.2 ms a step and bf16 at 144.7, the rule would run
        bf16, but the plan's free first item was rank 4 and, the exploring budget
        spent, bf16 was never timed: 75 steps of rank 4 on a 1 Gbit/s link.)"""
        if not rows:
            return []
        first = self.best(rows)
        return [first, *(r for r in self._ordered(rows) if r is not first)]

    def _ordered(self, rows: list[Evaluation]) -> list[Evaluation]:
        """`rows` in the order of the objective choose() uses."""
        allowance = self._allowance()
        if any(r.gain is None for r in rows) or (self.config.objective == "budget" and allowance is None):
            return sorted(rows, key=lambda r: (r.t_step_s, r.option))
        if self.config.objective == "budget":
            return sorted(rows, key=lambda r: (*budget_rank(r, allowance), r.option))
        if self.config.objective == "progress":
            return sorted(rows, key=lambda r: (-r.gain / r.t_step_s, r.option))
        scores = self._asf([objectives(r) for r in rows])
        return [rows[i] for i in sorted(range(len(rows)), key=lambda i: (scores[i], rows[i].option))]

    def _allowance(self) -> float | None:
        """The error a newly chosen option may deliver: what a step may deliver now
        (policy.budget) and ERROR_BAND of the reference's error more, in a
        critical regime (policy.regime) critical_share of the reference's error
        at most; None while the reference's error is not known yet."""
        ref = self._reference_error()
        if ref is None:
            return None
        allowance = min(self.budget.allowance(ref) + ERROR_BAND * ref, error_cap(ref))
        return min(allowance, self.config.critical_share * ref) if self.regime.critical else allowance

    @cached_property
    def _reference_label(self) -> str | None:
        """The reference as a user runs it (a choice's label), None when lossless."""
        ref = self.reference
        return Choice(ref, REFERENCE_COLLECTIVE[ref.family]).label if ref.lossy else None

    @property
    def _reference_choice(self) -> Choice | None:
        """The reference as a user runs it, where it is among the options."""
        return self._by_label.get(self._reference_label) if self._reference_label else None

    def error_price(self) -> float:
        """What a unit of error must buy to be spent: PRICE_SHARE of the share of a
        step it buys where bandwidth is dearest in the run (the slowest network
        observed, not a lower bound), from the fastest lossless option there to
        the fastest within the reference's allowance, as the model puts them
        now; 0 before a network is known or where compression buys nothing even
        there. A lossier option is chosen over a less lossy one only where the
        share of the step it saves is at least this per unit of error it adds
        (_fastest_within): on the lm lab's 1 Gbit/s phases PowerSGD rank 4 saved
        0-15% of bf16's step for the reference's error, which bought 80% of it at
        30 Mbit/s, and the phases it ran lost the tight target (dense's loss +
        0.05)."""
        if self._price is None:
            self._price = self._price_on(self._s.dear)
        return self._price

    def _price_on(self, dear: NetworkObservation | None) -> float:
        ref = self._reference_error()
        if dear is None or not ref:
            return 0.0
        rows = [r for r in self.evaluate(predicted=True, on=dear) if r.gain is not None]
        lossless = [r.t_step_s for r in rows if r.option.lossless]
        allowed = [r for r in rows if r.error <= ref * (1 + ERROR_BAND)]
        if not lossless or not allowed:
            return 0.0
        fastest = min(lossless)
        choice = min(allowed, key=lambda r: (r.t_step_s, r.error, r.option))
        if choice.error <= 0 or choice.t_step_s >= fastest:
            return 0.0
        return PRICE_SHARE * (fastest - choice.t_step_s) / fastest / choice.error

    def _reference_error(self) -> float | None:
        """The error the reference delivers as a user would run it (over
        REFERENCE_COLLECTIVE) once it ran so, else as the probes read it off rank
        0's gradient. Spending is charged as delivered, so the allowance is too:
        Top-k 0.1 over AllGather delivered 0.39 where the probes read 0.32, and the
        reference itself looked over the budget (the short lab ran bf16 at 10
        Mbit/s). Over a collective that delivers less (the AR collectives'
        non-root ranks send little) it allows more than the reference's quality:
        read so, Top-k 0.01's error climbed from 0.46 to 0.94 in a lab run, which
        then ran Top-k 0.001 (error 0.99)."""
        ref = self.reference
        if not ref.lossy:
            return 0.0
        gain = self.gains.delivered.get(self._reference_label, self.gains.probed.get(ref.name))
        return None if gain is None else 1.0 - gain

    def _asf(self, points: list[tuple[float, float]]) -> list[float]:
        return pareto.asf_scores(points, (self.config.weight_time, self.config.weight_gain))

    def model_error(self) -> float | None:
        """The calibrated model's current relative error (worst fit)."""
        return self.calibration.error()

    # --- persistence ---------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.name,
            "format": STATE_FORMAT,
            "grad_bytes": self.grad_bytes,
            "layout": self.layout.to_dict(),
            "config": self.config.to_dict(),
            "calibration": self.calibration.state_dict(),
            "budget": self.budget.state_dict(),
            "regime": self.regime.state_dict(),
            "exploring": self.exploring.state_dict(),
            "reconsideration": self.watch.state_dict(),
            "gains": self.gains.state_dict(),
            "times": self.times.state_dict(),
            "plan": self.plan.state_dict(),
            "outliers": self.outliers.state_dict(),
            "state": self._s.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state. A state saved by an older flexcomm (another
        format) keeps the job's settings and starts measuring afresh."""
        known = {f for f in MooConfig.__dataclass_fields__}
        config = {k: v for k, v in state["config"].items() if k in known}
        self.config = MooConfig.from_options(config)
        layout = state.get("layout")
        self.layout = (GradientLayout.from_dict(layout) if layout
                       else GradientLayout.flat(float(state["grad_bytes"])))
        for cached in ("forms", "options", "probes", "_labels", "_by_label", "reference", "_reference_label",
                       "_family_references"):
            self.__dict__.pop(cached, None)
        self._reset_caches()
        self._price, self._fresh = None, True
        if state.get("format") != STATE_FORMAT:
            self._new_parts()
            self._set_current(self._warmup_option(), "warm-up: state of an older flexcomm, measuring afresh")
            return
        self.calibration = Calibration.from_state(state["calibration"])
        self.budget = QualityBudget.from_state(state["budget"], self.config.budget_payback_steps)
        self.regime = CriticalRegime.from_state(state["regime"], self.config.critical_window,
                                                self.config.critical_change)
        self.exploring = ExploreBudget.from_state(state["exploring"])
        self.watch = Reconsideration.from_state(state["reconsideration"])
        self.gains = GainFigures.from_state(state["gains"], self.config.gain_smoothing)
        self.times = StepTimes.from_state(state["times"])
        self.plan = ExplorationPlan.from_state(state["plan"])
        self.outliers = OutlierGate.from_state(state["outliers"])
        self._s = _State.from_dict(state["state"])

    @property
    def phase(self) -> str:
        return self._s.phase

    @property
    def network(self) -> NetworkObservation | None:
        """The last network observation, if any."""
        return self._net()

    @property
    def explorations(self) -> int:
        return self.plan.started

    @property
    def explore_steps(self) -> int:
        """Steps run on an option only to measure it."""
        return self.exploring.spent

    # --- internals: figures --------------------------------------------------

    def _net(self) -> NetworkObservation | None:
        return self._s.net

    def _current_label(self) -> str | None:
        cur = self._s.current
        return None if cur is None else cur.label

    def _comp_scale(self, family: str) -> float:
        """Measured over modelled t_comp, averaged over the family's compressions that ran."""
        ratios = []
        for name in self.times.timed():
            c, model = self._modelled_comp(name)
            if c.family == family and model > 0:
                ratios.append(self.times.t_comp(name) / model)
        return sum(ratios) / len(ratios) if ratios else 1.0

    def _modelled_comp(self, name: str) -> tuple[Compression, float]:
        """A compression (by text form) and its modelled t_comp, parsed once."""
        known = self._comp_models.get(name)
        if known is None:
            c = Compression.parse(name)
            known = self._comp_models[name] = (c, self.config.comp_cost.seconds(c, self.layout))
        return known

    def _terms(self, option: Choice, nodes: int) -> tuple[float, float]:
        """The option's (latencies, bytes) for `nodes` workers: they depend on
        the layout and the forms alone, so they are computed once."""
        key = (option, nodes)
        terms = self._term_cache.get(key)
        if terms is None:
            terms = self._term_cache[key] = option_terms(option.compression, option.collective, self.layout,
                                                         nodes, self.forms)
        return terms

    def _link_time(self, option: Choice, net: NetworkObservation) -> float:
        """The option's uncalibrated sync time on `net`, kept while `net` is the
        network in hand: every report's calibration asks it."""
        network, times = self._link_times
        if network is not net:
            network, times = self._link_times = (net, {})
        t = times.get(option.label)
        if t is None:
            t = times[option.label] = link_time(self._terms(option, net.nodes), net)
        return t

    def _t_comp(self, compression: Compression, scale: float) -> float:
        """Measured, or the model's figure times what the family measured (`scale`)."""
        if compression.family == DENSE:
            return 0.0
        measured = self.times.t_comp(compression.name)
        if measured is not None:
            return measured
        return scale * self._modelled_comp(compression.name)[1]

    def _spent_exploring(self, label: str) -> bool:
        """A step run only to measure its option: the running exploring option, or
        one this plan or the one before it explored that the job still runs until its next agreement
        (the client adopts a decision every control interval, so an option measured
        runs on after the policy moved on; those steps are spent all the same)."""
        s = self._s
        if s.current is not None and label == self._current_label():
            return s.current.exploring
        return self.plan.spent_on(label)

    def _runs_current(self, report: StepReport) -> bool:
        return report.choice.label == self._current_label()

    # --- internals: phases ---------------------------------------------------

    def _warmup_option(self) -> Choice:
        """A known-good lossy setting where the budget has one among the options
        (`_warmup_reference`): it costs far less than a lossless option on a
        slow link, and the budget's reference, run, delivers the error the
        budget needs. Else the lossless option the model expects fastest, or
        with no network known the one that moves the fewest bytes (counted for
        two workers: the order holds for more): in the lab a job registers before
        any probe, and its dense warm-up steps ran 525-853 ms each on a 20 Mbit/s
        link where bf16's ran 250-330 ms."""
        if self._reference_choice is not None:
            return self._warmup_reference(self._reference_choice)
        lossless = [o for o in self.options if o.lossless] or list(self.options[:1])
        net = self._net()
        if net is None:
            return min(lossless, key=lambda o: (self._terms(o, 2)[1], o))
        return min(lossless, key=lambda o: (option_sync_time(o.compression, o.collective, self.layout, net,
                                                             self.forms), o))

    def _warmup_reference(self, reference: Choice) -> Choice:
        """A known-good setting: the budget's reference or a family's (priced at
        the reference's error by definition). With no network known, the one
        that moves the fewest bytes, as among lossless options: a slow link costs
        a byte-heavy one far more than a fast link costs a light one (default
        lab, 20 Mbit/s: Top-k 0.1 over AllGather warmed up at 220-240 ms a step
        where PowerSGD rank 4 ran 40). With a network, the budget's reference
        unless it is far behind another (`_reference_far_behind`)."""
        if self._net() is None:
            return min([reference, *self._family_references.values()], key=lambda o: (self._terms(o, 2)[1], o))
        return self._reference_far_behind() or reference

    def _reference_far_behind(self) -> Choice | None:
        """The family reference the model puts fastest, where it puts the budget's
        reference more than `explore_prune` times slower (as an option that far
        behind the first is not worth measuring), else None. Then the budget's
        reference waits for a network that makes it cheap, and its probes read
        its error. Compared on the uncalibrated model's figures, sync and
        compression: fits fed by PowerSGD rank 4's first steps (73-83 ms, where
        its later ones ran 30-40) put it within 3x of Top-k 0.1 over AllGather at
        20 Mbit/s (measured 200-230 ms) in 2 of 3 lab runs.
        Within the window the budget's reference runs: on a 1 Gbit/s link the
        model put rank 4 ahead, and it ran 40-80 ms a step where Top-k 0.1 ran 27."""
        reference = self._reference_choice
        if reference is None or not self._family_references or self._net() is None:
            return None
        rows = {r.label: self._as_modelled(r) for r in self.evaluate(predicted=True)}
        mine = rows.get(reference.label)
        others = [rows[c.label] for c in self._family_references.values() if c.label in rows]
        fastest = min(others, key=lambda r: (r.t_step_s, r.option), default=None)
        if fastest is None or mine is None or mine.t_step_s <= fastest.t_step_s * self.config.explore_prune:
            return None
        return fastest.option

    def _as_modelled(self, row: Evaluation) -> Evaluation:
        """`row` as the model alone puts it: its raw sync and compression time."""
        c = row.option.compression
        t_comp = 0.0 if c.family == DENSE else self._modelled_comp(c.name)[1]
        row = uncalibrated(row)
        return replace(row, t_comp_s=t_comp, t_step_s=row.t_step_s - row.t_comp_s + t_comp)

    def _advance(self) -> None:
        s, cfg = self._s, self.config
        if s.phase == WARMUP and s.phase_steps >= cfg.warmup_steps and self._compression_timed():
            self._start_exploration("first exploration")
        elif s.phase == EXPLORE and s.phase_steps >= cfg.explore_steps:
            self.plan.next()
            self._run_plan_item()
        elif s.phase == EXPLOIT:
            fell = self._lossy_sync_fell()
            # Only with the budget for the lossless item: without it the plan is the
            # free items alone, and the lab re-planned them ten times in 12 s.
            if fell and self._budget_covers_an_item():
                self._start_exploration(f"sync of the running lossy option fell {fell:.0%}; "
                                        "measuring the best lossless option", with_lossless=True)

    def _compression_timed(self) -> bool:
        """The running option's compression has a figure past its set-up step: the
        first exploration is planned on it (on the model's figure in its place, a
        simulated job whose bf16 compressed in 1 ms, the model's 16, never ran it)."""
        c = self._s.current.compression if self._s.current else None
        return c is None or c.family == DENSE or self.times.t_comp(c.name) is not None

    def _measure_an_untimed_first_choice(self, rows: list[Evaluation]) -> bool:
        """When the rule, on the model's figures, puts an option nobody timed on
        this network ahead of the running one by more than UNTIMED_MARGIN, run it
        (then the running one) and choose between the two as measured. Like the
        model's first choice in any plan it is no exploring step: the job would
        run it. Nothing else measures it while the network holds still: the
        default lab's first exploration (no network known yet) timed dense,
        bf16 and PowerSGD, and the job ran bf16 at 250 ms a step through a
        20 Mbit/s phase with Top-k predicted at 7 ms and within the budget.
        True when it started measuring."""
        current = self._current_row(rows)
        if current is None or any(r.gain is None for r in rows):
            return False
        # The rule's first choice, else the reference as a user runs it: within the
        # budget by definition (the short lab timed Top-k 0.033 on three collectives,
        # over the budget as delivered, and ran bf16 at 10 Mbit/s, never Top-k 0.1).
        reference = [r for r in rows if r.label == self._reference_label]
        # Ahead of the running option both as measured and as the model puts it:
        # against its measured median alone, AR-Topk was put at a sync of ~1 ms on a
        # steady 100 Mbit/s link where AllGather Top-k's took 4 ms (the model put
        # them at 2.4), and looked at one collective after another (2-3 looks per
        # 1,000 steps).
        modelled = self._current_row(self.evaluate(predicted=True)) or current
        best = next((r for r in [self.best(rows), *reference] if not r.measured and r.label != current.label
                     and not any(self._close(c, r, rows, max(UNTIMED_MARGIN, self._margin(c, r)))
                                 for c in (current, self._as_modelled_beside(modelled, r)))), None)
        if best is None:
            return False
        self._measure_both(best.label, current.label,
                           f"the model puts {best.label} ahead at {best.t_step_s:.3g} s a step, untimed",
                           shown=current.t_sync_s if current.measured else None)
        return True

    def _measure_a_thinly_timed_saver(self, rows: list[Evaluation]) -> bool:
        """When an option that loses less than the running one was timed on this
        network on 1 to RUNNING_SAMPLES - 1 steps, and the rule would choose it
        at the model's figure beside the others as they stand (the running one
        as measured), run it again: its few steps, not the model, keep it out,
        and one step on this host is a coin toss (a sync's steps spread +-30%,
        with outliers of 2-3x). The lm lab timed bf16 on its first 1 Gbit/s
        look at 69 and 52 ms a sync (31 ms steady) against PowerSGD rank 4's
        median of five, and ran rank 4 through the fast phases; the tight
        target, which bf16 reaches, slipped. Each run adds its steps, so an
        option is run at most until its figure rests on RUNNING_SAMPLES. An
        untimed one is `_measure_an_untimed_first_choice`'s, with its margin:
        taken at the model's word, the decision churn bench's steady link saw
        3 looks per 1,000 steps. True when it started."""
        current = self._current_row(rows)
        if current is None or not current.measured or any(r.gain is None for r in rows):
            return False
        by_label = {r.label: r for r in self.evaluate(predicted=True)}
        for row in sorted(rows, key=lambda r: (r.error, r.t_step_s, r.option)):
            model, runs = by_label.get(row.label), len(self._s.sync.get(row.label, ()))
            if row.error >= current.error or model is None or not 0 < runs < RUNNING_SAMPLES:
                continue
            if self.best([model if r is row else r for r in rows]).label == row.label:
                self._measure_both(row.label, current.label,
                                   f"{row.label} timed on {runs} step{'' if runs == 1 else 's'} only: "
                                   f"{row.t_step_s:.3g} s a step measured, "
                                   f"{model.t_step_s:.3g} s modelled", shown=current.t_sync_s)
                return True
        return False

    def _as_modelled_beside(self, running: Evaluation, untimed: Evaluation) -> Evaluation:
        """The running option's model row on the footing of `untimed`'s: the
        uncalibrated model's figure where nothing calibrated `untimed`'s
        collective, so that neither carries a host correction the other lacks.
        Calibrated against raw, on the churn bench's steady 100 Mbit/s link
        beside two CPU hogs, PowerSGD rank 4 (6.4 ms a step measured, 8.9
        modelled) looked twice as slow as Top-k 0.033 over the AR ring, never
        run, put at 3.2 ms; it was looked at, then over the tree: 2 looks per
        1,000 steps. Raw beside raw, rank 4 is at 4.0 ms."""
        key = calibration_key(untimed.option.compression, untimed.option.collective)
        return running if self.calibration.observations(key) else uncalibrated(running)

    def _measure_both(self, first: str, running: str, why: str, *, shown: float | None = None) -> None:
        """Run `first`, then `running`, and choose between them as measured. No
        exploring step: the job would run either. `shown`: the running option's
        sync on this network, as its latest steps showed it; then it is not run
        again."""
        s = self._s
        self._new_plan([(first, False)] + ([(running, False)] if shown is None else []), why)
        if shown is not None and running not in s.sync:
            s.sync[running] = [shown]
        self._measure_plan()

    def _lossy_sync_fell(self) -> float:
        """How far the running lossy option's sync fell (per second of compute)
        below where it settled, when past the margin, else 0: the link got
        faster, and a lossless option, cheap on a fast link, is worth measuring.
        A sync of no more than a link's burst (BURST_BYTES, as the agent's
        estimator) says nothing of the link: on a steady 100 Mbit/s link with two
        CPU hogs, Top-k syncs of 27 KB moved 2-12 ms, and five of the decision
        churn bench's 13 explorations per 1,000 steps started on such "falls"."""
        cur = self._s.current
        if cur is None or not cur.compression.lossy:
            return 0.0
        net = self._net()
        if net is not None and self._terms(cur.choice, net.nodes)[1] <= BURST_BYTES:
            return 0.0
        fell = self.watch.fell()
        return fell if fell > max(self.config.hysteresis, SYNC_FELL) else 0.0

    def _reconsider(self, why: str) -> None:
        """The network moved: explore again only if the model, under the network
        as it now is, puts another option ahead of the running one by more than
        the margin; else keep the choice and re-base on what it now measures."""
        s = self._s
        rows = self.evaluate(predicted=True)
        current = next((r for r in rows if r.label == self._current_label()), None)
        if not rows or current is None:
            self._start_exploration(why)
            return
        if not current.option.lossless and self.watch.got_faster(self._net()):
            self._start_exploration(f"{why}; measuring lossless options on the faster link")
            return
        best = self.best(rows)
        # Only the margin on each objective holds here, not the one on the ASF score:
        # the network did change, and the first choice after it is free of that.
        margin = self._margin(current, best)
        if best.label == current.label:
            self._keep_running(current.t_sync_s)
            s.current = replace(s.current, reason=f"{why}; keeping {current.label}: still the best by the model")
        elif self._close(current, best, rows, margin):
            # Too close for the model to call on a network nothing ran on yet: the
            # short lab kept bf16 through 10 Mbit/s at 1.27x the step of Top-k 0.1,
            # which the model rated within its margin and nothing measured there.
            shown = self._running_shows_the_move()
            self._rebase()
            self._measure_both(best.label, current.label,
                               f"{why}; {best.label} and {current.label} too close to call: measuring "
                               f"{'both' if shown is None else best.label}", shown=shown)
        else:
            self._start_exploration(f"{why}; the model now prefers {best.label}", running_free=False)

    def _running_shows_the_move(self) -> float | None:
        """The running option's sync on the network just observed, where its latest
        steps already ran on it: the median of its latest syncs, taken from the
        last back while each is nearer (as a ratio) what the calibrated model puts
        the option at on this network than on the one it settled on, when
        SHOWN_SAMPLES or more are (a move its own syncs showed; the agent hands the
        policy the network a report message shows before that message's steps,
        so the last syncs may not have reached it yet). The cnn lab's bf16 ran 5
        steps at 0.43-0.54 s as the link fell to 20 Mbit/s, and the exploration
        the fall started ran it 4 more beside PowerSGD rank 4 at 0.11-0.16 s.
        Where the syncs themselves moved the estimate, one is enough: the
        estimator took two or more, and the message that moved it (whose last
        sync the policy has not seen) made bf16 run 3 more 0.45 s steps so."""
        w, net, option = self.watch, self._net(), self._by_label.get(self._current_label() or "")
        if net is None or option is None or w.alpha_s is None or w.beta_s_per_byte is None:
            return None
        before = replace(net, alpha_s=w.alpha_s, beta_s_per_byte=w.beta_s_per_byte)
        terms, key = self._terms(option, net.nodes), calibration_key(option.compression, option.collective)
        now, then = (self.calibration.apply(key, link_time(terms, n)) for n in (net, before))
        if min(now, then) <= 0:
            return None
        shown = list(itertools.takewhile(
            lambda t: t > 0 and abs(math.log(t / now)) < abs(math.log(t / then)), reversed(w.running_sync)))
        needed = 1 if net.evidence in (SYNC, SYNC_BOUND) else SHOWN_SAMPLES
        return statistics.median(shown) if len(shown) >= needed else None

    def _keep_running(self, predicted_sync: float | None) -> None:
        """Carry on with the running option, judged on the model's
        `predicted_sync` until its own steps on the network as it now is give
        its figure."""
        s = self._s
        s.sync = {}
        self.watch.chose(self._current_label(), predicted_sync, predicted=True)
        self._rebase()

    def _start_exploration(self, why: str, *, with_lossless: bool = False, running_free: bool = True) -> None:
        """Measure a new plan. `running_free`: the job would run on the running
        option had nothing moved; not so where the model now puts another ahead
        of it by more than the margin, or where it is an exploring item."""
        s = self._s
        shown = self._running_shows_the_move()
        running = self._current_label() if shown is not None else None
        with_lossless = with_lossless or self.watch.got_faster(self._net())
        self._new_plan(self._exploration_plan(with_lossless, measured=running, running_free=running_free), why)
        s.sync = {} if running is None else {running: [shown]}
        self._rebase()  # what a move during the exploration is judged against
        if not self.plan.items:  # nothing to predict with and no exploring left: stay
            s.phase = EXPLOIT
            s.current = replace(s.current, reason=f"{why}; exploring budget spent: staying")
            return
        self._measure_plan()

    def _replan_blind_rest(self) -> None:
        """The network is known, and an exploration planned blind goes on: what it
        has run stays measured, and the rest is planned as the model would plan it
        now (its first choice, free; nothing beyond explore_prune of it or outdone
        on its own collective). The default lab's blind plan ran dense after bf16
        at 20 Mbit/s, 500 ms a step for 4 steps, with the network known from its
        third step; dropping dense alone left the model's first choice, PowerSGD,
        unplanned, and Top-k 0.1 ran 14 steps at 220 ms until a look found it."""
        self.plan.replan_rest(self._exploration_plan(False), self.config.explore_max)

    def _new_plan(self, plan: list[tuple[str, bool]], why: str) -> None:
        """Plan to measure `plan` from its first item, for `why`. The last plan's
        explored options stay charged while the job runs them on until its next
        agreement."""
        self.exploring.plan_started()
        self.plan.start(plan, why)

    def _measure_plan(self) -> None:
        self._s.phase = EXPLORE
        self._run_plan_item()

    def _explore_allowance(self) -> int:
        return self.exploring.allowance(self.config.explore_share, self.config.explore_horizon)

    def _item_cost(self) -> float:
        return self.exploring.item_cost(self.config.explore_steps)

    def _budget_covers_an_item(self) -> bool:
        return self._explore_allowance() >= self._item_cost()

    def _exploration_plan(self, with_lossless: bool, measured: str | None = None,
                          running_free: bool = True) -> list[tuple[str, bool]]:
        """What to measure, as (label, exploring) pairs: the option the model ranks
        first, the running one (where `running_free`) and the reference until it
        has delivered a figure cost nothing (the job would run them anyway); the
        running one is left out where `measured` (its steps ran on this network
        already) unless it is the model's first; the next ones, within
        explore_prune of the first choice's predicted step, as many as
        explore_max and the exploring share allow. With the budget spent, only
        the free ones: the policy runs what the model predicts best and stays."""
        cfg = self.config
        rows = self.evaluate(predicted=True)
        if not rows:  # no network to predict with: one option per family, the reference for its own, second
            rows = [Evaluation(o, 0.0, 0.0, 0.0, None, False) for o in self._blind_picks()]
            free = {self._current_label(), self._reference_label}
        else:
            rows, free = self._planned_rows(self.ranking(rows), with_lossless, running_free)
            rows = [r for r in rows if r.label != measured or r is rows[0]]
        budget, cost = self._explore_allowance(), self._item_cost()
        plan: list[tuple[str, bool]] = []
        for r in rows:
            exploring = r.label not in free
            if exploring and budget < cost:
                continue
            plan.append((r.label, exploring))
            budget -= cost * exploring
            if len(plan) >= cfg.explore_max:
                break
        # The free items first: a change of option among them shows how many steps
        # the job takes to adopt a decision before any explored item is charged
        # (sorted() keeps the ranking within each part).
        return sorted(plan, key=lambda item: item[1])

    def _planned_rows(self, ranked: list[Evaluation], with_lossless: bool,
                      running_free: bool) -> tuple[list[Evaluation], set[str]]:
        """With a network known: the rows an exploration may measure, best first,
        and the labels among them that are free. The running option is free only
        where `running_free`: after the cnn lab's falls to 20 Mbit/s, bf16 ran on
        free beside the model's first choice, 4-5 steps at 0.45-0.55 s where
        PowerSGD took 0.15, with the exploring budget spent."""
        rows = [r for r in ranked if r is ranked[0] or self._may_beat(r, ranked[0])]
        if with_lossless:
            rows = with_best_lossless(rows, ranked)
        free = {rows[0].label} | ({self._current_label()} if running_free else set())
        if self._reference_label not in self.gains.delivered:
            # Run for its delivered error, which the budget needs once (a moved
            # network does not change it: the cnn's MOO re-ran Top-k 0.1 over
            # AllGather at 20 Mbit/s after each move, 190 ms a sync where PowerSGD
            # took 40), unless it is far behind a family's reference: then not
            # at all until a network makes it cheap.
            if self._reference_far_behind():
                rows = [r for r in rows if r.label != self._reference_label]
            else:
                rows = with_second(rows, next((r for r in ranked if r.label == self._reference_label), None))
                free.add(self._reference_label)
        # An option another one outdoes on its own collective could not be chosen:
        # the default lab's first exploration ran dense beside bf16 on the ring at
        # 20 Mbit/s, 500 ms a step for 4 steps (2 s of a 14 s run to the target).
        return [r for r in rows if r.label in free or not outdone(r, rows)], free

    def _may_beat(self, row: Evaluation, first: Evaluation) -> bool:
        """Whether measuring `row` could show it ahead of the model's `first`
        choice: predicted within `explore_prune` of its step and, where both
        figures come from calibrated fits, within what their errors allow (`row`'s
        sync as much faster, `first`'s as much slower, as their fits are off), and
        by the budget's rule, what its error is worth (`error_price`: a lossier
        `row` must save that much more of the step, a less lossy one may be that
        much slower). In the cnn lab the fall to 20 Mbit/s explored Top-k 0.1
        over an AR collective, put at twice PowerSGD rank 4's 0.15 s, for 4-5
        steps at 0.29-0.40 s."""
        if row.t_step_s > first.t_step_s * self.config.explore_prune:
            return False
        if not (self._fit_is_calibrated(row) and self._fit_is_calibrated(first)):
            return True
        row_err, first_err = self._fit_error(row), self._fit_error(first)
        hopeful = replace(row, t_step_s=row.t_step_s - row.t_sync_s * row_err / (1 + row_err))
        fearful = replace(first, t_step_s=first.t_step_s + first.t_sync_s * first_err)
        if row.gain is None or first.gain is None or self.config.objective != "budget":
            return hopeful.t_step_s <= fearful.t_step_s * (1 + self.config.hysteresis)
        if row.error <= first.error:  # as good where it is no slower than its saving is worth
            return worth_its_error(hopeful, fearful, self.config.hysteresis, self.error_price())
        # a lossier row must save what the error it adds is worth
        worth = share_left(self.error_price(), row.error - first.error)
        return hopeful.t_step_s <= fearful.t_step_s * (1 + self.config.hysteresis) * worth

    def _blind_picks(self) -> list[Choice]:
        """What an exploration with no network known measures: each family's first
        option, the reference as a user runs it for its family (the job would run
        it anyway, and it is the warm-up's option; blind, the decision churn bench
        timed dense, bf16 and PowerSGD, then looked at two Top-k options one after
        the other)."""
        firsts = {o.compression.family: o for o in reversed(self.options)}
        running = self._s.current.compression.family if self._s.current else None
        reference = self._reference_choice
        if reference is None:
            return sorted(reversed(firsts.values()), key=lambda o: o.compression.family != running)
        others = sorted((o for family, o in reversed(firsts.items()) if family != reference.compression.family),
                        key=lambda o: o.compression.family != running)  # the running family's first: it is free
        return [others[0], reference, *others[1:]] if others else [reference]

    def _run_plan_item(self) -> None:
        plan = self.plan
        # An explored item is charged again as it starts: the steps a decision takes
        # to be adopted are known once the plan's first item has been adopted.
        while (item := plan.item()) is not None and item[1] and not self._budget_covers_an_item():
            plan.next()
        if item is None:
            self._finish_exploration()
            return
        label, exploring = item
        option = next(o for o in self.options if o.label == label)
        if exploring:
            self.exploring.item_started()
        self._set_current(option, plan.describe(), exploring=exploring)

    def _finish_exploration(self) -> None:
        """Choose among what was measured; then, while the rule puts an untimed
        option far ahead of that choice, look at it at once (each look times one
        more option, so the chain ends). Waiting LOOK_AGAIN_STEPS for each look, a
        short lab ran bf16 at 0.32 s a step through most of a 10 Mbit/s phase,
        looking at one untimed option per 10 steps, with PowerSGD rank 4 (0.03 s,
        within the budget) never reached."""
        s = self._s
        s.phase = EXPLOIT
        last = s.current
        s.current = None  # the first choice after exploring is free of hysteresis
        self._choose()
        if last is not None and last.exploring and self._current_label() == last.label:
            self.exploring.kept_item()
        self._rebase()
        if not self._running_off_model():
            self._measure_an_untimed_first_choice(self.evaluate())

    def _rebase(self) -> None:
        net = self._net()
        self.watch.settle_on(net)

    def _choose(self) -> None:
        rows = self.evaluate()
        if not rows:  # nothing measured and no network: stay where we are
            if self._s.current is None:
                self._set_current(self._warmup_option(), "nothing measured and no network known")
            return
        off_model = self._running_off_model()
        if not off_model and self._look_due() and (self._measure_an_untimed_first_choice(rows)
                                                   or self._measure_a_thinly_timed_saver(rows)):
            return
        rows, best = self._best_trusted(rows, predictions=not off_model)
        current = self._current_row(rows)
        if current is None and self._s.current is not None:
            # The running option has no figure on this network yet and no trusted
            # prediction: its own steps are timing it. Left now, the choice was
            # made among what the network's move left timed, or what straggled in
            # after it: the short lab kept PowerSGD rank 4 at the link's fall and
            # then took bf16, timed at 0.32 s a step by its last steps before rank
            # 4 was adopted, over it (rank 4 ran 0.07 s there).
            return
        if current is not None and current != best:
            settled = self._as_settled(current)
            compared = [settled if r is current else r for r in rows]
            if self._not_worth_switching(settled, best, compared, self._margin(settled, best)):
                return
        if current != best:
            self._set_current(best.option, self.explain(best, self.evaluate(), leaving=current), best)

    def _as_settled(self, current: Evaluation) -> Evaluation:
        """The running option's row with its step credited how far its sync moved,
        either way, from where its first steps settled: the figures it is compared
        with were taken before, and what moved it (a link or host the estimator has
        not judged yet) moves them too. Time only: a move of its sync says nothing
        of its gain. (On the cnn lab's fall to 20 Mbit/s PowerSGD rank 4's steps
        slowed 0.110 -> 0.124 s and the job left it for Top-k 0.1, timed at 0.117 s
        on the fast link, for 6 steps at 0.35-0.62 s.)"""
        drift = self.watch.drift_s()
        return replace(current, t_step_s=current.t_step_s - drift) if drift else current

    def _running_off_model(self) -> bool:
        """The running option's latest steps are calibration outliers: far off what
        the model puts it at on the network the policy knows, so that network is
        not the one the job runs on (a move the estimator has not judged yet).
        Then nothing is chosen on the model's word, neither a look at an untimed
        option nor a trusted prediction; measured figures still may be (the
        switch credits the running option its drift). That lasts until the
        estimator's move reaches observe_network, the steps agree with the model
        again, or the fit starts over (CALIBRATION_RESET). The short lab looked
        at bf16, put at 7 ms a step on the fast link's figure, two steps after
        the link fell 100x: it ran 0.37 s a step there, and the move then
        detected dropped that figure, so bf16 was run again."""
        running = self._by_label.get(self.watch.running or "")  # s.current, or the item an exploration ended on
        return running is not None and self.outliers.outlying(calibration_key(running.compression, running.collective))

    def _look_due(self) -> bool:
        """Whether to look for an untimed option now: once per LOOK_AGAIN_STEPS
        steps of a choice, at a decision. At a decision, not per report: the agent
        decides once per report message, and looking every tenth report of a
        256-report message was a third of its ingest (the model moves little
        within one message)."""
        s = self._s
        if s.phase_steps < max(s.next_look, LOOK_AGAIN_STEPS):
            return False
        s.next_look = s.phase_steps + LOOK_AGAIN_STEPS
        return True

    def _best_trusted(self, rows: list[Evaluation], *, predictions: bool = True) -> tuple[list[Evaluation], Evaluation]:
        """The rows a choice may be made among, and the best of them: what was
        measured since the network last changed, and, with `predictions`, an
        option priced without running it, predicted by a calibrated fit
        (PREDICTION_TRUSTED pairs: bf16 over the ring once dense has run there)
        when it beats the best measured by more than that fit's error. Priced
        without running here: what `_priced_unrun` says. Measured options
        only: the job alternated between the two it had timed (dense, Top-k
        0.033) with bf16 predicted at half dense's step; and the cnn's MOO ran
        Top-k 0.1 at 0.42 s a step through a 20 Mbit/s phase with PowerSGD rank
        4, priced at the reference's error, predicted at 0.11 s. Any
        prediction: a stale or uncalibrated model pulled the job onto options
        nobody had timed."""
        measured = [r for r in rows if r.measured]
        if not measured:
            return rows, self.best(rows)
        best = self.best(measured)
        if not predictions:
            return measured, best
        reference_error = self._reference_error()
        trusted = [r for r in rows if r.measured or (
            self._priced_unrun(r.option, reference_error) and self._fit_is_calibrated(r))]
        challenger = self.best(trusted)
        if challenger.measured or self._close(best, challenger, trusted, self._margin(challenger)):
            return measured, best
        return trusted, challenger

    def _priced_unrun(self, option: Choice, reference_error: float | None) -> bool:
        """Whether `option`'s gain is known without running it on this network: a
        lossless option's (its figures are its sync alone), one of a family priced
        by its probes (PowerSGD's ranks), and what an option delivered where it
        ran before (a gain does not move with the link). Any other lossy option's
        is known only once it runs, so it is measured first. The short lab ran
        bf16 at 0.31 s a step after the link fell, with Top-k 0.1 over AllGather,
        which had delivered its figure on the fast link, predicted faster by a
        calibrated fit and never re-run."""
        return (option.lossless or option.label in self.gains.delivered
                or self._family_priced(option, reference_error) is not None)

    def _fit_is_calibrated(self, row: Evaluation) -> bool:
        """The fit has PREDICTION_TRUSTED pairs and its latest steps agree with it:
        steps far off its prediction (outliers, not yet learned) mean the network
        it predicts on is not the one the job runs on (the short lab chose dense,
        predicted at 75 ms from a stale fast link, where bf16 had just run 311 ms)."""
        key = calibration_key(row.option.compression, row.option.collective)
        return self.calibration.observations(key) >= PREDICTION_TRUSTED and not self.outliers.outlying(key)

    def _margin(self, *rows: Evaluation) -> float:
        """How much better an option must look to switch to it: the hysteresis, or
        more where a compared figure is a prediction, the current error of the fit
        that predicted it. Only the two fits compared count: one poor fit of an
        option not in question (the lab had one at 0.80) must not freeze every
        switch."""
        errors = [self._fit_error(r) for r in rows if not r.measured]
        return max([self.config.hysteresis, *errors])

    def _fit_error(self, row: Evaluation) -> float:
        """The current relative error of the fit that predicts `row`'s sync."""
        return self.calibration.error(calibration_key(row.option.compression, row.option.collective))

    def _not_worth_switching(self, current: Evaluation, best: Evaluation, rows: list[Evaluation],
                             margin: float) -> bool:
        """Stay when `current` is within `margin` of `best` on both objectives or,
        choosing by ASF, on the ASF score itself: two options far apart on the
        front can score alike, and smoothed gains drifting by a few percent then
        swapped them every few steps. Choosing by the error budget, within
        `margin` of its cost."""
        if self._close(current, best, rows, margin):
            return True
        if self.config.objective != "asf" or any(r.gain is None for r in rows):
            return False
        # Over every row, the ideal point is the front's, so these are choose()'s scores.
        scores = self._asf([objectives(r) for r in rows])
        return scores[rows.index(current)] <= scores[rows.index(best)] + margin

    def _close(self, current: Evaluation, best: Evaluation, rows: list[Evaluation], margin: float) -> bool:
        """Not worth a switch: by the budget's cost when choosing by it (and the
        gains are known), else on both objectives."""
        allowance = self._allowance()
        if self.config.objective == "budget" and allowance is not None and all(r.gain is not None for r in rows):
            # Within the allowance and the running option's band, or losing no more than the best.
            ref = self._reference_error()
            limit = max(min(allowance + ERROR_BAND * ref, error_cap(ref)), best.error)
            in_band = current.error <= limit * (1 + margin)
            return (in_band and current.t_step_s <= best.t_step_s * (1 + margin)
                    and not self._saves(best, current, ref))
        return within(current, best, margin)

    def _saves(self, best: Evaluation, current: Evaluation, reference_error: float) -> bool:
        """Whether `best` is as quick as `current` (within half the hysteresis,
        half the tie band choose() uses) and loses ERROR_BAND of the reference's
        error less: the budget's saving, which choose() makes and the switch must
        not refuse. Refused, the lm lab ran PowerSGD rank 4 (134 ms a step measured)
        through a 1 Gbit/s phase with bf16 predicted at 135 ms, and Top-k 0.1 for
        62 steps where bf16, once run, took 154 ms to Top-k's 180: the tight
        target slipped. Half: the saver is left for speed only beyond the whole
        band, so between the two the running option stays (at the band's edge,
        bf16 at 4.7-5.0% over rank 4's step, the lm lab switched six times in 6 s),
        though choose() would run the saver there (a move then measures both)."""
        quicker = worth_its_error(best, current, self.config.hysteresis / 2, self.error_price() / 2)
        return quicker and best.error < current.error - ERROR_BAND * reference_error

    def _current_row(self, rows: list[Evaluation]) -> Evaluation | None:
        label = self._current_label()
        return next((r for r in rows if r.label == label), None)

    def _set_current(self, option: Choice, reason: str, row: Evaluation | None = None, *,
                     exploring: bool = False) -> None:
        s = self._s
        if s.current and self._current_label() == option.label:
            s.current = replace(s.current, reason=reason, exploring=exploring)
            return
        s.version += 1
        s.phase_steps = s.next_look = 0
        self.exploring.decision_changed(option.label)
        # What the choice was made on, measured or predicted: it stands for the
        # option until its own steps give a figure. Left on its first steps' mean
        # instead, the cnn lab's PowerSGD rank 4, chosen on a 0.11 s prediction,
        # was left after 4 steps (0.17 s as the link began to fall) for bf16,
        # timed before, which then ran 0.6 s a step at 20 Mbit/s.
        self.watch.chose(option.label, row.t_sync_s if row is not None else None,
                         predicted=row is not None and not row.measured)
        s.current = Decision.of(
            option, root=self.config.root, version=s.version,
            predicted_sync_s=row.t_sync_s if row else 0.0,
            predicted_comp_s=row.t_comp_s if row else 0.0,
            reason=reason, probes=self.probes, model_forms=self.forms.describe(), exploring=exploring,
        )

    def explain(self, best: Evaluation, rows: list[Evaluation], leaving: Evaluation | None = None) -> str:
        """Why `best`: its figures (measured or predicted), the runner-up of each
        other family, and the running option it replaces (`leaving`) with its own
        figures: a cnn job left PowerSGD rank 4 at 0.13 s a step for Top-k 0.1 at
        0.37 s, and the runners-up listed did not say why."""
        def figures(r: Evaluation) -> str:
            gain = "" if r.gain is None else f", gain {r.gain:.2f}"
            return f"{r.t_step_s:.4g} s {'measured' if r.measured else 'predicted'}{gain}"

        others = []
        for family in FAMILIES:
            if family == best.option.compression.family:
                continue
            mine = [r for r in rows if r.option.compression.family == family]
            if mine:
                r = min(mine, key=lambda r: (r.t_step_s, r.option))
                others.append(f"{r.label} {figures(r)}")
        if best.gain is None:
            basis = "time only (gains unknown)"
        elif self.config.objective == "budget":
            basis = self._explain_budget(best)
        else:
            basis = f"{self.config.objective} on the Pareto front"
        vs = f"; vs {', '.join(others)}" if others else ""
        left = ""
        if leaving is not None and leaving.label != best.label:
            error = "" if leaving.gain is None else f", error {1 - leaving.gain:.2f}"
            left = f"; leaving {leaving.label} {figures(leaving)}{error}"
        return (f"{best.label}: step {figures(best)} (sync {best.t_sync_s:.3g} s, comp {best.t_comp_s:.3g} s)"
                f"{vs}{left}; {basis}")

    def _explain_budget(self, best: Evaluation) -> str:
        """The budget rule in its own terms: the fastest option within the error
        a step may deliver, that allowance set by the reference and what the run
        saved or overspent."""
        allowance, ref_error = self._allowance(), self._reference_error()
        ref = f"reference {self.reference.name}" + (f" (error {ref_error:.2f})" if ref_error is not None else "")
        spent = (f"{self.budget.spent / self.budget.allowed:.0%} of the reference's error spent over "
                 f"{self.budget.steps} steps" if self.budget.allowed > 0 else "nothing spent yet")
        allowed = f"{allowance:.2f}" if allowance is not None else "unknown"
        price, dear = self.error_price(), self._s.dear
        worth = (f"; a reference's error spent where it saves {price * ref_error:.0%} of a step ({PRICE_SHARE:.0%} "
                 f"of what it saves at {dear.bandwidth_bps / 1e6:.4g} Mbit/s)" if price and ref_error and dear else "")
        critical = (f" in a {self.regime.describe()}, {self.config.critical_share:.0%} of the reference's error "
                    "at most") if self.regime.critical else ""
        return (f"fastest within the error allowance {allowed}{critical} (error {1 - (best.gain or 0):.2f}){worth}; "
                f"{ref}, {spent}")


__all__ = ["EXPLOIT", "EXPLORE", "WARMUP", "Evaluation", "MooConfig", "MooPolicy", "candidate_crs"]
