"""A step's statistics: its sync time counts each moment a collective was in
flight once, and figures of device work are folded in only once the device has
done it, without the step waiting for it."""

from __future__ import annotations

import time

import pytest
import torch

from flexcomm.client.device import HOST_CLOCK
from flexcomm.client.stats import StepStats
from support.client_ranks import run_ranks


def test_sync_time_is_the_union_of_the_intervals_in_flight():
    stats = StepStats(0, "dense", 0.0, "dense_ring", 1)
    # Three buckets queued on the backend: each waits for the one before.
    for start, end in [(10.0, 11.0), (10.5, 12.0), (10.6, 13.0), (15.0, 15.5)]:
        stats.span("t_sync_s", HOST_CLOCK, start, end)
    stats.span("t_comp_s", HOST_CLOCK, 1.0, 1.25)
    assert stats.t_sync_s == pytest.approx(3.0 + 0.5)  # not 1 + 1.5 + 2.4 + 0.5
    assert stats.t_comp_s == 0.25


def test_compute_time_stays_positive_when_spans_overlap_or_are_stamped_late():
    """What a CPU hog does to a DDP step: bucket 2 is compressed while bucket 1 is
    in flight, and bucket 2's arrival is stamped after the next step began. Summed,
    the busy time exceeds the period (compute used to come out 0); counted once and
    inside the period, compute is what no span covered."""
    stats = StepStats(0, "topk", 0.1, "ag_topk", 1, began=100.0)
    for name, start, end in [("t_comp_s", 100.10, 100.30), ("t_sync_s", 100.30, 100.70),
                             ("t_comp_s", 100.35, 100.65), ("t_sync_s", 100.65, 101.05)]:
        stats.span(name, HOST_CLOCK, start, end)
    next_began = 101.0
    assert stats.resolve()
    assert stats.t_comp_s + stats.t_sync_s > next_began - stats.began
    assert stats.compute_s(next_began) == pytest.approx(0.10)  # [100.0, 100.1] alone
    assert stats.t_sync_s == pytest.approx(0.75)  # the sync figure itself is unchanged


def test_compute_time_on_a_device_clock_is_the_period_less_the_union():
    clock = HeldClock()
    stats = StepStats(0, "dense", 0.0, "dense_ring", 1, began=10.0)
    stats.span("t_comp_s", clock, 1.0, 1.2)
    stats.span("t_sync_s", clock, 1.1, 1.5)
    clock.released = 2.0
    assert stats.resolve()
    assert stats.compute_s(11.0) == pytest.approx(1.0 - 0.5)
    assert stats.compute_s(10.4) == 0.0  # not positive: unknown


class HeldClock:
    """Stands in for CUDA events (this machine has no GPU): host-clock marks that
    count as completed only once the test releases them, as a GPU finishes work
    after the host launched it. Waiting for a mark (closing) releases it."""

    def __init__(self) -> None:
        self.released = float("-inf")

    def mark(self) -> float:
        return time.perf_counter()

    def done(self, mark: float) -> bool:
        return mark <= self.released

    def wait(self, mark: float) -> None:
        self.released = max(self.released, mark)

    def seconds(self, start: float, end: float) -> float:
        return end - start


class Reports:
    """A decision source that runs Top-k at 0.1 over AR-Topk's ring and keeps what it is told."""

    def __init__(self) -> None:
        self.reports = []

    def latest(self):
        from flexcomm.policy.types import Decision

        return Decision("topk", 0.1, "art_ring")

    def report(self, report) -> None:
        self.reports.append(report)

    def close(self) -> None:
        pass


def steps_on_a_held_clock(rank: int, world: int) -> dict:
    """GradientSync on 2 ranks whose device work completes only when released:
    nothing is folded in or reported while held, no step waits, and once released
    the figures come in order and add up to the wall time between step starts."""
    from torch import nn

    from flexcomm.client import device
    from flexcomm.client.sync import GradientSync

    clock = device.CLOCKS["cpu"] = HeldClock()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(30, 40), nn.ReLU(), nn.Linear(40, 4))
    source = Reports()
    sync = GradientSync(model, source=source)
    starts, held = [], []
    for _ in range(6):
        model(torch.randn(8, 30)).sum().backward()
        starts.append(time.perf_counter())
        sync.synchronize()
        held.append((len(sync.history), len(source.reports)))
    clock.released = time.perf_counter()
    model(torch.randn(8, 30)).sum().backward()
    sync.synchronize()  # step 6 starts: steps 0-5 are done and have a successor
    after_release = (len(sync.history), [r.step for r in source.reports])
    sync.close()
    return {"held": held, "after_release": after_release, "starts": starts,
            "reports": [(r.step, r.t_compute_s, r.t_comp_s + r.t_sync_s, r.gain) for r in source.reports],
            "history": [(s.step, s.t_sync_s, s.gain) for s in sync.history]}


@pytest.mark.timeout(120)
def test_statistics_wait_for_the_device_without_waiting_the_step():
    per_rank = run_ranks(2, "client/test_stats.py:steps_on_a_held_clock", timeout=100)
    first = per_rank[0]
    assert first["held"] == [(0, 0)] * 6  # nothing folded in, nothing reported, no step blocked
    assert first["after_release"] == (6, [0, 1, 2, 3, 4, 5])
    assert [r[0] for r in first["reports"]] == list(range(7))  # closing waited for the last one
    starts = first["starts"]
    for step, compute, busy, gain in first["reports"][:5]:
        # compute + compression + sync is the wall time from this step's start to the next one's
        assert compute + busy == pytest.approx(starts[step + 1] - starts[step], abs=2e-3), step
        assert busy > 0 and 0 < gain < 1
    assert first["reports"][6][1] == 0.0  # the last step: no next one, compute unknown
    assert all(t_sync > 0 for _, t_sync, _ in per_rank[1]["history"])
