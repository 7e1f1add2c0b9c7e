"""A step's sync time counts each moment a collective was in flight once."""

from __future__ import annotations

import pytest

from flexcomm.client.stats import StepStats


def test_sync_time_is_the_union_of_the_intervals_in_flight():
    stats = StepStats(0, "dense", 0.0, "dense_ring", 1)
    # Three buckets queued on the backend: each waits for the one before.
    stats.sync_intervals += [(0.0, 1.0), (0.5, 2.0), (0.6, 3.0), (5.0, 5.5)]
    assert stats.t_sync_s == pytest.approx(3.0 + 0.5)  # not 1 + 1.5 + 2.4 + 0.5
    stats.add(t_comp_s=0.25)
    assert stats.t_comp_s == 0.25
