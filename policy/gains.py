"""A job's gain figures: what each compression's probes read off a gradient, and
what each option's steps delivered.

A gain is an expectation (E||g_c||^2 / E||g_e||^2): one step's swings 5x at one
CR on a small model, so each figure is smoothed, with a weight per step elapsed
(`smoothing` per step, compounded), so a figure read every tenth step settles as
fast, in steps, as one read every step (with a fixed weight per reading, a probe
every 10 steps lagged ~200 steps).

Two figures, because they differ: the probes are keyed by compression, the
deliveries by option (AR-Topk over a tree delivered a median 0.07 on the lab
where the probes read 0.48 for its CR; PowerSGD's probes, the best rank-r
approximation of rank 0's gradient, read 0.5 where its steps delivered 0.2).

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flexcomm.policy.linkestimate import ewma
from flexcomm.policy.types import Choice

# A figure last read this many steps ago weighs a new reading as if read this long
# ago: beyond it the new reading all but replaces the figure anyway.
MAX_ELAPSED = 1000


@dataclass
class GainFigures:
    smoothing: float
    probed: dict[str, float] = field(default_factory=dict)  # compression name -> gain its probes read
    delivered: dict[str, float] = field(default_factory=dict)  # option label -> gain its steps applied
    seen: dict[str, int] = field(default_factory=dict)  # probed's and delivered's key -> step last read

    def probe(self, name: str, gain: float, step: int) -> None:
        """A compression's probe read `gain` off the gradient of `step`."""
        self._smooth(self.probed, name, gain, step)

    def deliver(self, label: str, gain: float, step: int) -> None:
        """A step of the option `label` applied `gain`."""
        self._smooth(self.delivered, label, gain, step)

    def _smooth(self, figures: dict[str, float], key: str, gain: float, step: int) -> None:
        last = self.seen.get(key)
        elapsed = 1 if last is None else min(max(1, step - last), MAX_ELAPSED)
        weight = 1.0 - (1.0 - self.smoothing) ** elapsed
        figures[key] = ewma(figures.get(key), gain, weight)
        self.seen[key] = step

    def delivery_ratios(self, options: Mapping[str, Choice]) -> dict[tuple[str, str], float]:
        """Per (family, collective), what the options that ran delivered over what
        their probes read (the median, at most 1). `options`: the candidates by
        label (a stored state's figures may name what is no candidate now)."""
        ratios: dict[tuple[str, str], list[float]] = {}
        for label, delivered in self.delivered.items():
            choice = options.get(label)
            probed = self.probed.get(choice.compression.name) if choice else None
            if probed:
                ratios.setdefault((choice.compression.family, choice.collective), []).append(delivered / probed)
        return {k: min(1.0, statistics.median(v)) for k, v in ratios.items()}

    def expected(self, option: Choice, ratios: Mapping[tuple[str, str], float]) -> float | None:
        """What a lossy option's steps deliver: measured once it ran, else its probes'
        reading scaled by `ratios` (delivery_ratios) for its family over its
        collective (an untimed PowerSGD rank, rated by its probes, was tried and
        rejected again and again while the job ran bf16 at 10 Mbit/s)."""
        if option.label in self.delivered:
            return self.delivered[option.label]
        probed = self.probed.get(option.compression.name)
        return None if probed is None else probed * ratios.get((option.compression.family, option.collective), 1.0)

    def share_of(self, option: Choice, reference: Choice, kept: float) -> float | None:
        """`option`'s gain as its share of what `reference` (its family's) keeps,
        their probes read off the same gradients, where the reference keeps
        `kept`; None while either probe is unread. Read off the probes, not the
        deliveries: PowerSGD's delivered gain falls from ~0.9 to ~0.15 as its
        residual fills, so ranks delivered at different times compared wrongly
        (on lm rank 2, its figure from the first exploration, looked better than
        rank 4, was chosen, and then charged 0.25 a step against the
        reference's 0.003)."""
        if option == reference:
            return kept
        own, mine = self.probed.get(reference.compression.name), self.probed.get(option.compression.name)
        return None if not own or mine is None else min(1.0, kept * mine / own)

    def state_dict(self) -> dict[str, Any]:
        return {"probed": dict(self.probed), "delivered": dict(self.delivered), "seen": dict(self.seen)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], smoothing: float) -> GainFigures:
        return cls(smoothing, {str(k): float(v) for k, v in state["probed"].items()},
                   {str(k): float(v) for k, v in state["delivered"].items()},
                   {str(k): int(v) for k, v in state["seen"].items()})


__all__ = ["GainFigures"]
