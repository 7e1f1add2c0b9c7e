"""When the MOO looks at its choice again: the network the choice settled on,
and the running option's own syncs since it was chosen.

Network moves arrive only as observations. The bandwidth's estimator is the one
detector of its moves: an observation it judged carries its count of moves, and
`moved` takes a change of that count as the move, nothing else (a figure the
estimator only refined is the same link). A figure no estimator judged (a
user's, a probe's) is compared with the settled one by `threshold`; latency
always is. The running option's syncs give its figure (the
median of its latest steps, so one slow step does not switch the job), how
far it moved from where its first steps settled (`drift_s`: the others'
figures were taken before whatever moved it), and say when a running lossy
option got much faster than where it settled (`fell`): the link got faster
than anything observed says.

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flexcomm.policy.types import NetworkObservation, plain_fields

RUNNING_SAMPLES = 5  # the running option's sync time is the median of its latest steps
LEFT_SAMPLES = 2  # steps an option left sooner (an exploring item) must have run to keep its level


@dataclass
class Reconsideration:
    settled: bool = False  # a choice has settled (on `alpha_s`/`beta_s_per_byte`, or blind)
    alpha_s: float | None = None  # the network it settled on; None: it settled blind
    beta_s_per_byte: float | None = None
    moves: int | None = None  # the estimator's count of moves when it settled
    chosen_sync: float | None = None  # the running option's sync time when it was chosen
    chosen_predicted: bool = False  # chosen_sync is the calibrated model's, not a measurement
    settled_sync: float | None = None  # the median of its first RUNNING_SAMPLES syncs since
    settled_level: float | None = None  # its first steps' sync per second of compute
    running_sync: list[float] = field(default_factory=list)  # its latest steps' sync times
    running_level: list[float] = field(default_factory=list)  # the same per second of their compute
    running: str | None = None  # the running option's label
    levels: dict[str, float] = field(default_factory=dict)  # each option's settled level on this network

    def settle_on(self, net: NetworkObservation | None) -> None:
        """The choice is settled on `net` (None: no network known); the levels
        and syncs seen before are of another network."""
        self.settled = True
        self.levels = {}
        self.settled_level = self.settled_sync = None
        self.running_sync, self.running_level = [], []
        self.alpha_s = net.alpha_s if net else None
        self.beta_s_per_byte = net.beta_s_per_byte if net else None
        self.moves = net.moves if net else None

    @property
    def blind(self) -> bool:
        return self.settled and self.beta_s_per_byte is None

    def moved(self, net: NetworkObservation, threshold: float, alpha_floor_s: float) -> bool:
        """`net` is a move from the settled network: its estimator counted a move
        since (else, for a figure no estimator judged, beta moved by `threshold`
        or more relative), or alpha moved by `threshold` and by at least
        `alpha_floor_s`. The first network after a blind settlement is news."""
        if not self.settled:
            return False
        if self.beta_s_per_byte is None or self.alpha_s is None:
            return True
        if net.moves is not None and self.moves is not None:
            beta_moved = net.moves != self.moves
        else:
            beta_moved = abs(net.beta_s_per_byte - self.beta_s_per_byte) >= threshold * self.beta_s_per_byte
        d_alpha = abs(net.alpha_s - self.alpha_s)
        return beta_moved or (d_alpha >= threshold * self.alpha_s and d_alpha >= alpha_floor_s)

    def got_faster(self, net: NetworkObservation | None, factor: float = 2.0) -> bool:
        """The bandwidth grew at least `factor` times since the choice settled."""
        return net is not None and self.beta_s_per_byte is not None and \
            net.beta_s_per_byte * factor <= self.beta_s_per_byte

    def change_reason(self, net: NetworkObservation) -> str:
        old_bw = 8 / self.beta_s_per_byte if self.beta_s_per_byte else math.nan
        old_alpha = self.alpha_s if self.alpha_s is not None else math.nan
        seen = f" ({net.evidence})" if net.evidence else ""
        return (f"network moved{seen}: bandwidth {old_bw / 1e6:.4g} -> {net.bandwidth_bps / 1e6:.4g} Mbit/s, "
                f"latency {old_alpha * 1e3:.3g} -> {net.alpha_s * 1e3:.3g} ms")

    def chose(self, label: str | None, sync_s: float | None, *, predicted: bool = False) -> None:
        """Option `label` runs, chosen on `sync_s` (`predicted`: the calibrated
        model's figure, not a measurement; None: on nothing). Its syncs are
        compared with the level it showed on this network before (its
        first RUNNING_SAMPLES steps, or the steps it ran when it was left
        sooner, as an exploring item), else with its first steps now: a link
        that sped up just as the budget switched options is then still seen."""
        if self.running and self.running not in self.levels and len(self.running_level) >= LEFT_SAMPLES:
            self.levels[self.running] = statistics.median(self.running_level)
        self.running, self.chosen_sync, self.settled_sync = label, sync_s, None
        self.chosen_predicted = predicted and sync_s is not None
        self.settled_level = self.levels.get(label) if label else None
        self.running_sync, self.running_level = [], []

    def ran(self, sync_s: float, per_compute_s: float) -> None:
        """One step of the running option: its sync time, and that per second of
        compute. Its first RUNNING_SAMPLES steps settle the level `fell` compares with."""
        self.running_sync = [*self.running_sync, sync_s][-RUNNING_SAMPLES:]
        self.running_level = [*self.running_level, per_compute_s][-RUNNING_SAMPLES:]
        if self.settled_sync is None and len(self.running_sync) >= RUNNING_SAMPLES:
            self.settled_sync = statistics.median(self.running_sync)
        if self.settled_level is None and len(self.running_level) >= RUNNING_SAMPLES:
            self.settled_level = statistics.median(self.running_level)
            if self.running:
                self.levels[self.running] = self.settled_level

    def latest_sync(self) -> float | None:
        """The median of the running option's latest RUNNING_SAMPLES steps (None
        until that many ran)."""
        return statistics.median(self.running_sync) if len(self.running_sync) >= RUNNING_SAMPLES else None

    def sync(self) -> float | None:
        """The running option's sync time: the median of its latest steps, or the
        figure it was chosen on until RUNNING_SAMPLES of them ran."""
        latest = self.latest_sync()
        return self.chosen_sync if latest is None else latest

    def sync_measured(self) -> bool:
        """Whether `sync()` is a measurement, not the prediction it was chosen on."""
        return self.latest_sync() is not None or not self.chosen_predicted

    def drift_s(self) -> float:
        """How far the running option's sync (the median of its latest steps) moved,
        either way, from where its first steps settled (not from the figure it was
        chosen on: an exploring item's one or two steps are a noisy host's luck)."""
        latest = self.latest_sync()
        if self.settled_sync is None or latest is None:
            return 0.0
        return abs(latest - self.settled_sync)

    def fell(self) -> float:
        """How far the running option's sync per second of compute fell below
        where its first steps put it (a busy host slows compute and sync alike;
        a link moves the ratio). 0 until there is something to compare."""
        if self.settled_level is None or len(self.running_level) < RUNNING_SAMPLES:
            return 0.0
        return 1.0 - statistics.median(self.running_level) / self.settled_level

    def state_dict(self) -> dict[str, Any]:
        return plain_fields(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Reconsideration:
        return cls(**state)


__all__ = ["RUNNING_SAMPLES", "Reconsideration"]
