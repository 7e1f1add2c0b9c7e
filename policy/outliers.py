"""The calibration's gate: which steps its fit of an option's sync may learn from.

A step whose sync is far off the calibrated prediction (CALIBRATION_OUTLIER
times either way) ran on a network the policy does not know yet (a move not
yet probed): that is the change detector's to judge, and the fit skips it.
Outliers that persist (CALIBRATION_RESET in a row) mean the model itself is
off: the fit starts over from that step.

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CALIBRATION_OUTLIER = 3.0
CALIBRATION_RESET = 8


class Verdict(enum.Enum):
    FIT = "fit"  # learn from the step
    SKIP = "skip"  # an outlier: leave it out
    REFIT = "refit"  # outliers persisted: forget the fit, then learn from the step


@dataclass
class OutlierGate:
    in_a_row: dict[str, int] = field(default_factory=dict)  # calibration key -> outliers in a row

    def judge(self, key: str, ratio: float | None) -> Verdict:
        """The verdict on a step of calibration `key` whose sync is `ratio` times
        the calibrated prediction (None: nothing fitted yet)."""
        if ratio is None or 1 / CALIBRATION_OUTLIER <= ratio <= CALIBRATION_OUTLIER:
            self.in_a_row.pop(key, None)
            return Verdict.FIT
        seen = self.in_a_row[key] = self.in_a_row.get(key, 0) + 1
        if seen < CALIBRATION_RESET:
            return Verdict.SKIP
        del self.in_a_row[key]
        return Verdict.REFIT

    def outlying(self, key: str) -> bool:
        """The latest steps of calibration `key` are outliers."""
        return bool(self.in_a_row.get(key))

    def clear(self) -> None:
        """Forget every outlier: they were judged against a network left behind."""
        self.in_a_row = {}

    def state_dict(self) -> dict[str, Any]:
        return {"in_a_row": dict(self.in_a_row)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> OutlierGate:
        return cls({str(k): int(v) for k, v in state["in_a_row"].items()})


__all__ = ["CALIBRATION_OUTLIER", "CALIBRATION_RESET", "OutlierGate", "Verdict"]
