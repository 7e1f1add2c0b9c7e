"""GraVAC (Tyagi & Swany, arXiv:2305.12201): raise compression while it pays.

Starting from the least compression (c_high) after a dense warm-up, each CR runs
for `window` steps; its compression throughput is mean(gain) / mean(t_step)
(samples per second weighted by the information kept). The search moves to the
next, smaller CR while the gain stays >= epsilon and the throughput still grows
by more than omega; it settles on the better of the last two otherwise. Once
settled, if the settled CR's gain falls below epsilon it steps back to less
compression. The collective is fixed (AllGather Top-k, as in GraVAC's code).

Pure and deterministic, like every policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from flexcomm.policy.moo import candidate_crs
from flexcomm.policy.types import (
    AG_TOPK,
    DENSE_DECISION,
    ROOT_STAR,
    SPARSE_COLLECTIVES,
    TOPK,
    Choice,
    Compression,
    Decision,
    NetworkObservation,
    StepReport,
    check_collective,
    check_options,
    check_range,
    check_root,
)

WARMUP, SEARCH, SETTLED = "warmup", "search", "settled"


@dataclass(frozen=True)
class GravacConfig:
    c_low: float = 0.001
    c_high: float = 0.1
    factor: float = 3.0
    epsilon: float = 0.7
    omega: float = 0.02
    window: int = 5
    warmup_steps: int = 3
    collective: str = AG_TOPK
    root: str = ROOT_STAR

    def __post_init__(self) -> None:
        candidate_crs(self.c_low, self.c_high, self.factor)
        check_collective(self.collective)
        if self.collective not in SPARSE_COLLECTIVES:
            raise ValueError(f"collective: GraVAC needs a Top-k collective, got {self.collective!r}")
        check_root(self.root)
        check_range("epsilon", self.epsilon, 0, 1)
        check_range("omega", self.omega, 0, 1)
        for name in ("window", "warmup_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (1 if name == "window" else 0):
                raise ValueError(f"{name}: must be a whole number >= {1 if name == 'window' else 0}, got {v!r}")

    @property
    def crs(self) -> tuple[float, ...]:
        return candidate_crs(self.c_low, self.c_high, self.factor)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> GravacConfig:
        return cls(**check_options(options, cls, "GraVAC"))


@dataclass
class _State:
    phase: str = WARMUP
    index: int = -1  # -1: dense warm-up; else an index into crs
    steps: int = 0
    gain_sum: float = 0.0
    time_sum: float = 0.0
    prev: list[float] | None = None  # [index, throughput] of the last finished candidate
    version: int = 1
    reason: str = "warm-up: dense"


class GravacPolicy:
    name = "gravac"

    def __init__(self, config: GravacConfig | None = None) -> None:
        self.config = config or GravacConfig()
        self._s = _State()
        if self.config.warmup_steps == 0:
            self._move(0, "search: least compression first")

    def observe_network(self, net: NetworkObservation) -> None:
        pass  # GraVAC adapts to what training measures, not to the network

    def observe_steps(self, reports: Sequence[StepReport]) -> None:
        for report in reports:
            self._observe_step(report)

    def _observe_step(self, report: StepReport) -> None:
        s, cfg = self._s, self.config
        if report.choice != self._running():
            return  # a step of an earlier decision
        s.steps += 1
        s.gain_sum += report.gain if s.index >= 0 else 1.0
        s.time_sum += report.step_s
        if s.phase == WARMUP:
            if s.steps >= cfg.warmup_steps:
                s.phase = SEARCH
                self._move(0, "search: least compression first")
        elif s.phase == SEARCH and s.steps >= cfg.window:
            self._judge()
        elif s.phase == SETTLED and s.index > 0:
            live_gain = report.gains.get(Compression(TOPK, cfg.crs[s.index]).name, report.gain)
            if live_gain < cfg.epsilon:
                self._move(s.index - 1, f"settled CR's gain {live_gain:.2f} fell below epsilon {cfg.epsilon}")

    def _judge(self) -> None:
        s, cfg = self._s, self.config
        gain = s.gain_sum / s.steps
        thr = gain / max(s.time_sum / s.steps, 1e-12)
        crs = cfg.crs
        if s.prev is not None:
            prev_i, prev_thr = int(s.prev[0]), s.prev[1]
            if gain < cfg.epsilon:
                self._settle(prev_i, f"gain {gain:.2f} at cr={crs[s.index]:g} is below epsilon {cfg.epsilon}")
                return
            if (thr - prev_thr) / prev_thr < cfg.omega:
                best = s.index if thr > prev_thr else prev_i
                self._settle(best, f"compression throughput grew < omega ({thr:.4g} vs {prev_thr:.4g})")
                return
        elif gain < cfg.epsilon:
            self._settle(s.index, f"gain {gain:.2f} below epsilon already at the least compression")
            return
        if s.index + 1 >= len(crs):
            self._settle(s.index, "reached the most compression with gain >= epsilon")
            return
        s.prev = [float(s.index), thr]
        self._move(s.index + 1, f"search: throughput {thr:.4g} at cr={crs[s.index]:g}, gain {gain:.2f}")

    def _settle(self, index: int, why: str) -> None:
        self._move(index, why)
        self._s.phase = SETTLED

    def _move(self, index: int, reason: str) -> None:
        s = self._s
        if index != s.index:
            s.version += 1
        s.index, s.steps, s.gain_sum, s.time_sum, s.reason = index, 0, 0.0, 0.0, reason

    def _running(self) -> Choice:
        s = self._s
        if s.index < 0:
            return DENSE_DECISION.choice
        return Choice(Compression(TOPK, self.config.crs[s.index]), self.config.collective)

    def choose(self) -> Decision:
        return self.decide()  # it chooses as it observes

    def decide(self) -> Decision:
        return Decision.of(self._running(), root=self.config.root, version=self._s.version,
                           reason=f"gravac {self._s.phase}: {self._s.reason}",
                           probes=tuple(Compression(TOPK, c).name for c in self.config.crs))

    @property
    def phase(self) -> str:
        return self._s.phase

    def model_error(self) -> float | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "config": asdict(self.config), "state": asdict(self._s)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.config = GravacConfig.from_options(state["config"])
        self._s = _State(**state["state"])


