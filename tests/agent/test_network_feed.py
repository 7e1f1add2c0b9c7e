"""The steps a bandwidth test overlapped are marked `disturbed`, walking back
from when their message arrived by each step's own time."""

from __future__ import annotations

from flexcomm.agent.network_feed import TEST_SLACK_S, mark_disturbed
from flexcomm.policy.types import StepReport


def steps(n: int, compute_s: float = 0.1, sync_s: float = 0.1, comp_s: float = 0.0) -> list[StepReport]:
    return [StepReport(step=i, family="dense", param=0.0, collective="dense_ring", t_comp_s=comp_s,
                       t_sync_s=sync_s, gain=1.0, t_compute_s=compute_s) for i in range(n)]


def test_only_the_steps_a_test_overlapped_are_marked():
    # ten steps of 0.2 s, the last ending at 100.0: step i ran from 98.0 + 0.2 i
    reports = steps(10)
    test = (98.65 + TEST_SLACK_S, 98.95 - TEST_SLACK_S)  # with the slack, 98.65-98.95: steps 3 and 4
    marked = mark_disturbed(reports, 100.0, [test])
    assert [r.step for r in marked if r.disturbed] == [3, 4]
    assert [r.step for r in marked] == list(range(10))
    assert mark_disturbed(reports, 100.0, [(50.0, 51.0)]) == reports  # long before: none
    assert mark_disturbed(reports, 100.0, []) == reports


def test_a_step_lasts_its_compute_its_compression_and_its_sync():
    # t_compute_s is the step's time outside compression and sync: 0.1 + 0.05 + 0.05 s a step
    reports = steps(10, compute_s=0.1, sync_s=0.05, comp_s=0.05)
    test = (98.65 + TEST_SLACK_S, 98.95 - TEST_SLACK_S)
    assert [r.step for r in mark_disturbed(reports, 100.0, [test]) if r.disturbed] == [3, 4]
