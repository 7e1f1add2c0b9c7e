"""The steps a bandwidth test overlapped are marked `disturbed`, walking back
from when their message arrived by each step's own time; a probe the duty budget
puts far off lets a slower move the syncs keep showing stand as a lower bound (a
real network model, the prober replaced by its answer: how long the budget makes
the test wait); and a job's estimate runs on its own training time, whatever the
agent's clock says."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from flexcomm.agent.jobs import Job
from flexcomm.agent.metrics import Metrics
from flexcomm.agent.network_feed import TEST_SLACK_S, NetworkFeed, mark_disturbed
from flexcomm.policy.jobspec import JobSpec, policy_for
from flexcomm.policy.types import StepReport
from flexcomm.probe.estimate import Estimator


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


def test_steps_the_client_stamped_are_placed_by_their_stamps_with_a_narrow_slack():
    # The same ten steps, stamped (the last ended at 100.0), in a message that
    # arrived 1.5 s later (an agent busy with other jobs): the test at
    # 98.65-98.95 overlapped steps 3 and 4, and a 0.05 s slack adds none.
    reports = [dataclasses.replace(r, ended_unix=98.2 + 0.2 * r.step) for r in steps(10)]
    test = (98.65, 98.95)
    assert [r.step for r in mark_disturbed(reports, 101.5, [test]) if r.disturbed] == [3, 4]
    unstamped = steps(10)  # reckoned back from the arrival, 1.5 s late: the slack misses them
    assert not any(r.disturbed for r in mark_disturbed(unstamped, 101.5, [test]))
    # A stamp ahead of the agent's clock is another host's: reckoned back instead.
    ahead = [dataclasses.replace(r, ended_unix=r.ended_unix + 5.0) for r in reports]
    def marked(reports: list[StepReport], received: float) -> list[int]:
        return [r.step for r in mark_disturbed(reports, received, [test]) if r.disturbed]

    assert marked(ahead, 99.5) == marked(unstamped, 99.5) == [3, 4, 5, 6, 7, 8, 9]


def test_a_slower_move_waiting_on_a_probe_the_budget_puts_far_off_stands_as_a_lower_bound():
    async def slower_estimate(budget_wait_s: float) -> tuple[float, bool, list[float]]:
        asked: list[float] = []

        def request_probes(peers: object, expected_bps: float | None) -> float:
            asked.append(expected_bps or 0.0)
            return budget_wait_s

        feed = NetworkFeed(Estimator(), Metrics(), redecide=lambda _: None, request_probes=request_probes)
        spec = JobSpec(job_id="j", world_size=2, grad_bytes=4_000_000, nodes=("10.99.0.1", "10.99.0.2"),
                       policy="dense")
        job = Job(spec, policy_for(spec))
        await feed.add_job(job)
        estimate = feed.estimator.jobs["j"]
        estimate.observe_probe(8 / 1e9, 0.0)
        sync = dict(family="topk", param=0.01, collective="ag_topk", t_comp_s=0.0, gain=0.5)
        for i in range(30):  # Top-k 0.01 of 4 MB over 2 nodes on 1 Gbit/s, 2 ms of overhead; 0.2 s steps
            feed.reported(job, [StepReport(step=i, t_sync_s=0.0027, t_compute_s=0.1973, **sync)], None)
        # 200 Mbit/s: its bytes explain too little to stand alone, so a probe is asked
        # for; the syncs show the same for the next 6 s (of the job's clock)
        for t in range(7):
            feed.reported(job, [StepReport(step=40 + 4 * t + i, t_sync_s=0.0052, t_compute_s=0.2448, **sync)
                                for i in range(4)], None)
        return estimate.bandwidth_bps, estimate.lower_bound, asked

    soon, late = asyncio.run(slower_estimate(1.0)), asyncio.run(slower_estimate(110.0))
    assert soon[2] and late[2]
    assert soon[0] == pytest.approx(1e9, rel=0.05) and not soon[1]  # the probe will say, within 5 s
    assert 100e6 < late[0] <= 200e6  # at least what crossed (then read against it), until the probe comes


def test_a_jobs_estimate_follows_its_reports_not_the_agents_clock(monkeypatch):
    # Two agents fed the same reports, one taking each message up to 0.9 s later
    # (a restart, a loaded host): a Top-k job whose syncs only bound the link
    # keeps the bounds of the last `bound_window_s` of its own training time.
    async def estimate(lag_s: list[float]) -> dict:
        clock = iter([1000.0 + 0.4 * i + lag for i, lag in enumerate(lag_s)])
        feed = NetworkFeed(Estimator(), Metrics(), redecide=lambda _: None)
        spec = JobSpec(job_id="j", world_size=2, grad_bytes=4_000_000, nodes=("10.99.0.1", "10.99.0.2"),
                       policy="dense")
        job = Job(spec, policy_for(spec))
        await feed.add_job(job)
        sync = dict(family="topk", param=0.1, collective="ag_topk", t_comp_s=0.0, gain=0.5)
        for i, t_sync in enumerate([0.0065, 0.012, 0.0071, 0.03, 0.0068, 0.02] * 4):
            monkeypatch.setattr("flexcomm.agent.network_feed.time.time", lambda: next(clock))
            feed.reported(job, [StepReport(step=i, t_sync_s=t_sync, t_compute_s=0.1, **sync)], None)
        return feed.estimator.jobs["j"].state_dict()

    steady, lagging = asyncio.run(estimate([0.0] * 30)), asyncio.run(estimate([0.9 * (i % 2) for i in range(30)]))
    assert steady["lower_bound"] and steady["moves"] >= 1
    assert lagging == steady
