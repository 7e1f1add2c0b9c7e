"""The seeded random walk of link rates: the same seed gives the same schedule,
the rates stay within their bounds and move both ways, and a bad [walk] table is
refused naming the file and the field (no kernel involved)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from flexcomm.emulation.schedule import ScheduleError, load_schedule, parse_schedule
from flexcomm.emulation.walk import walk_rates

WALK = """
name = "walk"
[walk]
seed = 2
low = "10Mbit"
high = "1Gbit"
epochs = 2
steps = 40
"""


def test_a_walk_is_seeded_bounded_and_goes_both_ways() -> None:
    first, again = parse_schedule(WALK, "w.toml"), parse_schedule(WALK, "w.toml")
    assert first == again
    assert first.by_epoch and [s.epoch for s in first.steps] == list(range(0, 80, 2))
    rates = [s.state.rate_bps for s in first.steps]
    assert all(10e6 <= r <= 1e9 for r in rates)
    moves = [math.log(b / a) for a, b in itertools.pairwise(rates)]
    assert any(m > 0 for m in moves) and any(m < 0 for m in moves)
    assert max(abs(m) for m in moves) <= math.log(10) + 0.1  # max_factor 10 (and rounding)
    other = parse_schedule(WALK.replace("seed = 2", "seed = 3"), "w.toml")
    assert [s.state.rate_bps for s in other.steps] != rates


def test_a_walk_reflects_at_its_bounds_and_keeps_two_digits() -> None:
    rates = walk_rates(seed=0, count=500, low=10e6, high=1e9, max_factor=30.0)
    assert min(rates) < 20e6 and max(rates) > 500e6  # reaches both ends, never past them
    assert all(10e6 <= r <= 1e9 for r in rates)
    assert sum(r in (10e6, 1e9) for r in rates) < 10  # reflected, not clamped onto the bounds
    assert all(float(f"{r:.2g}") == pytest.approx(r) for r in rates)


def test_a_time_keyed_walk_holds_each_rate_for_its_duration() -> None:
    schedule = parse_schedule(WALK.replace("epochs = 2", 'duration = "30s"'), "w.toml")
    assert not schedule.by_epoch and schedule.round_seconds == pytest.approx(40 * 30.0)


def test_the_shipped_random_walk_degrades_and_recovers() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "schedules" / "random-walk.toml"
    rates = [s.state.rate_bps / 1e6 for s in load_schedule(path).steps]
    assert rates == [820, 160, 20, 33, 160, 470, 980, 410]  # as its comment says


@pytest.mark.parametrize(("table", "expected"), [
    ('seed = 1\nlow = "10Mbit"\nhigh = "1Gbit"\nsteps = 3\n', "walk: epochs/duration: give exactly one"),
    ('seed = 1\nlow = "1Gbit"\nhigh = "10Mbit"\nepochs = 1\nsteps = 3\n', "walk: low/high: low must be below"),
    ('seed = 1\nlow = 10\nhigh = "1Gbit"\nepochs = 1\nsteps = 3\n', "walk: low: needs a rate with its unit"),
    ('seed = 1\nlow = "10Mbit"\nhigh = "1Gbyte"\nepochs = 1\nsteps = 3\n', "walk: high: unknown rate unit"),
    ('low = "10Mbit"\nhigh = "1Gbit"\nepochs = 1\nsteps = 3\n', "walk: seed: missing"),
    ('seed = 1\nlow = "10Mbit"\nhigh = "1Gbit"\nepochs = 1\nsteps = 0\n', "walk: steps: must be a whole"),
    ('seed = 1\nlow = "10Mbit"\nhigh = "1Gbit"\nepochs = 1\nsteps = 3\nmax_factor = 1\n',
     "walk: max_factor: must be a number > 1"),
    ('seed = 1\nlow = "10Mbit"\nhigh = "1Gbit"\nduration = "30"\nsteps = 3\n',
     "walk: duration: duration '30' needs a unit"),
    ('seed = 1\nlow = "10Mbit"\nhigh = "1Gbit"\nepochs = 1\nsteps = 3\nrate = "1Gbit"\n',
     "walk: rate: unknown key"),
])
def test_bad_walks_name_file_and_field(tmp_path: Path, table: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[walk]\n" + table)
    with pytest.raises(ScheduleError) as info:
        load_schedule(path)
    assert any(line.startswith(f"{path}: {expected}") for line in info.value.errors), info.value.errors


def test_steps_and_a_walk_together_are_refused() -> None:
    with pytest.raises(ScheduleError, match="step/walk: give"):
        parse_schedule(WALK + '[[step]]\nepoch = 0\nrate = "1Gbit"\n', "w.toml")
