"""The envelope of the fixed choices, the adaptive policy's distance from it and
the modelled headroom, from hand-written evaluations and phases (no training)."""

from __future__ import annotations

import pytest

from flexcomm.emulation.schedule import parse_schedule
from flexcomm.lab.envelope import Curve, distance, envelope, headroom, modelled_time

TWO_PHASES = parse_schedule('''
[[step]]
duration = "10s"
rate = "20Mbit"

[[step]]
duration = "10s"
rate = "1Gbit"
''')
SLOW, FAST = 20e6, 1e9


def evals(*points: tuple[float, float]) -> list[dict]:
    return [{"t": t, "loss": loss} for t, loss in points]


def test_a_curve_reads_the_last_evaluation_at_or_before_a_moment() -> None:
    curve = Curve(evals((1, 3.0), (3, 2.0), (3, 1.9), (5, 1.8)), "loss")
    assert curve.at(0.5) is None  # nothing evaluated yet
    assert [curve.at(t) for t in (1, 2.9, 3, 4, 5, 99)] == [3.0, 3.0, 1.9, 1.9, 1.8, 1.8]
    assert Curve([], "loss").at(1.0) is None


def test_the_envelope_is_the_best_any_fixed_choice_had_by_then() -> None:
    a = evals((1, 3.0), (3, 2.0), (5, 1.8))
    b = evals((2, 2.5), (4, 1.5))
    assert envelope([a, b], "loss") == [(1, 3.0), (2, 2.5), (3, 2.0), (4, 1.5), (5, 1.5)]
    acc = [[{"t": 1, "accuracy": 0.5}], [{"t": 2, "accuracy": 0.4}]]
    assert envelope(acc, "accuracy") == [(1, 0.5), (2, 0.5)]


def test_the_adaptive_distance_leaves_out_the_first_tenth() -> None:
    env = envelope([evals((1, 3.0), (5, 2.0), (10, 1.0))], "loss")
    moo = evals((0.5, 9.0), (5, 2.5), (10, 1.1))  # the 9.0 is before 10% of its 10 s
    gap = distance(moo, env, "loss")
    assert gap["worst"] == pytest.approx(0.5) and gap["median"] == pytest.approx(0.3)
    acc_gap = distance([{"t": 5, "accuracy": 0.9}], [(1, 0.95)], "accuracy")
    assert acc_gap["worst"] == pytest.approx(5.0)  # accuracy points, worse is positive


def test_headroom_walks_the_phases_with_each_choices_progress_rate() -> None:
    # dense: 100 steps to the target, 1 s a step slow, 0.1 s fast.
    # topk: 200 steps, 0.1 s slow, 0.1 s fast (twice dense's steps, as fast when fast).
    choices = {"dense": (100, {SLOW: 1.0, FAST: 0.1}), "topk": (200, {SLOW: 0.1, FAST: 0.1})}
    # dense alone: 10 s slow = 10% of the way, then 90 steps at 0.1 s: 19 s.
    assert modelled_time(TWO_PHASES, choices, "dense") == pytest.approx(19.0)
    # topk alone: 100 steps in the slow 10 s (half), 100 more fast: 20 s.
    assert modelled_time(TWO_PHASES, choices, "topk") == pytest.approx(20.0)
    # per phase: topk slow (half), dense fast (50 steps, 5 s): 15 s.
    assert modelled_time(TWO_PHASES, choices, None) == pytest.approx(15.0)
    room = headroom(TWO_PHASES, choices)
    assert room["ratio"] == pytest.approx(19.0 / 15.0) and room["best_fixed"] == "dense"
    assert [p["policy"] for p in room["per_phase"]] == ["topk", "dense"]


def test_headroom_says_why_it_has_no_figure() -> None:
    assert headroom(TWO_PHASES, {})["why"] == "no fixed choice reached the target"
    by_epoch = parse_schedule('[[step]]\nepoch = 0\nrate = "1Gbit"\n')
    assert headroom(by_epoch, {"dense": (10, {1e9: 1.0})})["ratio"] is None
