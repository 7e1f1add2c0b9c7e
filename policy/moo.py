"""The multi-objective policy (DESIGN.md section 5, after Tyagi & Swany 2023).

Candidates are (cr, collective) pairs: each CR of the geometric grid from c_high
down to c_low on each Top-k collective, plus dense AllReduce (cr = 1). Each
candidate has two objectives, both minimised: the step time t_step = t_compute +
t_comp(cr) + t_sync(cr, collective) and 1 / gain(cr). The Pareto front over them
is computed exactly and the choice on it is made by an achievement scalarising
function (weights time/gain, default 0.6/0.4) or by "progress per second",
gain / t_step.

Where each figure comes from:
- t_sync: measured for the candidates run since the network last changed;
  otherwise the calibrated alpha-beta model (policy.costmodel).
- t_comp: measured per CR when that CR has run, else the model scaled by what
  the measured CRs say about this machine.
- gain: reported for every CR on every step (the client reads the gains of all
  candidate CRs off one gradient), smoothed; dense has gain 1.

Phases: warm-up (dense, to measure compute and dense sync time), exploration
(run the promising candidates a few steps each, in the live run with error
feedback), exploitation. Exploration starts again when alpha, beta or the
chosen CR's gain moves by >= change_threshold from what the last exploration
saw. A switch needs the new choice to beat the current one by more than the
hysteresis margin (at least the model's current relative error), so near-equal
candidates do not flap.

Pure and deterministic: same calls, same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from flexcomm.policy import pareto
from flexcomm.policy.costmodel import Calibration, CompressionCost, ModelForms, sync_time
from flexcomm.policy.types import (
    AG_TOPK,
    ART_RING,
    ART_TREE,
    DENSE_COLLECTIVES,
    DENSE_RING,
    ROOT_STAR,
    SPARSE_COLLECTIVES,
    Decision,
    NetworkObservation,
    StepReport,
    check_collective,
    check_cr,
    check_known_options,
    check_range,
    check_root,
)

WARMUP, EXPLORE, EXPLOIT = "warmup", "explore", "exploit"
OBJECTIVES = ("asf", "progress")


def candidate_crs(c_low: float, c_high: float, factor: float) -> tuple[float, ...]:
    """c_high, c_high/factor, ... ending at c_low, rounded to c_low's decimal
    precision: (0.001, 0.1, 3) -> (0.1, 0.033, 0.011, 0.004, 0.001)."""
    check_cr(c_low, "c_low")
    check_cr(c_high, "c_high")
    if c_low > c_high:
        raise ValueError(f"c_low: must be <= c_high ({c_high}), got {c_low}")
    if not (factor > 1.0 and math.isfinite(factor)):
        raise ValueError(f"factor: must be a finite number > 1, got {factor!r}")
    steps = max(0, round(math.log(c_high / c_low) / math.log(factor)))
    decimals = max(0, -math.floor(math.log10(c_low)))
    crs = [round(c_high / factor**i, decimals) for i in range(steps)] + [c_low]
    out: list[float] = []
    for c in crs:
        if c > 0 and c not in out:
            out.append(c)
    return tuple(sorted(out, reverse=True))


@dataclass(frozen=True)
class MooConfig:
    c_low: float = 0.001
    c_high: float = 0.1
    factor: float = 3.0
    collectives: tuple[str, ...] = (AG_TOPK, ART_RING, ART_TREE)
    dense_collectives: tuple[str, ...] = (DENSE_RING,)
    objective: str = "asf"
    weight_time: float = 0.6
    weight_gain: float = 0.4
    change_threshold: float = 0.10
    reexplore_on_gain: bool = False
    sync_change_threshold: float = 0.5
    sync_change_steps: int = 3
    alpha_floor_s: float = 1e-4
    hysteresis: float = 0.05
    warmup_steps: int = 3
    explore_steps: int = 2
    explore_prune: float = 4.0
    min_exploit_steps: int = 10
    smoothing: float = 0.3
    gain_smoothing: float = 0.05
    root: str = ROOT_STAR
    ag_form: str = "paper"
    tree_form: str = "paper"
    value_bytes: int = 4
    index_bytes: int = 4
    comp_per_byte: float = CompressionCost.per_byte
    comp_per_selected_byte: float = CompressionCost.per_selected_byte

    def __post_init__(self) -> None:
        candidate_crs(self.c_low, self.c_high, self.factor)
        for c in self.collectives:
            check_collective(c, "collectives")
            if c not in SPARSE_COLLECTIVES:
                raise ValueError(f"collectives: {c!r} is not a Top-k collective")
        for c in self.dense_collectives:
            check_collective(c, "dense_collectives")
            if c not in DENSE_COLLECTIVES:
                raise ValueError(f"dense_collectives: {c!r} is not a dense collective")
        if not self.collectives and not self.dense_collectives:
            raise ValueError("collectives: at least one collective is needed")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective: unknown objective {self.objective!r} (one of asf, progress)")
        check_root(self.root)
        check_range("weight_time", self.weight_time, 0, 1)
        check_range("weight_gain", self.weight_gain, 0, 1)
        if self.weight_time + self.weight_gain <= 0:
            raise ValueError("weight_time: weights must not both be 0")
        check_range("change_threshold", self.change_threshold, 0, 10, open_low=True)
        check_range("sync_change_threshold", self.sync_change_threshold, 0, 100, open_low=True)
        if not isinstance(self.reexplore_on_gain, bool):
            raise ValueError(f"reexplore_on_gain: must be true or false, got {self.reexplore_on_gain!r}")
        check_range("alpha_floor_s", self.alpha_floor_s, 0, 10)
        check_range("hysteresis", self.hysteresis, 0, 1)
        check_range("smoothing", self.smoothing, 0, 1, open_low=True)
        check_range("gain_smoothing", self.gain_smoothing, 0, 1, open_low=True)
        check_range("explore_prune", self.explore_prune, 1, 1e6)
        for name in ("warmup_steps", "explore_steps", "min_exploit_steps", "sync_change_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0 or (name == "explore_steps" and v < 1):
                raise ValueError(f"{name}: must be a whole number >= {1 if name == 'explore_steps' else 0}, got {v!r}")
        ModelForms(self.ag_form, self.tree_form, self.value_bytes, self.index_bytes)
        CompressionCost(self.comp_per_byte, self.comp_per_selected_byte)

    @cached_property
    def crs(self) -> tuple[float, ...]:
        return candidate_crs(self.c_low, self.c_high, self.factor)

    @cached_property
    def forms(self) -> ModelForms:
        return ModelForms(self.ag_form, self.tree_form, self.value_bytes, self.index_bytes)

    @cached_property
    def comp_cost(self) -> CompressionCost:
        return CompressionCost(self.comp_per_byte, self.comp_per_selected_byte)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> MooConfig:
        """Build from plain options (CLI, TOML, RPC); unknown keys are refused."""
        check_known_options(options, cls, "MOO")
        kw = dict(options)
        for key in ("collectives", "dense_collectives"):
            if key in kw:
                v = kw[key]
                kw[key] = tuple(v.split(",")) if isinstance(v, str) else tuple(v)
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["collectives"] = list(self.collectives)
        d["dense_collectives"] = list(self.dense_collectives)
        return d


@dataclass(frozen=True)
class Evaluation:
    """One candidate as the policy sees it now."""

    collective: str
    cr: float
    t_sync_s: float
    t_comp_s: float
    t_step_s: float
    gain: float | None
    measured: bool  # t_sync measured (True) or predicted by the calibrated model
    raw_sync_s: float | None = None  # the uncalibrated model's figure, when a network is known

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(collective: str, cr: float) -> str:
    return f"{collective}@{cr!r}"


@dataclass
class _State:
    phase: str = WARMUP
    phase_steps: int = 0
    plan: list[list[Any]] = field(default_factory=list)  # [[collective, cr], ...]
    plan_index: int = 0
    net: dict[str, Any] | None = None
    baseline: dict[str, float] | None = None
    t_compute: float | None = None
    t_comp: dict[str, float] = field(default_factory=dict)  # repr(cr) -> s
    gains: dict[str, float] = field(default_factory=dict)  # repr(cr) -> gain
    sync: dict[str, float] = field(default_factory=dict)  # key -> s, since the last change
    current: dict[str, Any] | None = None
    version: int = 0
    explorations: int = 0
    steps_seen: int = 0
    why: str = ""  # what started the current exploration
    sync_baseline: float | None = None  # the chosen option's settled sync time
    sync_moved_steps: int = 0  # consecutive steps it has stayed moved


class MooPolicy:
    """Multi-objective choice of (cr, collective); see the module docstring."""

    name = "moo"

    def __init__(self, grad_bytes: float, config: MooConfig | None = None) -> None:
        if not (isinstance(grad_bytes, (int, float)) and math.isfinite(grad_bytes) and grad_bytes > 0):
            raise ValueError(f"grad_bytes: must be finite and > 0, got {grad_bytes!r}")
        self.grad_bytes = float(grad_bytes)
        self.config = config or MooConfig()
        self.calibration = Calibration()
        self._s = _State()
        self._decision: Decision | None = None  # cached until an observation arrives
        collective, cr = self._options()[0]  # dense when allowed
        self._set_current(collective, cr, "warm-up: measuring compute and sync time")
        if self.config.warmup_steps == 0:
            self._start_exploration("first exploration")

    # --- observations --------------------------------------------------------

    def observe_network(self, net: NetworkObservation) -> None:
        self._decision = None
        self._s.net = net.to_dict()
        if self._s.phase == EXPLOIT and self._network_moved(net):
            self._start_exploration(self._network_change_reason(net))

    def observe_step(self, report: StepReport) -> None:
        s, cfg = self._s, self.config
        self._decision = None
        s.steps_seen += 1
        w = cfg.smoothing
        if report.t_compute_s > 0:
            s.t_compute = _ewma(s.t_compute, report.t_compute_s, w)
        # Gain is an expectation (E||g_c||^2 / E||g_e||^2); one step's swings 5x at
        # one CR on a small model, so it is smoothed far more than times are.
        gains = dict(report.gains)
        if report.collective in SPARSE_COLLECTIVES:
            gains.setdefault(report.cr, report.gain)
            s.t_comp[repr(report.cr)] = _ewma(s.t_comp.get(repr(report.cr)), report.t_comp_s, w)
        for cr, g in sorted(gains.items()):
            key = repr(float(cr))
            s.gains[key] = _ewma(s.gains.get(key), float(g), cfg.gain_smoothing)
        if report.t_sync_s > 0:
            key = _key(report.collective, report.cr)
            s.sync[key] = _ewma(s.sync.get(key), report.t_sync_s, w)
            net = self._net()
            if net is not None:
                raw = sync_time(report.collective, self.grad_bytes, report.cr, net, cfg.forms)
                if raw > 0:
                    self.calibration.observe(report.collective, raw, report.t_sync_s)
        if self._runs_current(report):
            s.phase_steps += 1
            self._advance()

    # --- decisions -----------------------------------------------------------

    def decide(self) -> Decision:
        """The current decision; re-evaluated only after a new observation, so
        an agent may call it on every request."""
        if self._decision is None:
            if self._s.phase == EXPLOIT:
                self._choose()
            self._decision = Decision.from_dict(self._s.current)
        return self._decision

    def evaluate(self) -> list[Evaluation]:
        """Every candidate with the figures the choice would use (skips candidates
        with no measured nor predictable sync time)."""
        s, cfg = self._s, self.config
        net = self._net()
        comp_scale = self._comp_scale()
        rows = []
        cur = s.current
        running = _key(cur["collective"], cur["cr"]) if cur else None
        for collective, cr in self._options():
            key = _key(collective, cr)
            raw = sync_time(collective, self.grad_bytes, cr, net, cfg.forms) if net else None
            if key == running and s.phase == EXPLOIT and s.sync_baseline is not None:
                # Only the running option gets fresh (noisy) figures; the others
                # keep their explored ones. Comparing them as equals lets one slow
                # step switch the job; the change detector judges moves instead.
                t_sync, measured = s.sync_baseline, True
            elif key in s.sync:
                t_sync, measured = s.sync[key], True
            elif raw is not None:
                t_sync, measured = self.calibration.apply(collective, raw), False
            else:
                continue
            t_comp = self._t_comp(cr, comp_scale)
            gain = 1.0 if cr == 1.0 else s.gains.get(repr(cr))
            t_step = (s.t_compute or 0.0) + t_comp + t_sync
            rows.append(Evaluation(collective, cr, t_sync, t_comp, t_step, gain, measured, raw))
        return rows

    def choose(self, rows: list[Evaluation]) -> Evaluation:
        """The choice among `rows` (no hysteresis): Pareto front, then ASF or
        progress. Unknown gains leave time as the only objective."""
        if not rows:
            raise ValueError("rows: nothing to choose from")
        if any(r.gain is None for r in rows):
            return min(rows, key=lambda r: (r.t_step_s, -r.cr, r.collective))
        points = [_objectives(r) for r in rows]
        front = pareto.pareto_front(points)
        if self.config.objective == "progress":
            return max((rows[i] for i in front), key=lambda r: (r.gain / r.t_step_s, r.cr))
        scores = self._asf([points[i] for i in front])
        best = min(range(len(front)), key=lambda j: (scores[j], points[front[j]][0]))
        return rows[front[best]]

    def _asf(self, points: list[tuple[float, float]]) -> list[float]:
        return pareto.asf_scores(points, (self.config.weight_time, self.config.weight_gain))

    def model_error(self) -> float | None:
        """The calibrated model's current relative error (worst collective)."""
        return self.calibration.error()

    # --- persistence ---------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.name,
            "grad_bytes": self.grad_bytes,
            "config": self.config.to_dict(),
            "calibration": self.calibration.state_dict(),
            "state": asdict(self._s),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.grad_bytes = float(state["grad_bytes"])
        self.config = MooConfig.from_options(state["config"])
        self.calibration = Calibration.from_state(state["calibration"])
        self._s = _State(**state["state"])
        self._decision = None

    @property
    def phase(self) -> str:
        return self._s.phase

    @property
    def network(self) -> NetworkObservation | None:
        """The last network observation, if any."""
        return self._net()

    @property
    def explorations(self) -> int:
        return self._s.explorations

    # --- internals -----------------------------------------------------------

    def _net(self) -> NetworkObservation | None:
        return NetworkObservation(**self._s.net) if self._s.net else None

    def _options(self) -> list[tuple[str, float]]:
        dense = [(c, 1.0) for c in self.config.dense_collectives]
        return dense + [(c, cr) for cr in self.config.crs for c in self.config.collectives]

    def _comp_scale(self) -> float:
        """Measured over modelled t_comp, averaged over the CRs that ran."""
        model = self.config.comp_cost
        ratios = [v / model.seconds(self.grad_bytes, float(k)) for k, v in sorted(self._s.t_comp.items())
                  if model.seconds(self.grad_bytes, float(k)) > 0]
        return sum(ratios) / len(ratios) if ratios else 1.0

    def _t_comp(self, cr: float, scale: float) -> float:
        if cr == 1.0:
            return 0.0
        measured = self._s.t_comp.get(repr(cr))
        return measured if measured is not None else scale * self.config.comp_cost.seconds(self.grad_bytes, cr)

    def _runs_current(self, report: StepReport) -> bool:
        cur = self._s.current
        return cur is not None and report.collective == cur["collective"] and report.cr == cur["cr"]

    def _advance(self) -> None:
        s, cfg = self._s, self.config
        if s.phase == WARMUP and s.phase_steps >= cfg.warmup_steps:
            self._start_exploration("first exploration")
        elif s.phase == EXPLORE and s.phase_steps >= cfg.explore_steps:
            s.plan_index += 1
            self._run_plan_item()
        elif s.phase == EXPLOIT:
            # A moved sync time is checked every step: waiting would let decide()
            # wander among the other options' stale measurements.
            why = self._sync_moved()
            if not why and cfg.reexplore_on_gain and s.phase_steps >= cfg.min_exploit_steps:
                why = self._gain_moved()
            if why:
                self._start_exploration(why)

    def _sync_moved(self) -> str:
        """Passive change detection: the chosen option's smoothed sync time moved
        by >= sync_change_threshold from what it was chosen on (or, if chosen on
        a prediction, from where it settled). Probes are rare; steps are not."""
        s = self._s
        measured = s.sync.get(_key(s.current["collective"], s.current["cr"]))
        if measured is None:
            return ""
        if s.sync_baseline is None:  # chosen on a prediction: settle on what it measures
            if s.phase_steps >= self.config.explore_steps:
                s.sync_baseline = measured
            return ""
        moved = (measured - s.sync_baseline) / s.sync_baseline
        threshold = self.config.sync_change_threshold
        s.sync_moved_steps = s.sync_moved_steps + 1 if abs(moved) >= threshold else 0
        if not s.sync_moved_steps:  # within noise: follow slow drift
            s.sync_baseline += 0.05 * (measured - s.sync_baseline)
        # A link that changed stays changed; a loaded machine's noise does not.
        # Moves of three thresholds and more are taken at once.
        if s.sync_moved_steps < self.config.sync_change_steps and abs(moved) < 3 * threshold:
            return ""
        return f"measured sync time of the chosen option moved {moved:+.0%}"

    def _start_exploration(self, why: str) -> None:
        s = self._s
        s.explorations += 1
        s.sync = {}
        s.plan = [[c, cr] for c, cr in self._exploration_plan()]
        s.plan_index = 0
        s.phase = EXPLORE
        s.why = why
        self._run_plan_item()

    def _exploration_plan(self) -> list[tuple[str, float]]:
        cfg, net = self.config, self._net()
        options = self._options()
        if net is None:
            # Nothing to predict with: each CR on the first Top-k collective, and dense.
            first = cfg.collectives[0] if cfg.collectives else None
            plan = [o for o in options if o[1] == 1.0][:1]
            return plan + ([(first, cr) for cr in cfg.crs] if first else [])
        scale = self._comp_scale()

        def predicted_step(o: tuple[str, float]) -> float:
            c, cr = o
            raw = sync_time(c, self.grad_bytes, cr, net, cfg.forms)
            return (self._s.t_compute or 0.0) + self._t_comp(cr, scale) + self.calibration.apply(c, raw)

        times = {o: predicted_step(o) for o in options}
        limit = min(times.values()) * cfg.explore_prune
        plan: list[tuple[str, float]] = []
        dense = [o for o in options if o[1] == 1.0]
        if dense:
            best_dense = min(dense, key=lambda o: times[o])
            if times[best_dense] <= limit:
                plan.append(best_dense)
        for cr in cfg.crs:
            per_cr = [o for o in options if o[1] == cr]
            best = min(per_cr, key=lambda o: (times[o], o[0]))
            if times[best] <= limit:
                plan.append(best)
        middle = cfg.crs[len(cfg.crs) // 2]
        for c in cfg.collectives:
            if not any(p[0] == c for p in plan) and times[(c, middle)] <= limit:
                plan.append((c, middle))
        return plan or [min(options, key=lambda o: times[o])]

    def _run_plan_item(self) -> None:
        s = self._s
        if s.plan_index >= len(s.plan):
            self._finish_exploration()
            return
        c, cr = s.plan[s.plan_index]
        self._set_current(c, cr, f"exploring {s.plan_index + 1}/{len(s.plan)} ({s.why})")

    def _finish_exploration(self) -> None:
        s = self._s
        s.phase = EXPLOIT
        s.current = None  # the first choice after exploring is free of hysteresis
        chosen = self._choose()
        net = self._net()
        s.baseline = {
            "alpha_s": net.alpha_s if net else -1.0,
            "beta_s_per_byte": net.beta_s_per_byte if net else -1.0,
            "gain": s.gains.get(repr(chosen.cr), 1.0) if chosen.cr != 1.0 else 1.0,
            "cr": chosen.cr,
        }

    def _choose(self) -> Evaluation:
        # Predictions plan what to explore; choices are made among what was
        # measured since the network last changed (a stale or optimistic model
        # must not pull the job onto an option nobody has timed).
        rows = self.evaluate()
        measured = [r for r in rows if r.measured]
        rows = measured or rows
        if not rows:  # nothing measured and no network: stay where we are
            return Evaluation(self._s.current["collective"], self._s.current["cr"], 0, 0, 0, None, False)
        best = self.choose(rows)
        current = self._current_row(rows)
        margin = max(self.config.hysteresis, self.calibration.error())
        if current is not None and current != best and self._not_worth_switching(current, best, rows, margin):
            return current
        if current != best:
            self._set_current(best.collective, best.cr, self.explain(best, rows), best)
        return best

    def _not_worth_switching(self, current: Evaluation, best: Evaluation, rows: list[Evaluation],
                             margin: float) -> bool:
        """Stay when `current` is within `margin` of `best` on both objectives or,
        choosing by ASF, on the ASF score itself: two options far apart on the
        front can score alike, and smoothed gains drifting by a few percent then
        swapped them every few steps (the lab's 20 Mbit/s phase: 0.011@art_tree and
        0.033@art_ring, seven switches in 40 steps)."""
        if _within(current, best, margin):
            return True
        if self.config.objective != "asf" or any(r.gain is None for r in rows):
            return False
        # Over every row, the ideal point is the front's, so these are choose()'s scores.
        scores = self._asf([_objectives(r) for r in rows])
        return scores[rows.index(current)] <= scores[rows.index(best)] + margin

    def _current_row(self, rows: list[Evaluation]) -> Evaluation | None:
        cur = self._s.current
        if cur is None:
            return None
        return next((r for r in rows if r.collective == cur["collective"] and r.cr == cur["cr"]), None)

    def _set_current(self, collective: str, cr: float, reason: str, row: Evaluation | None = None) -> None:
        s = self._s
        if s.current and (s.current["collective"], s.current["cr"]) == (collective, cr):
            s.current["reason"] = reason
            return
        s.version += 1
        s.phase_steps = 0
        # What the choice was made on, when it was measured: a step that runs far
        # slower than that means the network moved under it.
        s.sync_baseline = row.t_sync_s if row is not None and row.measured else None
        s.sync_moved_steps = 0
        s.current = Decision(
            cr=cr, collective=collective, root=self.config.root, version=s.version,
            predicted_sync_s=row.t_sync_s if row else 0.0,
            predicted_comp_s=row.t_comp_s if row else 0.0,
            reason=reason, probe_crs=self.config.crs, model_forms=self.config.forms.describe(),
        ).to_dict()

    def explain(self, best: Evaluation, rows: list[Evaluation]) -> str:
        what = "dense" if best.cr == 1.0 else f"Top-k cr={best.cr:g}"
        gain = "" if best.gain is None else f", gain {best.gain:.2f}"
        src = "measured" if best.measured else "model"
        dense = [r for r in rows if r.cr == 1.0]
        vs = f"; dense {dense[0].t_step_s:.4g} s" if dense and best.cr != 1.0 else ""
        basis = "time only (gains unknown)" if best.gain is None else f"{self.config.objective} on the Pareto front"
        return f"{what} over {best.collective}: t_step {best.t_step_s:.4g} s ({src}){gain}{vs}; {basis}"

    def _network_moved(self, net: NetworkObservation) -> bool:
        base = self._s.baseline
        if base is None:
            return False
        if base["beta_s_per_byte"] <= 0:
            return True  # the last exploration ran blind: the first network seen is news
        th = self.config.change_threshold
        beta_moved = abs(net.beta_s_per_byte - base["beta_s_per_byte"]) >= th * base["beta_s_per_byte"]
        d_alpha = abs(net.alpha_s - base["alpha_s"])
        alpha_moved = d_alpha >= th * base["alpha_s"] and d_alpha >= self.config.alpha_floor_s
        return beta_moved or alpha_moved

    def _network_change_reason(self, net: NetworkObservation) -> str:
        base = self._s.baseline or {}
        old_bw = 8 / base["beta_s_per_byte"] if base.get("beta_s_per_byte", 0) > 0 else float("nan")
        seen = f" ({net.evidence})" if net.evidence else ""
        return (f"network moved{seen}: bandwidth {old_bw / 1e6:.4g} -> {net.bandwidth_bps / 1e6:.4g} Mbit/s, "
                f"latency {base.get('alpha_s', float('nan')) * 1e3:.3g} -> {net.alpha_s * 1e3:.3g} ms")

    def _gain_moved(self) -> str:
        base = self._s.baseline
        if not base or base["cr"] == 1.0:
            return ""
        now = self._s.gains.get(repr(base["cr"]))
        if now is None or abs(now - base["gain"]) < self.config.change_threshold * base["gain"]:
            return ""
        return f"the chosen CR's gain moved {base['gain']:.2f} -> {now:.2f}"


def _objectives(r: Evaluation) -> tuple[float, float]:
    """The two minimised objectives of a candidate with a known gain: (t_step, 1/gain)."""
    assert r.gain is not None
    return r.t_step_s, 1.0 / max(r.gain, 1e-9)


def _within(current: Evaluation, best: Evaluation, margin: float) -> bool:
    """True when `current` is no worse than `best` by more than `margin` on both
    objectives: then switching is not worth it."""
    time_ok = current.t_step_s <= best.t_step_s * (1 + margin)
    if current.gain is None or best.gain is None:
        return time_ok
    return time_ok and _objectives(current)[1] <= _objectives(best)[1] * (1 + margin)


def _ewma(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new
