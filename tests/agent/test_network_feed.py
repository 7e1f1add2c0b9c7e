"""The steps a bandwidth test overlapped are marked `disturbed`, walking back
from when their message arrived by each step's own time, from the moment the
prober says a test started (failed tests included); a probe the duty budget
puts far off lets a slower move the syncs keep showing stand as a lower bound (a
real network model, the prober replaced by its answer: how long the budget makes
the test wait); and a job's estimate runs on its own training time, whatever the
agent's clock says."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import pytest

from flexcomm.agent.config import AgentConfig
from flexcomm.agent.jobs import Job
from flexcomm.agent.metrics import Metrics
from flexcomm.agent.network_feed import IN_FLIGHT_MAX_S, SHARED_GAP_S, TEST_SLACK_S, NetworkFeed, mark_disturbed
from flexcomm.agent.probing import Probing
from flexcomm.policy.jobspec import JobSpec, policy_for
from flexcomm.policy.linkestimate import PROBE, PROBE_SHARED, LinkEstimateConfig
from flexcomm.policy.types import StepReport
from flexcomm.probe.estimate import EstimateConfig, Estimator
from flexcomm.store import BANDWIDTH, LOOK, Measurement


def steps(n: int, compute_s: float = 0.1, sync_s: float = 0.1, comp_s: float = 0.0) -> list[StepReport]:
    return [StepReport(step=i, family="dense", param=0.0, collective="dense_ring", t_comp_s=comp_s,
                       t_sync_s=sync_s, gain=1.0, t_compute_s=compute_s) for i in range(n)]


def test_only_the_steps_a_test_overlapped_are_marked():
    # ten steps of 0.2 s, the last ending at 100.0: step i ran from 98.0 + 0.2 i
    reports = steps(10)
    test = (98.75, 98.85)  # with the slack either side, 98.25-99.35: steps 1 to 6
    assert TEST_SLACK_S == 0.5
    marked = mark_disturbed(reports, 100.0, [test])
    assert [r.step for r in marked if r.disturbed] == [1, 2, 3, 4, 5, 6]
    assert [r.step for r in marked] == list(range(10))
    assert mark_disturbed(reports, 100.0, [(50.0, 51.0)]) == reports  # long before: none
    assert mark_disturbed(reports, 100.0, []) == reports


def test_a_step_lasts_its_compute_its_compression_and_its_sync():
    # t_compute_s is the step's time outside compression and sync: 0.1 + 0.05 + 0.05 s a step
    reports = steps(10, compute_s=0.1, sync_s=0.05, comp_s=0.05)
    assert [r.step for r in mark_disturbed(reports, 100.0, [(98.75, 98.85)]) if r.disturbed] == [1, 2, 3, 4, 5, 6]


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


def test_a_test_that_held_the_link_briefly_disturbs_only_short_syncs():
    # A look's trains hold the link a few ms: a fall's 0.4 s syncs it overlapped
    # still read the path; a 30 ms sync it may have slowed by a tenth does not.
    slow = [dataclasses.replace(r, ended_unix=96.0 + 0.5 * r.step) for r in steps(10, sync_s=0.4)]
    fast = [dataclasses.replace(r, ended_unix=98.2 + 0.2 * r.step) for r in steps(10, sync_s=0.03)]
    assert marked(mark_disturbed(slow, 100.0, [(97.70, 97.704)])) == []  # 4 ms inside step 4
    assert marked(mark_disturbed(fast, 100.0, [(98.70, 98.704)])) == [3]
    assert marked(mark_disturbed(slow, 100.0, [(97.6, 97.9)])) == [4]  # a test held it 0.3 s


async def feed_with_job() -> tuple[NetworkFeed, Job]:
    """A feed following a dense job over 10.99.0.1 and 10.99.0.2 (neither this host's)."""
    feed = NetworkFeed(Estimator(), Metrics(), redecide=lambda _: None)
    spec = JobSpec(job_id="j", world_size=2, grad_bytes=4_000_000, nodes=("10.99.0.1", "10.99.0.2"),
                   policy="dense")
    job = Job(spec, policy_for(spec))
    await feed.add_job(job)
    return feed, job


def stamped(first: int, n: int, ended: float) -> list[StepReport]:
    """Steps first.. of 0.2 s, the first ending at `ended`, stamped by their client."""
    return [dataclasses.replace(r, step=first + r.step, ended_unix=ended + 0.2 * r.step) for r in steps(n)]


def marked(reports: list[StepReport]) -> list[int]:
    return [r.step for r in reports if r.disturbed]


def test_steps_are_marked_while_a_test_runs_and_until_it_ends():
    # A test of 10.99.0.2 started at 98.5 and has not finished: a message received
    # at 100.0 has every step that ended after the start marked.
    feed, job = asyncio.run(feed_with_job())
    feed.bandwidth_started("10.99.0.2", 98.5)
    assert marked(feed.disturbed(job, stamped(0, 10, 98.2), 100.0)) == list(range(2, 10))
    assert marked(feed.disturbed(job, steps(10), 100.0)) == list(range(10))  # unstamped: the wide slack
    # Its measurement never came (the prober stopped): after a while it marks nothing.
    later = 98.5 + IN_FLIGHT_MAX_S + 10.0
    assert marked(feed.disturbed(job, stamped(0, 10, later - 1.8), later)) == []


def test_a_test_called_off_marks_nothing():
    # The peer's server turned the test away (busy): it never ran.
    feed, job = asyncio.run(feed_with_job())
    feed.bandwidth_started("10.99.0.2", 98.5)
    feed.bandwidth_started("10.99.0.2", None)
    assert marked(feed.disturbed(job, stamped(0, 10, 98.2), 100.0)) == []


def test_the_prober_hands_a_tests_start_to_the_feed_on_the_event_loop(monkeypatch, tmp_path):
    # The scheduler is a stand-in whose thread announces one test, then its failed measurement.
    class AnnouncingScheduler:
        def __init__(self, peers: tuple[str, ...], config: object, *, store: object,
                     on_measurement: Callable, on_bandwidth_start: Callable) -> None:
            self.schedule, self.skipped = dict.fromkeys(peers), ()
            self.calls = on_bandwidth_start, on_measurement

        def start(self) -> None:
            started, measured = self.calls
            failed = Measurement(peer="10.99.0.2", kind=BANDWIDTH, ok=False, duration_s=4.0, ts=102.5,
                                 error="killed")
            threading.Thread(target=lambda: (started("10.99.0.2", 98.5), measured(failed))).start()

    async def wire() -> list[tuple[str, bool]]:
        feed, job = await feed_with_job()
        loop_thread, heard = threading.get_ident(), []

        def heard_on_loop(name: str, call: Callable) -> Callable:
            return lambda *args: (heard.append((name, threading.get_ident() == loop_thread)), call(*args))

        config = AgentConfig(socket=str(tmp_path / "agent.sock"), db=str(tmp_path / "db"), probe_serve=False)
        probing = Probing(config, on_measurement=heard_on_loop("measured", feed.measured),
                          on_bandwidth_start=heard_on_loop("started", feed.bandwidth_started))
        await probing.start(None, ["10.99.0.2"])
        while len(heard) < 2:
            await asyncio.sleep(0.01)
        assert marked(feed.disturbed(job, stamped(10, 20, 100.2), 104.1)) == [*range(10, 23)]
        return heard

    monkeypatch.setattr("flexcomm.agent.probing.ProbeScheduler", AnnouncingScheduler)
    assert asyncio.run(asyncio.wait_for(wire(), 5)) == [("started", True), ("measured", True)]


def test_a_failed_test_marks_the_steps_that_ran_while_it_held_the_link():
    # As in the lab: a test started at 98.5 on a link that had just slowed, iperf3
    # ended 4 s later with no reading, its failed measurement (stored at 102.5) saying how long it ran.
    feed, job = asyncio.run(feed_with_job())
    feed.bandwidth_started("10.99.0.2", 98.5)
    assert marked(feed.disturbed(job, stamped(0, 10, 98.2), 100.0)) == list(range(2, 10))
    feed.measured(Measurement(peer="10.99.0.2", kind=BANDWIDTH, ok=False, duration_s=4.0, ts=102.5,
                              error="iperf3 to 10.99.0.2:5201: no result within 4 s, ended"))
    # steps 10-29 ran 100.0-104.0: 10-22 during the test (22 into its end), 23-29 after it
    assert marked(feed.disturbed(job, stamped(10, 20, 100.2), 104.1)) == [*range(10, 23)]
    assert marked(feed.disturbed(job, stamped(30, 10, 104.2), 106.1)) == []


@pytest.mark.parametrize("reported_before_s", [0.2, SHARED_GAP_S + 5.0])
def test_a_test_a_job_synced_through_is_a_lower_bound_on_its_path(reported_before_s: float):
    # The job's last report came 0.2 s before the test began: it was syncing, and
    # the test had what it left of the link. One that went quiet long before: a reading.
    feed, job = asyncio.run(feed_with_job())
    start = time.time() + reported_before_s
    feed.reported(job, steps(4, sync_s=0.0), None)  # no sync time: the estimate learns nothing from them
    feed.bandwidth_started("10.99.0.2", start)
    feed.measured(Measurement(peer="10.99.0.2", kind=BANDWIDTH, ok=True, beta_s_per_byte=8 / 50e6,
                              duration_s=0.5, ts=start + 0.5))
    estimate = feed.estimator.jobs["j"]
    assert estimate.bandwidth_bps == pytest.approx(50e6)
    shared = reported_before_s < SHARED_GAP_S
    assert estimate.lower_bound == shared and estimate.evidence == (PROBE_SHARED if shared else PROBE)


def test_a_slower_move_waiting_on_a_probe_the_budget_puts_far_off_stands_as_a_lower_bound():
    async def slower_estimate(budget_wait_s: float) -> tuple[float, bool, list[float]]:
        asked: list[object] = []

        def request_probes(peers: object) -> float:
            asked.append(peers)
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


THREE_NODES = ("10.99.0.1", "10.99.0.2", "10.99.0.3")
TOPK_SYNC = dict(family="topk", param=0.01, collective="ag_topk", t_comp_s=0.0, gain=0.5)


class AskedLook(NamedTuple):
    peers: Sequence[str]
    follow_up: bool


def recording_feed() -> tuple[NetworkFeed, list[object], list[AskedLook]]:
    """A feed whose prober only records the probes and looks asked of it (the
    budget always has room)."""
    probes: list[object] = []
    looks: list[AskedLook] = []

    def request_probes(peers: object) -> float:
        probes.append(peers)
        return 0.0

    feed = NetworkFeed(Estimator(), Metrics(), redecide=lambda _: None, request_probes=request_probes,
                       request_looks=lambda peers, follow_up: looks.append(AskedLook(peers, follow_up)))
    return feed, probes, looks


def probe_of_10_99_0_2_read(feed: NetworkFeed, read_bps: float) -> None:
    """The probe asked for came back, a moment later."""
    feed.measured(Measurement(peer="10.99.0.2", kind=BANDWIDTH, ok=True, beta_s_per_byte=8 / read_bps,
                              duration_s=0.2, ts=time.time() + 0.5))


async def three_node_job(feed: NetworkFeed, grad_bytes: int, read_bps: float, read_ago_s: float) -> Job:
    """A dense job over THREE_NODES followed by `feed`, whose peers other than
    10.99.0.1 were tested at `read_bps` `read_ago_s` seconds ago, after it registered."""
    spec = JobSpec(job_id="j", world_size=3, grad_bytes=grad_bytes, nodes=THREE_NODES, policy="dense")
    job = Job(spec, policy_for(spec))
    await feed.add_job(job)
    feed.estimator.fresh_since["j"] = time.time() - 30
    for peer in THREE_NODES[1:]:
        feed.measured(Measurement(peer=peer, kind=BANDWIDTH, ok=True, beta_s_per_byte=8 / read_bps,
                                  duration_s=0.3, ts=time.time() - read_ago_s))
    return job


def test_looks_at_every_peer_of_a_job_are_its_figure_without_a_probe():
    # As above, the looks going to each of the job's three peers in turn: once
    # every path has a recent one, the slowest is the figure.
    async def recovered() -> tuple[Job, list[object]]:
        feed, probes, _ = recording_feed()
        job = await three_node_job(feed, 1_000_000, 33e6, read_ago_s=5)
        for i in range(30):
            feed.reported(job, [StepReport(step=i, t_sync_s=0.02, t_compute_s=0.1, **TOPK_SYNC)], None)
        probes.clear()
        for peer, rate in zip(THREE_NODES, (600e6, 450e6, 500e6), strict=True):
            feed.bandwidth_started(peer, time.time())
            feed.measured(Measurement(peer=peer, kind=LOOK, ok=True, beta_s_per_byte=8 / rate, duration_s=0.004,
                                      ts=time.time()))
            if peer != THREE_NODES[-1]:  # not yet every path: looks at the others, no probe
                assert job.estimate.bandwidth_bps == pytest.approx(33e6) and not probes
        return job, probes

    job, probes = asyncio.run(recovered())
    assert job.estimate.evidence == "look", (job.estimate.probe_reason, probes)
    assert not probes
    assert job.estimate.bandwidth_bps == pytest.approx(450e6)


def test_burst_sized_syncs_that_speed_up_ask_for_a_look_then_a_probe_whose_reading_is_taken():
    # The default lab's Top-k 0.01 job: its 40 KB syncs are within the link's
    # burst, so they read no rate, but their time fell when the link recovered.
    # The peers were tested at 20 Mbit/s before; a look is asked for first, and
    # where none answers (no look server at the peers) a probe, which reads one.
    async def recovered() -> tuple[NetworkFeed, list[object]]:
        feed, asked, looks = recording_feed()
        job = await three_node_job(feed, 1_000_000, 20e6, read_ago_s=20)  # its registration's tests
        asked.clear()
        quicker = [0.008, 0.007, 0.009, 0.008, 0.007, 0.009, 0.008, 0.007]
        for i, t_sync in enumerate([0.018, 0.021, 0.019, 0.020] * 6 + quicker):
            feed.reported(job, [StepReport(step=i, t_sync_s=t_sync, t_compute_s=0.01, **TOPK_SYNC)], None)
        assert looks and not asked and job.estimate.look_reason == "syncs quickened"
        for i in range(32, 32 + 400):  # 0.017 s a step: the look's probe_wait_s passes
            if asked:
                break
            feed.reported(job, [StepReport(step=i, t_sync_s=0.008, t_compute_s=0.01, **TOPK_SYNC)], None)
        assert asked and job.estimate.probe_reason == "syncs quickened"
        probe_of_10_99_0_2_read(feed, 950e6)
        return feed, asked

    feed, asked = asyncio.run(recovered())
    assert len(asked) == 1
    assert feed.estimator.jobs["j"].bandwidth_bps == pytest.approx(950e6)  # not held by 10.99.0.3's old test


def test_a_probe_asked_for_a_bounded_figure_is_not_held_by_a_peer_read_before():
    # The lab's lm job: a peer read 25 Mbit/s 2 s before the link recovered; its
    # syncs then bounded the path at "at least" hundreds of Mbit/s and asked; the
    # test of another peer read 967. The slowest of both held it at 25.
    async def recovered() -> NetworkFeed:
        no_looks = EstimateConfig(link=LinkEstimateConfig(looks=False))  # the question goes to a probe at once
        feed = NetworkFeed(Estimator(config=no_looks), Metrics(), redecide=lambda _: None,
                           request_probes=lambda p: 0.0)
        job = await three_node_job(feed, 8_000_000, 25e6, read_ago_s=2)
        for i in range(6):  # 320 KB in 12 ms: at least 200 Mbit/s
            feed.reported(job, [StepReport(step=i, t_sync_s=0.012, t_compute_s=0.1, **TOPK_SYNC)], None)
        assert job.estimate.lower_bound and job.estimate.suspects_move
        probe_of_10_99_0_2_read(feed, 967e6)
        return feed

    feed = asyncio.run(recovered())
    assert feed.estimator.jobs["j"].bandwidth_bps == pytest.approx(967e6)



def test_syncs_blind_to_the_path_ask_for_a_look_and_a_look_that_read_a_move_asks_for_the_other_paths():
    # The cnn lab's MOO on PowerSGD rank 2 after a 33 Mbit/s phase: burst-sized
    # syncs at a steady pace whatever the link does. A look at one of the job's
    # peers finds the recovery, which it cannot say for the other paths: looks at
    # those are asked for (a few ms each), and a probe only when they do not come.
    async def recovered() -> tuple[NetworkFeed, list[object]]:
        feed, probes, looks = recording_feed()
        job = await three_node_job(feed, 1_000_000, 33e6, read_ago_s=5)
        probes.clear()
        for i in range(30):  # 0.12 s steps: 3.6 s of the job's time, each at the same pace
            feed.reported(job, [StepReport(step=i, t_sync_s=0.02, t_compute_s=0.1, **TOPK_SYNC)], None)
        assert looks and not probes
        assert not any(ask.follow_up for ask in looks)  # blind syncs: looks at the pace
        peer = looks[-1].peers[0]
        feed.bandwidth_started(peer, time.time())
        feed.measured(Measurement(peer=peer, kind=LOOK, ok=True, beta_s_per_byte=8 / 600e6,
                                  duration_s=0.01, ts=time.time()))
        assert feed.estimator.peer(peer).bandwidth_bps != pytest.approx(600e6)  # not the probed rate
        assert not probes and looks[-1].peers != [peer]  # the next look goes to a peer not looked at yet
        assert looks[-1].follow_up  # the rest of the round may run ahead of the pace
        for i in range(30, 80):  # 6 s of steps, and the other paths' looks never come
            feed.reported(job, [StepReport(step=i, t_sync_s=0.02, t_compute_s=0.1, **TOPK_SYNC)], None)
        feed.measured(Measurement(peer=peer, kind=LOOK, ok=True, beta_s_per_byte=8 / 600e6,
                                  duration_s=0.01, ts=time.time()))
        assert probes and job.estimate.probe_reason == "a look read faster"
        probe_of_10_99_0_2_read(feed, 450e6)
        return feed, probes

    feed, probes = asyncio.run(recovered())
    assert len(probes) == 1
    assert feed.estimator.jobs["j"].bandwidth_bps == pytest.approx(450e6)  # not held by 10.99.0.3's old test
