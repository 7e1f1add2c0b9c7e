"""One candidate as the MOO sees it (`Evaluation`: its step time, measured or
predicted, and the gain it delivers) and the rules that compare candidates: the
fastest within an error allowance, what a unit of error must buy, when two are
too close to switch between. Pure functions of the rows they are given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from flexcomm.policy.costmodel import sync_form
from flexcomm.policy.types import Choice

# A step keeps at least this share of what the reference keeps, whatever the run
# saved: on savings (the allowance up to twice the reference's error) a digits lab
# ran Top-k 0.001 over the AR tree, which delivered a gain of 0.00.
MIN_KEPT = 0.5


@dataclass(frozen=True)
class Evaluation:
    """One candidate as the policy sees it now."""

    option: Choice
    t_sync_s: float
    t_comp_s: float
    t_step_s: float
    gain: float | None
    measured: bool  # t_sync measured (True) or predicted by the calibrated model
    raw_sync_s: float | None = None  # the uncalibrated model's figure, when a network is known

    @property
    def label(self) -> str:
        return self.option.label

    @property
    def error(self) -> float:
        """1 - gain: what it does not send (an unknown gain counts as sending nothing)."""
        return 1.0 - (self.gain or 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"option": self.label, "family": self.option.compression.family,
                "param": self.option.compression.param, "collective": self.option.collective,
                "t_sync_s": self.t_sync_s, "t_comp_s": self.t_comp_s, "t_step_s": self.t_step_s,
                "gain": self.gain, "measured": self.measured, "raw_sync_s": self.raw_sync_s}



def error_cap(reference_error: float) -> float:
    """The most error any step may deliver, whatever the run saved: a step keeps at
    least MIN_KEPT of what the reference keeps."""
    return 1.0 - MIN_KEPT * (1.0 - reference_error)


def budget_rank(r: Evaluation, allowance: float) -> tuple[int, float, float]:
    """Within the allowance first, fastest first; then the rest, least error first."""
    return (0, r.t_step_s, r.error) if r.error <= allowance else (1, r.error, r.t_step_s)


def fastest_within(rows: list[Evaluation], allowance: float, hysteresis: float, price: float) -> Evaluation:
    """The fastest row whose error is within `allowance`, the one losing least among
    those it does not beat by more than `hysteresis` and what their error is worth
    (`price`, MooPolicy.error_price: the share of a step a unit of error must
    save), so where compression buys little the run saves its budget; with none
    within, the one losing least."""
    within = [r for r in rows if r.error <= allowance]
    if not within:
        return min(rows, key=lambda r: (*budget_rank(r, allowance), r.option))
    fastest = min(within, key=lambda r: (r.t_step_s, r.error, r.option))
    near = [r for r in within if worth_its_error(r, fastest, hysteresis, price)]
    return min(near, key=lambda r: (r.error, r.t_step_s, r.option))


def worth_its_error(saver: Evaluation, faster: Evaluation, hysteresis: float, price: float) -> bool:
    """Whether `saver` is as good as `faster`: `faster` saves no more of its step
    than `hysteresis` and `price` per unit of the error it adds."""
    return saver.t_step_s * share_left(price, faster.error - saver.error) <= faster.t_step_s * (1 + hysteresis)


def share_left(price: float, added_error: float) -> float:
    """The share of a step left once `added_error` is paid for at `price` (the
    share of a step a unit of error must save), never below 0."""
    return max(0.0, 1.0 - price * added_error)


def objectives(r: Evaluation) -> tuple[float, float]:
    """The two minimised objectives of a candidate with a known gain: (t_step, 1/gain)."""
    assert r.gain is not None
    return max(r.t_step_s, 1e-12), 1.0 / max(r.gain, 1e-9)


def within(current: Evaluation, best: Evaluation, margin: float) -> bool:
    """True when `current` is no worse than `best` by more than `margin` on both
    objectives: then switching is not worth it."""
    time_ok = current.t_step_s <= best.t_step_s * (1 + margin)
    if current.gain is None or best.gain is None:
        return time_ok
    return time_ok and objectives(current)[1] <= objectives(best)[1] * (1 + margin)


def outdone(row: Evaluation, rows: list[Evaluation]) -> bool:
    """Whether another of `rows` over the same sync form is predicted no slower and
    delivers no less, and one of the two strictly (bf16 against dense on one ring):
    the model orders options on one form by their bytes alone, where across forms
    it may be wrong enough that only a measurement says."""
    if row.gain is None:
        return False
    form = sync_form(row.option.compression, row.option.collective)
    return any(q is not row and q.gain is not None
               and sync_form(q.option.compression, q.option.collective) == form
               and q.t_step_s <= row.t_step_s and q.gain >= row.gain
               and (q.t_step_s < row.t_step_s or q.gain > row.gain) for q in rows)


def with_best_lossless(rows: list[Evaluation], ranked: list[Evaluation]) -> list[Evaluation]:
    """`rows` with the best-ranked lossless option second (after the model's first
    choice), unless one is there already."""
    if any(r.option.lossless for r in rows):
        return rows
    return with_second(rows, next((r for r in ranked if r.option.lossless), None))


def uncalibrated(row: Evaluation) -> Evaluation:
    """`row` with the uncalibrated model's sync, where it has one."""
    if row.raw_sync_s is None:
        return row
    return replace(row, t_sync_s=row.raw_sync_s, t_step_s=row.t_step_s - row.t_sync_s + row.raw_sync_s)


def with_second(rows: list[Evaluation], row: Evaluation | None) -> list[Evaluation]:
    """`rows` with `row` second (after the model's first choice), unless it is there."""
    if row is None or any(r.label == row.label for r in rows):
        return rows
    return [rows[0], row, *rows[1:]]
