"""The calibration's outlier gate (policy.outliers)."""

from __future__ import annotations

import json

from flexcomm.policy.outliers import CALIBRATION_OUTLIER, CALIBRATION_RESET, OutlierGate, Verdict

KEY = "art_ring"


def test_a_step_near_the_prediction_or_with_nothing_fitted_is_fitted() -> None:
    gate = OutlierGate()
    assert gate.judge(KEY, None) is Verdict.FIT
    assert gate.judge(KEY, CALIBRATION_OUTLIER) is Verdict.FIT
    assert gate.judge(KEY, 1 / CALIBRATION_OUTLIER) is Verdict.FIT and not gate.outlying(KEY)


def test_outliers_are_skipped_until_they_persist_then_the_fit_starts_over() -> None:
    gate = OutlierGate()
    verdicts = [gate.judge(KEY, 10.0) for _ in range(CALIBRATION_RESET)]
    assert verdicts == [Verdict.SKIP] * (CALIBRATION_RESET - 1) + [Verdict.REFIT]
    assert not gate.outlying(KEY)  # the new fit starts from that step


def test_a_step_near_the_prediction_ends_a_run_of_outliers() -> None:
    gate = OutlierGate()
    gate.judge(KEY, 0.1)
    assert gate.outlying(KEY) and not gate.outlying("dense_ring")
    gate.judge(KEY, 1.2)
    assert not gate.outlying(KEY)
    assert all(gate.judge(KEY, 0.1) is Verdict.SKIP for _ in range(CALIBRATION_RESET - 1))


def test_clear_forgets_every_outlier_and_the_state_restores_it() -> None:
    gate = OutlierGate()
    gate.judge(KEY, 10.0)
    back = OutlierGate.from_state(json.loads(json.dumps(gate.state_dict())))
    assert back == gate and back.outlying(KEY)
    back.clear()
    assert not back.outlying(KEY)
