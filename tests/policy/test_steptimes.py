"""The compute and compression times (policy.steptimes)."""

from __future__ import annotations

from flexcomm.policy.steptimes import COMP_SAMPLES, COMPUTE_SAMPLES, StepTimes


def test_a_compressions_first_step_its_set_up_is_left_out() -> None:
    times = StepTimes()
    times.observe_compression("powersgd:4", 0.042)
    assert times.t_comp("powersgd:4") is None and times.timed() == []
    times.observe_compression("powersgd:4", 0.001)
    assert times.t_comp("powersgd:4") == 0.001 and times.timed() == ["powersgd:4"]


def test_a_compressions_time_is_the_median_of_its_latest_steps_so_one_stall_does_not_hold_it() -> None:
    times = StepTimes()
    for t in (0.0, 0.085, 0.002, 0.002):  # the set-up, a stall, then steady steps
        times.observe_compression("powersgd:4", t)
    assert times.t_comp("powersgd:4") == 0.002
    for _ in range(COMP_SAMPLES):
        times.observe_compression("powersgd:4", 0.003)
    assert times.comp["powersgd:4"] == [0.003] * COMP_SAMPLES


def test_the_compute_is_the_median_of_the_latest_steps() -> None:
    times = StepTimes()
    assert times.t_compute == 0.0
    for t in [1.0] * COMPUTE_SAMPLES + [0.07] * (COMPUTE_SAMPLES // 2 + 1):
        times.observe_compute(t)
    assert times.t_compute == 0.07


def test_the_state_round_trips() -> None:
    times = StepTimes()
    times.observe_compute(0.07)
    times.observe_compression("topk:0.1", 0.01)
    times.observe_compression("topk:0.1", 0.002)
    again = StepTimes.from_state(times.state_dict())
    assert again == times
    again.observe_compression("topk:0.1", 0.004)
    assert times.comp["topk:0.1"] == [0.002]  # the saved state is a copy
