"""Schedule files: parsing, refusal of bad ones (file, step and field named), and
the runner's stepping logic. The runner is driven here with a recording shaper
(the real kernel path is in tests/cli/test_emulate.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from flexcomm.emulation.emulator import Emulator
from flexcomm.emulation.schedule import ScheduleError, load_schedule, parse_schedule
from flexcomm.emulation.shaping import LinkState

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "schedules"

TWO_STEPS = """
repeat = 2
[[step]]
duration = "1.5s"
rate = "10Mbit"
[[step]]
duration = "500ms"
rate = "5Mbit"
delay = "10ms"
jitter = "1ms"
loss = "0.5%"
"""

EPOCHS = """
repeat = 2
[[step]]
epoch = 1
rate = "100Mbit"
[[step]]
epoch = 3
rate = "10Mbit"
"""


class RecordingShaper:
    """Stands in for the kernel: remembers the states it was asked to apply."""

    def __init__(self) -> None:
        self.applied: list[LinkState] = []

    def apply(self, state: LinkState) -> None:
        self.applied.append(state)


def _refused(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScheduleError) as info:
        load_schedule(path)
    assert all(line.startswith(f"{path}: ") for line in info.value.errors)
    return info.value.errors


def test_time_keyed_schedule_is_read_with_units():
    schedule = parse_schedule(TWO_STEPS, "two.toml")
    assert not schedule.by_epoch and schedule.repeat == 2
    assert schedule.steps[1].state == LinkState(5e6, delay_s=0.01, jitter_s=0.001, loss=0.005)
    assert [(offset, round_, step.number) for offset, round_, step in schedule.timeline()] == [
        (0.0, 0, 1), (1.5, 0, 2), (2.0, 1, 1), (3.5, 1, 2)]


def test_examples_are_valid():
    examples = sorted(EXAMPLES.glob("*.toml"))
    assert examples, "no example schedules"
    for path in examples:
        assert load_schedule(path).steps


@pytest.mark.parametrize(("text", "expected"), [
    ('[[step]]\nduration = "1s"\nrate = "1Mbit"\nbandwidth = "2Mbit"\n',
     "step 1: bandwidth: unknown key"),
    ('[[step]]\nduration = "1s"\nrate = "-5Mbit"\n', "step 1: rate: must be > 0"),
    ('[[step]]\nduration = "1s"\nrate = "1Mbit"\n[[step]]\nduration = "1s"\nrate = "1Mbit"\n'
     'delay = "10"\n', "step 2: delay: duration '10' needs a unit"),
    ('[[step]]\nduration = "1s"\nrate = "1Mbit"\ndelay = 10\n', "step 1: delay: 10 needs a unit"),
    ('[[step]]\nrate = "1Mbit"\n', "step 1: duration/epoch: missing"),
    ("", "step: no steps"),
    ('[[step]]\nduration = "1s"\n', "step 1: rate: missing"),
    ('[[step]]\nduration = "1s"\nepoch = 2\nrate = "1Mbit"\n', "step 1: duration/epoch: give one"),
    ('[[step]]\nepoch = 1\nrate = "1Mbit"\n[[step]]\nduration = "1s"\nrate = "1Mbit"\n',
     "step 2: duration/epoch: step 1 uses `epoch`"),
    ('[[step]]\nepoch = 2\nrate = "1Mbit"\n[[step]]\nepoch = 2\nrate = "1Mbit"\n',
     "step 2: epoch: must be greater than step 1's epoch 2"),
    ('[[step]]\nduration = "1s"\nrate = "1Mbit"\nloss = "150%"\n', "step 1: loss: must be between"),
    ('[[step]]\nduration = "1s"\nrate = "1Mbit"\njitter = "1ms"\n', "step 1: jitter: needs a delay"),
    ('repeat = 0\n[[step]]\nduration = "1s"\nrate = "1Mbit"\n', "repeat: must be a whole number"),
    ("step = 3\n", "step: must be an array of tables"),
    ("[[step]\n", "not valid TOML"),
])
def test_bad_schedules_name_file_step_and_field(tmp_path, text, expected):
    errors = _refused(tmp_path, text)
    assert any(expected in line for line in errors), errors


def test_every_error_in_a_file_is_reported_at_once(tmp_path):
    errors = _refused(tmp_path, '[[step]]\nrate = "-1Mbit"\nfoo = 1\n[[step]]\nduration = "2"\n'
                                'rate = "1Mbit"\n')
    assert len(errors) == 4, errors  # foo, duration/epoch, rate (step 1); duration (step 2)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ScheduleError, match=r"nope\.toml: cannot read"):
        load_schedule(tmp_path / "nope.toml")


def test_time_keyed_run_applies_every_step_in_order_and_reports_it():
    schedule = parse_schedule(TWO_STEPS.replace("1.5s", "30ms").replace("500ms", "20ms"))
    shaper, reported = RecordingShaper(), []
    Emulator(schedule, shaper, on_step=reported.append).run()
    assert [s.rate_bps for s in shaper.applied] == [10e6, 5e6, 10e6, 5e6]
    assert [(r.step_index, r.round) for r in reported] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert reported == sorted(reported, key=lambda r: r.applied_at)


def test_stop_ends_a_run_early():
    schedule = parse_schedule(TWO_STEPS)
    stop = threading.Event()
    shaper = RecordingShaper()
    progress = []

    def on_progress(p):
        progress.append(p)
        stop.set()
    applied = Emulator(schedule, shaper).run(stop, on_progress=on_progress)
    assert len(applied) == 1 and len(shaper.applied) == 1
    assert progress[0].line().startswith("step 1/2 round 1/2: 10 Mbit/s | ")
    assert 0 < progress[0].step_left_s <= 1.5


def test_epoch_keyed_steps_follow_reported_epochs():
    shaper, reported = RecordingShaper(), []
    emulator = Emulator(parse_schedule(EPOCHS), shaper, on_step=reported.append)
    # period 4 epochs (last epoch 3, plus one); two rounds, then the last step stays
    rates = {}
    for epoch in range(10):
        applied = emulator.advance_epoch(epoch)
        rates[epoch] = applied.state.rate_bps if applied else None
    assert rates == {0: None, 1: 100e6, 2: None, 3: 10e6, 4: None, 5: 100e6, 6: None,
                     7: 10e6, 8: None, 9: None}
    assert [r.epoch for r in reported] == [1, 3, 5, 7]
    again = emulator.advance_epoch(3)  # a job resumed from an earlier checkpoint
    assert again is not None and (again.step_index, again.round) == (1, 0)


def test_epoch_and_time_runners_refuse_the_other_kind():
    with pytest.raises(ValueError, match="keyed by epoch"):
        Emulator(parse_schedule(EPOCHS), RecordingShaper()).run()
    with pytest.raises(ValueError, match="keyed by time"):
        Emulator(parse_schedule(TWO_STEPS), RecordingShaper()).advance_epoch(1)
