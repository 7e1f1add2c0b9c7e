"""The probe scheduler: its logic under a fake clock (fake probes that advance
that clock, named as such), then for real with iperf3 between namespaces: a busy
server (back off, then success), a peer that does not answer (recorded as a
failure while probing goes on) and a test sized by its pilot that reads
the shaped rate."""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import statistics
import subprocess
import sys
import threading
import time

import pytest

from flexcomm.emulation.shaping import LinkState, Shaper
from flexcomm.lab.netns import netns_pair
from flexcomm.policy.linkestimate import LOOK_OVERREAD, QUEUED_S
from flexcomm.probe.addresses import local_addresses
from flexcomm.probe.iperf import IperfBusy, IperfError, IperfServer, IperfTimeout, IperfUnconnected
from flexcomm.probe.scheduler import (
    LOOK_AHEAD_S,
    LOOK_GROWTH,
    LOOK_HELD_S,
    LOOK_MAX_BYTES,
    LOOK_RECKONED_S,
    PILOT_BYTES,
    DutyBudget,
    ProbeConfig,
    ProbeScheduler,
    TargetLocks,
    iperf_test,
    sized_bytes,
    sized_look,
    sized_probe,
)
from flexcomm.probe.train import TrainLookError, TrainServer, train_look
from flexcomm.store import LOOK, Measurement, Store
from support.link_rate import reads_the_link
from support.names import run_prefix
from support.privilege import skip_or_fail
from support.tcp import established
from support.waiting import wait_for

PREFIX = run_prefix("fcps")
SUBNET = "10.201.0.64/26"
PORT = 5201


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeProbes:
    """Stand-ins for iperf3 and TCP connects that take fake time."""

    def __init__(self, clock: FakeClock, test_s: float = 2.0) -> None:
        self.clock = clock
        self.test_s = test_s
        self.bandwidth_calls: list[tuple[str, float]] = []
        self.latency_calls: list[tuple[str, float]] = []
        self.busy_left = 0
        self.fail_peers: set[str] = set()  # never connect (a dead peer)
        self.broken_left = 0  # tests that connect, then fail

    def bandwidth(self, peer: str) -> Measurement:
        self.bandwidth_calls.append((peer, self.clock.now))
        if self.busy_left:
            self.busy_left -= 1
            self.clock.now += 0.01
            raise IperfBusy("the server is busy running a test. try again later")
        self.clock.now += self.test_s
        if peer in self.fail_peers:
            raise IperfUnconnected(f"iperf3 to {peer}:5201: unable to connect to server")
        if self.broken_left:
            self.broken_left -= 1
            raise IperfError(f"iperf3 to {peer}:5201: the receiver reported nothing received")
        return Measurement(peer=peer, kind="bandwidth", bandwidth_bps=1e8, beta_s_per_byte=8e-8)

    def latency(self, peer: str) -> Measurement:
        self.latency_calls.append((peer, self.clock.now))
        self.clock.now += 0.005
        return Measurement(peer=peer, kind="latency", rtt_min_s=1e-4, rtt_p50_s=2e-4,
                           rtt_p99_s=3e-4, loss=0.0, alpha_s=1e-4)


def run_for(sched: ProbeScheduler, clock: FakeClock, seconds: float) -> None:
    end = clock.now + seconds
    while clock.now < end:
        delay = sched.tick()  # the probes advanced the clock meanwhile
        clock.now += delay


def make(peers, clock, probes, **config) -> ProbeScheduler:
    recorded: list[Measurement] = []
    sched = ProbeScheduler(peers, ProbeConfig(**config), bandwidth_probe=probes.bandwidth,
                           latency_probe=probes.latency, clock=clock, rng=random.Random(1),
                           on_measurement=recorded.append, locks=TargetLocks())
    sched.recorded = recorded
    return sched


def test_duty_cycle_holds_in_every_window_over_two_hours():
    clock = FakeClock()
    probes = FakeProbes(clock, test_s=1.0)
    peers = [f"10.0.0.{i}" for i in range(1, 9)]
    # whole-second tests, asked for far more often than 1% allows
    sched = make(peers, clock, probes, bandwidth_interval_s=60.0, sized_test_s=0.0)
    start = clock.now
    run_for(sched, clock, 7200)
    starts = [t for _, t in probes.bandwidth_calls]
    assert len(starts) > 20
    for t0 in starts:  # any 120 s window starting at a test: at most 1.2 s of testing
        assert sum(probes.test_s for t in starts if t0 <= t < t0 + 120) <= 1.2 + 1e-9
    assert len(starts) * probes.test_s <= 0.01 * (clock.now - start) + 1.2
    # tests never overlap (the fake clock runs one at a time; check their spacing)
    assert all(b - a >= probes.test_s - 1e-9 for a, b in itertools.pairwise(starts))
    # every peer gets its turn
    assert {p for p, _ in probes.bandwidth_calls} == set(peers)


def test_latency_probes_are_frequent_and_jittered():
    clock = FakeClock()
    probes = FakeProbes(clock)
    sched = make(["p"], clock, probes, latency_interval_s=10.0, jitter=0.1)
    run_for(sched, clock, 600)
    times = [t for _, t in probes.latency_calls]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 50 <= len(times) <= 70
    assert all(8.9 <= g <= 13.5 for g in gaps)  # 10 s +-10%, plus a bandwidth test now and then
    assert len({round(g, 3) for g in gaps}) > 10  # not lockstep


def test_busy_target_backs_off_doubling_then_succeeds():
    clock = FakeClock()
    probes = FakeProbes(clock)
    probes.busy_left = 3
    sched = make(["p"], clock, probes, backoff_s=2.0, jitter=0.0, latency_interval_s=1000.0)
    sched.request_bandwidth(["p"])
    run_for(sched, clock, 30)
    attempts = [t for _, t in probes.bandwidth_calls]
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(attempts)]
    assert gaps[:3] == [2.01, 4.01, 8.01]  # 2, 4, 8 s backoff (+ the fake 10 ms busy answer)
    assert sched.busy_count == 3
    bw = [m for m in sched.recorded if m.kind == "bandwidth"]
    assert len(bw) == 1 and bw[0].ok  # busy answers are not measurements
    assert sched.schedule["p"].failed_tries == 0


def test_a_failed_test_is_retried_on_the_backoff_and_charged():
    clock = FakeClock()
    probes = FakeProbes(clock, test_s=0.2)
    probes.broken_left = 2
    sched = make(["p"], clock, probes, backoff_s=2.0, jitter=0.0, latency_interval_s=1000.0)
    sched.request_bandwidth(["p"])
    run_for(sched, clock, 30)
    attempts = [t for _, t in probes.bandwidth_calls]
    # not 300 s later (the schedule): 2, then 4 s after each failure ended
    assert [round(b - a, 2) for a, b in itertools.pairwise(attempts)] == [2.2, 4.2]
    bw = [m for m in sched.recorded if m.kind == "bandwidth"]
    assert [m.ok for m in bw] == [False, False, True] and sched.schedule["p"].failed_tries == 0
    assert sched.budget.used_s(attempts[-1]) == pytest.approx(0.6)  # the failed ones held the link too


def test_a_dead_peer_costs_the_budget_nothing():
    clock = FakeClock()
    probes = FakeProbes(clock, test_s=0.3)
    probes.fail_peers = {"dead"}
    sched = make(["dead", "live"], clock, probes, latency_interval_s=1000.0, jitter=0.0)
    sched.request_bandwidth(["dead", "live"])
    while clock.now < 1020:
        clock.now += min(sched.tick(), 1020 - clock.now)
    tried = [p for p, _ in probes.bandwidth_calls]
    # dead: at once, then 2, 4 and 8 s later; live's test was not held off by them
    assert tried == ["dead", "live", "dead", "dead", "dead"], tried
    assert sched.budget.used_s(clock.now) == pytest.approx(0.3)  # live's test alone


def test_failed_peer_is_recorded_and_the_rest_goes_on(tmp_path):
    clock = FakeClock()
    probes = FakeProbes(clock)
    probes.fail_peers = {"dead"}
    seen: list[Measurement] = []
    with Store(tmp_path / "s.db") as store:
        sched = ProbeScheduler(["dead", "live"], ProbeConfig(bandwidth_interval_s=300.0),
                               store=store, on_measurement=seen.append, bandwidth_probe=probes.bandwidth,
                               latency_probe=probes.latency, clock=clock, rng=random.Random(2),
                               locks=TargetLocks())
        run_for(sched, clock, 1200)
        dead = store.measurements(peer="dead", kind="bandwidth")
        live = store.measurements(peer="live", kind="bandwidth")
        assert dead and not any(m.ok for m in dead) and "unable to connect" in dead[0].error
        assert len(live) >= 2 and all(m.ok for m in live)
        assert len(store.measurements(peer="live", kind="latency", limit=10**6)) > 50
    assert all(m.id is not None for m in seen), "the sink gets each measurement as stored"
    assert {m.peer for m in seen if m.kind == "bandwidth" and m.ok} == {"live"}


def test_exceptions_from_a_probe_become_failed_measurements():
    clock = FakeClock()
    probes = FakeProbes(clock)

    def broken(peer: str) -> Measurement:
        raise ValueError(f"peer: cannot resolve {peer!r}")

    sched = ProbeScheduler(["nowhere"], bandwidth_probe=probes.bandwidth, latency_probe=broken,
                           clock=clock, rng=random.Random(3), locks=TargetLocks())
    recorded = []
    sched.on_measurement = recorded.append
    run_for(sched, clock, 5)
    lat = [m for m in recorded if m.kind == "latency"]
    assert lat and not lat[0].ok and "cannot resolve" in lat[0].error


def test_a_failed_test_says_how_long_it_held_the_link():
    # the fake iperf3 connects, runs 4 s, then fails
    clock = FakeClock()
    probes = FakeProbes(clock, test_s=4.0)
    probes.broken_left = 1
    sched = make(["slow"], clock, probes)
    m = sched.measure_bandwidth("slow")
    assert not m.ok and m.duration_s == pytest.approx(4.0)
    assert sched.budget.used_s(clock.now) == pytest.approx(4.0)  # and the budget charged it


def test_the_owner_hears_of_each_bandwidth_test_before_its_measurement():
    clock = FakeClock()
    probes = FakeProbes(clock)  # fake iperf3: 2 s a test
    probes.fail_peers = {"q"}
    heard: list[tuple] = []
    sched = make(["p", "q"], clock, probes, latency_interval_s=1000.0, bandwidth_interval_s=60.0,
                 duty_cycle=0.5)
    sched.on_bandwidth_start = lambda peer, unix: heard.append(("start", peer, unix))
    sched.on_measurement = lambda m: heard.append(("measured", m.peer)) if m.kind == "bandwidth" else None
    before = time.time()
    run_for(sched, clock, 200)
    assert len(probes.bandwidth_calls) >= 4
    expected = [e for peer, _ in probes.bandwidth_calls for e in (("start", peer), ("measured", peer))]
    assert [e[:2] for e in heard] == expected  # once per test, failed ones too, each before its measurement
    assert all(before <= e[2] <= time.time() for e in heard if e[0] == "start")  # unix time, not the clock


def test_a_test_the_peers_server_turns_away_is_called_off():
    clock = FakeClock()
    probes = FakeProbes(clock)  # fake iperf3: busy once, then a 2 s test
    probes.busy_left = 1
    heard: list[tuple] = []
    sched = make(["p"], clock, probes, latency_interval_s=1000.0, bandwidth_interval_s=60.0)
    sched.on_bandwidth_start = lambda peer, unix: heard.append((peer, unix is not None))
    sched.on_measurement = lambda m: heard.append((m.peer, "measured")) if m.kind == "bandwidth" else None
    sched.request_bandwidth(["p"])
    run_for(sched, clock, 10)
    assert heard == [("p", True), ("p", False), ("p", True), ("p", "measured")]


def test_target_lock_refuses_a_second_test_to_the_same_target():
    locks = TargetLocks()
    release = threading.Event()
    started = threading.Event()

    def slow(peer: str) -> Measurement:
        started.set()
        release.wait(5)
        return Measurement(peer=peer, kind="bandwidth", bandwidth_bps=1e8)

    a = ProbeScheduler(["t"], bandwidth_probe=slow, latency_probe=slow, locks=locks)
    b = ProbeScheduler(["t", "u"], bandwidth_probe=slow, latency_probe=slow, locks=locks)
    first = threading.Thread(target=a.measure_bandwidth, args=("t",))
    first.start()
    try:
        assert started.wait(5)
        with pytest.raises(IperfBusy, match="already running"):
            b.measure_bandwidth("t")
        release.set()
        assert b.measure_bandwidth("u").ok  # another target is free
    finally:
        release.set()
        first.join()
    assert b.measure_bandwidth("t").ok  # free again once the first finished


def test_own_addresses_are_never_probed():
    clock = FakeClock()
    probes = FakeProbes(clock)
    own = sorted(local_addresses())
    sched = make(["127.0.0.1", "10.255.0.7", *own], clock, probes, bandwidth_interval_s=60.0)
    assert list(sched.schedule) == ["10.255.0.7"] and set(sched.skipped) == {"127.0.0.1", *own}
    run_for(sched, clock, 600)
    assert {p for p, _ in probes.bandwidth_calls + probes.latency_calls} == {"10.255.0.7"}
    with pytest.raises(ValueError, match=r"^peer: 127\.0\.0\.1 is an address of this host"):
        sched.measure_bandwidth("127.0.0.1")
    assert sched.request_bandwidth(["127.0.0.1"]) == float("inf")  # never probed: never comes


def test_requested_tests_run_at_once_and_sized_ones_within_the_budget():
    clock = FakeClock()
    probes = FakeProbes(clock, test_s=0.25)  # a sized test with its pilot
    sched = make(["p", "q"], clock, probes, latency_interval_s=1000.0, bandwidth_interval_s=300.0,
                 sized_test_s=0.15)
    sched.request_bandwidth(["p", "q"])
    run_for(sched, clock, 5)
    start, ran = clock.now, 0
    for i in range(60):  # a request every 10 s, far more than 1% allows
        clock.now = max(clock.now, start + 10 * i)
        wait = sched.request_bandwidth(["p", "q"])
        assert wait == pytest.approx(sched.budget.wait_for(0.3, clock.now))  # told how soon
        before = len(probes.bandwidth_calls)
        sched.tick(), sched.tick()  # the loop, woken by the request
        ran += len(probes.bandwidth_calls) - before
        budget_left = sched.budget.wait_for(0.3, clock.now) == 0  # reckoned at twice its length
        assert len(probes.bandwidth_calls) - before == 2 or not budget_left, "a request waited"
    starts = [t for _, t in probes.bandwidth_calls]
    for t0 in starts:
        assert sum(0.25 for t in starts if t0 <= t < t0 + 120) <= 1.2 + 1e-9
    assert ran >= 15  # sized: 4 tests per 120 s, where whole-second ones would allow 1


def test_looks_take_their_share_of_the_time_are_charged_to_the_budget_and_run_only_when_asked():
    clock = FakeClock()
    probes = FakeProbes(clock)
    looks: list[float] = []

    def look(peer: str) -> Measurement:  # a fake look that took 12 ms
        looks.append(clock.now)
        clock.now += 0.012
        return Measurement(peer=peer, kind="bandwidth", bandwidth_bps=1.4e9, beta_s_per_byte=8 / 1.4e9)

    sched = make(["p", "q"], clock, probes, latency_interval_s=1000.0, bandwidth_interval_s=1e6,
                 look_duty_cycle=0.005)
    sched.look_probe = look
    run_for(sched, clock, 5)
    assert not looks  # none asked for
    start = clock.now
    while clock.now < start + 60:  # a job's estimate that asks at every message
        sched.request_look(["p"])
        clock.now += min(sched.tick(), 0.2)
    assert 25 <= len(looks) <= 31  # 12 ms each, 0.5% of 60 s
    assert all(b - a >= 0.012 / 0.005 - 1e-9 for a, b in itertools.pairwise(looks))
    recorded = [m for m in sched.recorded if m.kind == LOOK]
    assert len(recorded) == len(looks) and all(m.duration_s == pytest.approx(0.012) for m in recorded)
    assert sched.budget.used_s(clock.now) == pytest.approx(0.012 * len(looks))
    run_for(sched, clock, 30)
    assert len(looks) <= len(recorded) + 1  # no more asks, at most the last one answered
    answered = len(looks)
    sched.request_look(["p"])
    sched.tick()
    clock.now += 0.1
    sched.request_look(["q"])  # within the looks' share only in 2.3 s: fresh from then
    wait = sched.tick()
    assert 2.2 < wait < 2.4
    clock.now += wait
    sched.tick()
    assert len(looks) == answered + 2
    sched.request_look(["p"])  # the pace allows the next in 2.4 s, more than it may extend an ask (2 s)
    clock.now += 2.4 + 0.9
    sched.tick()
    assert len(looks) == answered + 2  # lapsed: over a second past the 2 s the pace may add
    quiet = make(["p"], clock, probes, look_duty_cycle=0.0)
    quiet.look_probe = look
    quiet.request_look(["p"])
    run_for(quiet, clock, 10)
    assert len(looks) == answered + 2  # looks turned off


def test_follow_up_looks_run_on_a_share_of_their_own_at_another_peer_and_hold_no_paced_look_off():
    # The cnn lab: paced alone, a move one look read took the other two paths'
    # looks 1.2-2.4 s, most of a 2.7 s phase; borrowed from the pace, a round
    # left no look for 2.6 s, and the next move went unseen that long.
    clock = FakeClock()
    looks: list[tuple[str, float]] = []

    def look(peer: str) -> Measurement:  # held the link 5 ms: at 0.5%, one a second
        looks.append((peer, clock.now))
        return Measurement(peer=peer, kind=LOOK, bandwidth_bps=1e9, beta_s_per_byte=8e-9, duration_s=0.005)

    sched = make(["p", "q", "r"], clock, FakeProbes(clock), latency_interval_s=1000.0, bandwidth_interval_s=1e6,
                 look_duty_cycle=0.005)
    sched.look_probe = look
    run_for(sched, clock, 1)  # the latency probes are done
    sched.request_look(["p"])
    sched.tick()
    start = clock.now
    sched.request_look(["q"], follow_up=True)  # p read a move: the rest of the round at once
    sched.tick()
    sched.request_look(["r"], follow_up=True)
    sched.tick()
    assert looks == [("p", start), ("q", start), ("r", start)]
    sched.request_look(["r"], follow_up=True)  # the peer looked at last: at the pace
    assert sched.tick() == pytest.approx(1.0)
    sched.request_look(["p"], follow_up=True)  # the share's third look (LOOK_AHEAD_S of the pace, and one)
    sched.tick()
    assert looks[-1] == ("p", start)
    sched.request_look(["q"], follow_up=True)  # the share spent: the pace's next
    assert sched.tick() == pytest.approx(1.0)
    clock.now = start + 1.0
    sched.tick()
    assert looks[-1] == ("q", start + 1.0)  # on the pace, held off by none of the follow-ups
    while clock.now < start + 60:  # asks of both kinds at every message: each share holds
        sched.request_look(["p", "q", "r"], follow_up=clock.now < start + 30)
        clock.now += min(sched.tick(), 0.2)
    assert len(looks) <= 60 + 30 + LOOK_AHEAD_S + 2


def test_a_test_waiting_for_the_budget_does_not_hold_a_look_off():
    # The cnn lab: tests at the job's start left 0.26 s of the budget, a test asked
    # then waited 70 s for it, and no look ran meanwhile.
    clock = FakeClock()
    probes = FakeProbes(clock, test_s=0.35)
    sched = make(["p"], clock, probes, latency_interval_s=1000.0, bandwidth_interval_s=1e6)
    sched.look_probe = lambda peer: Measurement(peer=peer, kind=LOOK, bandwidth_bps=1e9, beta_s_per_byte=8e-9,
                                                duration_s=0.005)
    for _ in range(3):
        sched.request_bandwidth(["p"])
        sched.tick()
    assert len(probes.bandwidth_calls) == 3  # 1.05 s of the 1.2 s budget: the next test must wait
    sched.request_bandwidth(["p"])
    sched.request_look(["p"])
    sched.tick()
    assert len(probes.bandwidth_calls) == 3 and [m.kind for m in sched.recorded if m.kind == LOOK] == [LOOK]


def test_a_look_reads_again_with_a_larger_train_until_one_held_the_link_long_enough():
    def path(rate_bps: float, clump_bps: float, clump_bytes: int):
        """Trains cross at `clump_bps` up to `clump_bytes` (a shaper's burst), else at the rate."""
        sizes: list[int] = []

        def train(peer: str, size: int) -> Measurement:
            sizes.append(size)
            bps = clump_bps if size <= clump_bytes else rate_bps
            return Measurement(peer=peer, kind=LOOK, bandwidth_bps=bps, beta_s_per_byte=8 / bps,
                               duration_s=size * 8 / bps, bytes_sent=size)
        return train, sizes

    slow, sizes = path(20e6, 20e6, 0)
    m = sized_look(slow, "p")
    assert len(sizes) == 1 and m.bandwidth_bps == 20e6 and m.duration_s == pytest.approx(sizes[0] * 8 / 20e6)
    fast, sizes = path(980e6, 5e9, 30_000)  # the first, small train passed in one clump
    m = sized_look(fast, "p")
    assert sizes == [sizes[0], LOOK_GROWTH * sizes[0], LOOK_MAX_BYTES]  # each at most LOOK_GROWTH times
    assert m.bandwidth_bps == 980e6 and m.bytes_sent == LOOK_MAX_BYTES
    assert m.duration_s == pytest.approx(sizes[0] * 8 / 5e9 + (sizes[1] + LOOK_MAX_BYTES) * 8 / 980e6)
    clumped, sizes = path(160e6, 5e9, 30_000)  # sized by the clump, 256 KB would hold it 13 ms
    m = sized_look(clumped, "p")
    assert sizes == [sizes[0], LOOK_GROWTH * sizes[0]] and m.bandwidth_bps == 160e6
    assert m.duration_s < 0.004
    middling, sizes = path(160e6, 160e6, 0)
    sized_look(middling, "p")
    assert len(sizes) == 2 and sizes[1] == min(LOOK_GROWTH * sizes[0], int(160e6 / 8 * 2 * LOOK_HELD_S))

    def held_by_a_stall(peer: str, size: int) -> Measurement:  # the shaper's timer 3.3 ms late, as beside the suite
        return dataclasses.replace(middling(peer, size), duration_s=size * 8 / 160e6 + 0.0033)

    sizes.clear()
    m = sized_look(held_by_a_stall, "p")  # its hold says nothing of how long it read the path
    assert len(sizes) == 2 and m.bytes_sent == sizes[1] and m.duration_s > 0.0066

    def lost_after_the_first(peer: str, size: int) -> Measurement:
        if size > 20_000:
            raise TrainLookError("no answer to the look within 1 s")
        return fast(peer, size)

    m = sized_look(lost_after_the_first, "p")  # the first reading stands
    assert m.ok and m.bytes_sent < 20_000


def test_a_look_whose_first_train_is_lost_reads_nothing():
    def lost(peer: str, size: int) -> Measurement:
        raise TrainLookError("no answer to the look within 1 s")

    with pytest.raises(TrainLookError):
        sized_look(lost, "p")


def test_a_look_is_charged_the_time_its_train_held_the_link_and_an_unanswered_one_what_it_is_reckoned_at():
    clock = FakeClock()

    def look(peer: str) -> Measurement:  # 50 ms until the answer came; the train held the link 2 ms
        clock.now += 0.05
        return Measurement(peer=peer, kind=LOOK, bandwidth_bps=1e9, beta_s_per_byte=8e-9, duration_s=0.002)

    def unanswered(peer: str) -> Measurement:
        clock.now += 1.0
        raise TrainLookError("no answer to the look within 1 s")

    sched = make(["p"], clock, FakeProbes(clock), latency_interval_s=1000.0, bandwidth_interval_s=1e6,
                 look_duty_cycle=0.0025)
    sched.look_probe = look
    sched.request_look(["p"])
    sched.tick()
    (m,) = [m for m in sched.recorded if m.kind == LOOK]
    assert m.duration_s == 0.002 and sched.budget.used_s(clock.now) == pytest.approx(0.002)
    assert sched.next_look == pytest.approx(clock.now - 0.05 + 0.002 / 0.0025)  # 0.8 s after it began
    clock.now = sched.next_look
    sched.look_probe = unanswered
    sched.request_look(["p"])
    sched.tick()
    failed_look = [m for m in sched.recorded if m.kind == LOOK][-1]
    # not the 1 s wait: that would hold every look off for 400 s
    assert not failed_look.ok and "no answer" in failed_look.error
    assert failed_look.duration_s == pytest.approx(LOOK_RECKONED_S)
    assert sched.budget.used_s(clock.now) == pytest.approx(0.002 + LOOK_RECKONED_S)


def shaped_link(rate_bps: float, start_up_s: float, sizes: list, burst_bytes: int = 0):
    """A test of a link whose every test pays `start_up_s` before it moves bytes at
    `rate_bps`, the first `burst_bytes` at ten times that (a shaper's burst):
    iperf3's readings of short tests, high or low."""
    def test(peer: str, size: int | None) -> Measurement:
        sizes.append(size)
        size = size or 1 << 24
        burst = min(size, burst_bytes)
        seconds = start_up_s + 8 * (size - burst) / rate_bps + 8 * burst / (10 * rate_bps)
        return Measurement(peer=peer, kind="bandwidth", bandwidth_bps=8 * size / seconds)
    return test


@pytest.mark.parametrize("rate, burst, tests", [(1e9, 0, 2), (1e9, 64 << 10, 2), (100e6, 0, 2), (40e6, 0, 2),
                                               (20e6, 0, 1), (5e6, 0, 1)])
def test_a_pilot_sizes_the_test_by_the_path_as_it_is(rate, burst, tests):
    # Sized by what the job's estimate expected, a test of a path that had slowed ran
    # to its 4 s cut-off; one sized for a path that had quickened was repeated.
    sizes: list = []
    m = sized_probe(shaped_link(rate, 0.0, sizes, burst), 0.15)("p")  # iperf3's reading leaves out its start
    assert sizes[0] == PILOT_BYTES and len(sizes) == tests, sizes
    seconds = [8 * size / rate for size in sizes]
    assert sum(seconds) <= max(2 * 0.15, seconds[0]) + 0.05  # the budget's charge, or a slow path's pilot
    assert 0.8 * rate < m.bandwidth_bps < 1.2 * rate, m  # a pilot's reading alone only where it took long


def test_a_test_that_ran_short_of_its_size_is_sized_again_by_its_own_reading():
    # On the lab's busy host a pilot read a fifth of 1 Gbit/s; the 30 ms test it
    # sized read the shaper's burst (1.11x). Here each test waits 10 ms to start.
    sizes: list = []
    m = sized_probe(shaped_link(1e9, 0.010, sizes, 64 << 10), 0.15)("p")
    assert len(sizes) == 3 and sizes[0] == PILOT_BYTES and sizes[1] < sizes[2], sizes
    assert 0.85e9 < m.bandwidth_bps < 1e9, m


def cut_off_link(clock: FakeClock, rate_bps: float, timeout_s: float, sent_share: float, sizes: list,
                 pilot_bps: float | None = None):
    """A test of a `rate_bps` link that takes fake time and is cut off at
    `timeout_s`, its sender having sent at `sent_share` of the rate; `sizes` gets
    each test's size; a pilot reads `pilot_bps` (a burst), if given."""
    def test(peer: str, size: int | None) -> Measurement:
        sizes.append(size)
        seconds = 8 * size / rate_bps
        if pilot_bps and size == PILOT_BYTES:
            clock.now += 8 * size / rate_bps
            return Measurement(peer=peer, kind="bandwidth", bandwidth_bps=pilot_bps)
        if seconds > timeout_s:
            clock.now += timeout_s
            raise IperfTimeout("iperf3 to p:5201: no result within 4 s, ended", pid=1,
                               sent_bps=sent_share * rate_bps or None)
        clock.now += seconds
        return Measurement(peer=peer, kind="bandwidth", bandwidth_bps=rate_bps)
    return test


@pytest.mark.parametrize("sent_share", [0.75, 1.2])  # iperf3's sender read 7.4-11.4 on 10 Mbit/s
def test_a_test_sized_past_the_path_is_cut_off_and_reads_its_senders_rate(sent_share):
    clock, sizes = FakeClock(), []
    sched = make(["p"], clock, FakeProbes(clock), jitter=0.0, latency_interval_s=1000.0)
    # the pilot passed inside a policer's burst and read 470 Mbit/s, the link 10:
    # 8.8 MB would take 7 s
    sched.bandwidth_probe = sized_probe(cut_off_link(clock, 10e6, 4.0, sent_share, sizes, pilot_bps=470e6), 0.15)
    cut = sched.measure_bandwidth("p")
    assert cut.ok and cut.bandwidth_bps == sent_share * 10e6 and cut.duration_s == pytest.approx(4.0 + 0.21, abs=0.01)
    assert sizes == [PILOT_BYTES, 8_812_500], sizes


def test_a_test_cut_off_before_its_sender_settled_is_a_failure():
    clock = FakeClock()
    sched = make(["p"], clock, FakeProbes(clock))
    sched.bandwidth_probe = sized_probe(cut_off_link(clock, 10e6, 4.0, 0.0, [], pilot_bps=470e6), 0.15)
    m = sched.measure_bandwidth("p")
    assert not m.ok and "no result within" in m.error and m.duration_s == pytest.approx(4.21, abs=0.01)


def test_a_new_peers_bandwidth_is_tested_when_asked_or_on_the_schedule():
    # Tested at once, a 4-node job's three new peers spent the whole duty budget
    # at its registration, and the test its syncs asked for later waited 119 s.
    clock = FakeClock()
    probes = FakeProbes(clock, test_s=0.25)
    sched = make(["p", "q", "r"], clock, probes, latency_interval_s=10.0, bandwidth_interval_s=300.0)
    run_for(sched, clock, 30)
    assert not probes.bandwidth_calls and {p for p, _ in probes.latency_calls} == {"p", "q", "r"}
    assert sched.request_bandwidth(["q"]) == 0.0
    run_for(sched, clock, 30)
    assert [p for p, _ in probes.bandwidth_calls] == ["q"]
    run_for(sched, clock, 300)
    assert {p for p, _ in probes.bandwidth_calls} == {"p", "q", "r"}  # the schedule reaches the rest


def test_peers_can_change_while_running():
    clock = FakeClock()
    probes = FakeProbes(clock)
    sched = make([], clock, probes, latency_interval_s=10.0)
    assert sched.tick() == 10.0 and not probes.latency_calls  # nothing to probe yet
    sched.set_peers(["a", "b"])
    run_for(sched, clock, 30)
    assert {p for p, _ in probes.latency_calls} == {"a", "b"}
    kept = sched.schedule["b"]
    sched.set_peers(["b", "c"])
    assert sched.schedule["b"] is kept and "a" not in sched.schedule
    probes.latency_calls.clear()
    run_for(sched, clock, 30)
    assert {p for p, _ in probes.latency_calls} == {"b", "c"}


def waiting_on_an_event(thread: threading.Thread) -> bool:
    """Whether `thread` is blocked in threading's wait (its loop asleep)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False


def test_thread_wakes_for_new_peers_and_stops():
    seen = threading.Event()

    def latency(peer: str) -> Measurement:
        seen.set()
        return Measurement(peer=peer, kind="latency", rtt_min_s=1e-4, alpha_s=1e-4)

    sched = ProbeScheduler([], ProbeConfig(latency_interval_s=60.0), latency_probe=latency,
                           bandwidth_probe=latency, locks=TargetLocks()).start()
    try:
        wait_for(lambda: waiting_on_an_event(sched._thread))  # the loop is asleep for 60 s
        sched.set_peers(["p"])
        assert seen.wait(5), "set_peers did not wake the loop"
    finally:
        sched.stop(timeout=5)
    assert not sched._thread.is_alive()


def test_duty_budget_wait():
    budget = DutyBudget(budget_s=6.0, window_s=600.0)
    assert budget.wait_for(2.0, now=0.0) == 0.0
    budget.charge(0.0, 2.0)
    budget.charge(100.0, 3.0)
    assert budget.wait_for(1.0, now=200.0) == 0.0
    assert budget.wait_for(2.0, now=200.0) == pytest.approx(400.0)  # the first test must leave
    assert budget.used_s(now=650.0) == 3.0


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"^duty_cycle:.*less than one 1 s bandwidth test"):
        ProbeConfig(duty_cycle=0.001, budget_window_s=600)
    with pytest.raises(ValueError, match=r"^jitter:"):
        ProbeConfig(jitter=1.5)
    with pytest.raises(ValueError, match=r"^test_duration_s:"):
        ProbeConfig(test_duration_s=1.5)
    with pytest.raises(ValueError, match=r"^peers:"):
        ProbeScheduler(["10.0.0.1", ""])


# -- for real: iperf3 between namespaces --------------------------------------------

REAL = {"test_duration_s": 1.0, "latency_interval_s": 0.3, "bandwidth_interval_s": 60.0,
        "duty_cycle": 0.5, "budget_window_s": 10.0, "backoff_s": 0.5, "latency_count": 3,
        "latency_timeout_s": 0.3, "connect_timeout_s": 0.5, "look_port": PORT}


SHAPED_BPS = 100e6  # the served pair's link


@pytest.fixture(scope="module")
def served_pair():
    if os.geteuid() != 0:  # module-scoped, so it runs before the `privileged` fixture could
        skip_or_fail("needs root to create network namespaces")
    with netns_pair(PREFIX, SUBNET) as (a, b):
        Shaper(a.ifname, netns=a.ns).apply(LinkState(SHAPED_BPS))  # keeps the CPU cost of a test small
        looks = TrainServer(PORT, bind=b.address, netns=b.ns).start()  # UDP beside iperf3's TCP
        try:
            with IperfServer(PORT, netns=b.ns) as server:
                yield a, b, server
        finally:
            looks.stop()


@pytest.mark.privileged
def test_real_busy_server_backs_off_then_succeeds(privileged, iperf3_binary, served_pair, tmp_path):
    a, b, server = served_pair
    # The hog's test runs until killed, once the scheduler has found the server busy.
    hog = a.popen([iperf3_binary, "-c", b.address, "-p", str(PORT), "-t", "60"],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: established(server.pid, PORT), 15, "the hog connected")
        with Store(tmp_path / "s.db") as store:
            sched = ProbeScheduler([b.address], ProbeConfig(**REAL, netns=a.ns), store=store,
                                   locks=TargetLocks())
            sched.schedule[b.address].next_bandwidth = 0.0  # due now, while the hog runs
            wait_for(lambda: sched.tick() is not None and sched.busy_count >= 1, 15, "the server found busy")
            assert not store.measurements(kind="bandwidth"), "a busy server gives no measurement"
            hog.kill()
            wait_for(lambda: sched.tick() is not None and store.measurements(kind="bandwidth"), 30, "a measurement")
            (m,) = store.measurements(kind="bandwidth")
    finally:
        hog.kill()
        hog.wait()
    assert m.ok and reads_the_link(m.bandwidth_bps, SHAPED_BPS, b.address, PORT, a.ns), m


@pytest.mark.privileged
def test_real_dead_peer_is_recorded_and_probing_goes_on(privileged, iperf3_binary, served_pair, tmp_path):
    a, b, _ = served_pair
    dead = "10.201.0.120"  # in the pair's subnet, nobody there
    with Store(tmp_path / "s.db") as store:
        sched = ProbeScheduler([dead, b.address], ProbeConfig(**REAL, netns=a.ns), store=store,
                               locks=TargetLocks())
        sched.request_bandwidth([dead, b.address])
        sched.start()
        try:
            wait_for(lambda: len(store.measurements(kind="bandwidth")) >= 2
                       and len(store.measurements(peer=b.address, kind="latency")) >= 3)
        finally:
            sched.stop()
        failed = store.measurements(peer=dead, kind="bandwidth")  # retried on the backoff meanwhile
        (ok,) = store.measurements(peer=b.address, kind="bandwidth")
        lat = store.measurements(peer=dead, kind="latency")
    assert failed and all(not m.ok and "unable to connect" in m.error for m in failed)
    assert all(m.duration_s == 0 for m in failed)  # it never connected: nothing charged
    assert ok.ok and ok.bandwidth_bps > 50e6
    assert lat and not lat[0].ok and lat[0].loss == 1.0


@pytest.mark.privileged
def test_real_sized_test_reads_the_shaped_rate_in_a_fraction_of_a_second(privileged, iperf3_binary,
                                                                        served_pair, tmp_path):
    a, b, _ = served_pair
    with Store(tmp_path / "s.db") as store:
        sched = ProbeScheduler([b.address], ProbeConfig(**REAL, netns=a.ns), store=store,
                               locks=TargetLocks())
        for n in range(2):
            sched.request_bandwidth([b.address])
            wait_for(lambda n=n: (sched.tick() or True) and len(store.measurements(kind="bandwidth")) > n)
            m = store.measurements(kind="bandwidth")[0]
            assert m.ok and reads_the_link(m.bandwidth_bps, SHAPED_BPS, b.address, PORT, a.ns), m
            assert m.duration_s < 1.0, m  # its pilot and a 0.15 s test, start-ups included
    assert sched.budget.used_s(sched.clock()) < 2.0


@pytest.mark.privileged
def test_real_look_reads_the_shaped_path_and_is_charged_the_time_its_train_held_it(privileged, served_pair,
                                                                                  tmp_path):
    # Trains through the pair's HTB link (100 Mbit/s, 1.2x after idle for 5 ms of
    # the rate) cross at the peak: 1.167x of UDP payload beside a busy host's load
    # too, the receiving kernel's stamps timing them.
    a, b, _ = served_pair
    with Store(tmp_path / "s.db") as store:
        sched = ProbeScheduler([b.address], ProbeConfig(**REAL, netns=a.ns), store=store, locks=TargetLocks())
        sched.request_look([b.address])
        wait_for(lambda: (sched.tick() or True) and store.measurements(kind=LOOK))
        (m,) = store.measurements(kind=LOOK)
        assert not store.measurements(kind="bandwidth")
    assert m.ok, m
    assert 0.9 * SHAPED_BPS < m.bandwidth_bps < LOOK_OVERREAD * SHAPED_BPS, m
    last_train_s = m.bytes_sent * 8 / m.bandwidth_bps
    # Charged its trains, not the waits for answers. How the trains grow is
    # test_a_look_reads_again_with_a_larger_train_until_one_held_the_link_long_enough's:
    # here, beside two CPU hogs, a first train read 29 Mbit/s (late receive stamps), so
    # the second was the smallest, held the link 1.2 ms, and stood when the third's
    # answer was lost.
    assert last_train_s <= m.duration_s < 0.05, m
    assert sched.budget.used_s(sched.clock()) == pytest.approx(m.duration_s)


@pytest.mark.privileged
def test_real_look_behind_a_backlog_waits_for_its_answer_and_crosses_at_the_rate(privileged, iperf3_binary,
                                                                                  served_pair):
    # After idle the pair's link passes its 1.2x peak while 5 ms of the rate's
    # credit lasts. A train sent while a TCP flow keeps it busy waits behind the
    # flow's packets (QUEUED_S or more over an idle look's answer) and crosses at
    # the rate, under the idle one's peak.
    a, b, server = served_pair
    idle = min((train_look(b.address, PORT, 64 << 10, netns=a.ns) for _ in range(3)), key=lambda m: m.rtt_min_s)
    hog = a.popen([iperf3_binary, "-c", b.address, "-p", str(PORT), "-t", "60"],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: established(server.pid, PORT), 15, "the hog connected")
        time.sleep(1.0)  # its window grows to fill the link
        busy = [train_look(b.address, PORT, 64 << 10, netns=a.ns) for _ in range(3)]
    finally:
        hog.kill()
        hog.wait()
    assert statistics.median(m.rtt_min_s for m in busy) >= idle.rtt_min_s + QUEUED_S, (idle, busy)
    assert statistics.median(m.bandwidth_bps for m in busy) < 1.08 * SHAPED_BPS < idle.bandwidth_bps, (idle, busy)


@pytest.mark.privileged
def test_real_test_sized_for_a_far_faster_path_is_ended_and_reads_its_senders_rate(privileged, iperf3_binary,
                                                                                   served_pair, tmp_path):
    a, b, _ = served_pair
    config = ProbeConfig(**{**REAL, "connect_timeout_s": 2.0}, netns=a.ns)  # ended at 2.6 s
    sched = ProbeScheduler([b.address], config, locks=TargetLocks())
    test = iperf_test(config)
    # as after a pilot that passed in a policer's burst at 10 Gbit/s: 187 MB, 15 s on 100 Mbit/s
    sched.bandwidth_probe = lambda peer: test(peer, sized_bytes(10e9, config.sized_test_s))
    m = sched.measure_bandwidth(b.address)
    # ended: its sender's rate, which TCP's queues let run ahead of the link's
    assert m.ok and 60e6 < m.bandwidth_bps < 130e6 and m.duration_s < 4.0, m
