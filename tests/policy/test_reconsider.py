"""The MOO's reconsideration rule on its own: the settled network, the running
option's figure, and when its syncs say the link got faster."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flexcomm.policy.reconsider import RUNNING_SAMPLES, Reconsideration
from flexcomm.policy.types import NetworkObservation


def test_the_running_figure_is_the_chosen_one_then_the_median_of_its_steps() -> None:
    watch = Reconsideration()
    watch.chose("a", 0.10)
    for sync in (0.1, 0.1, 5.0, 0.1):  # one slow step among them
        watch.ran(sync, sync / 0.02)
        assert watch.sync() == 0.10
    watch.ran(0.12, 0.12 / 0.02)
    assert watch.sync() == pytest.approx(0.1)


def test_a_busy_host_is_no_fall_but_a_faster_link_is() -> None:
    watch = Reconsideration()
    watch.chose("a", None)
    for _ in range(RUNNING_SAMPLES - 1):
        watch.ran(0.2, 0.2 / 0.02)
    assert watch.fell() == 0.0 and watch.settled_level is None  # asking settles nothing
    watch.ran(0.2, 0.2 / 0.02)
    assert watch.settled_level == pytest.approx(10.0)  # its first steps settle it
    assert watch.fell() == 0.0  # where its first steps put it
    for _ in range(RUNNING_SAMPLES):  # host twice as busy: compute and sync both double
        watch.ran(0.4, 0.4 / 0.04)
    assert watch.fell() == pytest.approx(0.0)
    for _ in range(RUNNING_SAMPLES):  # the link four times as fast
        watch.ran(0.05, 0.05 / 0.02)
    assert watch.fell() == pytest.approx(0.75)


def test_a_blind_settlement_takes_the_first_network_as_news_and_states_round_trip() -> None:
    watch = Reconsideration()
    net = NetworkObservation.from_link(1e-3, 100e6, 4)
    assert not watch.moved(net, 0.1, 1e-4)  # nothing settled yet
    watch.settle_on(None)
    assert watch.blind and watch.moved(net, 0.1, 1e-4)
    watch.settle_on(net)
    assert not watch.moved(net, 0.1, 1e-4) and watch.got_faster(NetworkObservation.from_link(1e-3, 250e6, 4))
    assert "bandwidth 100 -> 50 Mbit/s" in watch.change_reason(NetworkObservation.from_link(1e-3, 50e6, 4))
    assert Reconsideration.from_state(json.loads(json.dumps(watch.state_dict()))) == watch


def test_an_estimators_figure_moved_only_when_it_counted_a_move() -> None:
    watch = Reconsideration()
    settled = NetworkObservation.from_link(1e-3, 100e6, 4)
    watch.settle_on(dataclasses.replace(settled, moves=3))
    refined = NetworkObservation.from_link(1e-3, 80e6, 4)  # 25% off, but the estimator saw no move
    assert not watch.moved(dataclasses.replace(refined, moves=3), 0.1, 1e-4)
    assert watch.moved(dataclasses.replace(settled, moves=4), 0.1, 1e-4)  # a move it counted, however small
    assert watch.moved(refined, 0.1, 1e-4)  # a figure no estimator judged: compared by the threshold
    later = NetworkObservation.from_link(5e-3, 100e6, 4)  # latency is always compared
    assert watch.moved(dataclasses.replace(later, moves=3), 0.1, 1e-4)
    assert Reconsideration.from_state(json.loads(json.dumps(watch.state_dict()))) == watch


def test_an_option_chosen_again_keeps_the_level_it_settled_at_on_this_network() -> None:
    # The budget switches between two options; the link speeds up just after a switch.
    watch = Reconsideration()
    watch.settle_on(NetworkObservation.from_link(1e-3, 20e6, 4))
    watch.chose("a", None)
    for _ in range(RUNNING_SAMPLES):
        watch.ran(0.2, 0.2 / 0.02)
    watch.chose("b", None)  # an exploring item: two steps, then back
    for _ in range(2):
        watch.ran(0.1, 0.1 / 0.02)
    watch.chose("a", None)
    assert watch.levels == {"a": pytest.approx(10.0), "b": pytest.approx(5.0)}
    for _ in range(RUNNING_SAMPLES):  # the link four times as fast, from a's first step back
        watch.ran(0.05, 0.05 / 0.02)
    assert watch.fell() == pytest.approx(0.75)
    watch.settle_on(NetworkObservation.from_link(1e-3, 80e6, 4))  # another network: levels start over
    watch.chose("a", None)
    assert watch.settled_level is None


def test_the_drift_is_how_far_the_running_syncs_moved_from_where_its_first_steps_settled() -> None:
    watch = Reconsideration()
    watch.chose("a", 0.010)  # an exploring item's lucky figure is not the level
    for sync_s in (0.020, 0.021, 0.019, 0.020, 0.022):
        assert watch.drift_s() == 0.0
        watch.ran(sync_s, 1.0)
    assert watch.drift_s() == pytest.approx(0.0)  # settled at 20 ms
    for _ in range(3):
        watch.ran(0.030, 1.0)
    assert watch.drift_s() == pytest.approx(0.010)  # the median of the latest five, 30 ms
    watch.chose("b", None)
    assert watch.drift_s() == 0.0


def test_a_state_stored_before_the_settled_sync_was_kept_loads() -> None:
    watch = Reconsideration()
    watch.chose("a", 0.01)
    for _ in range(RUNNING_SAMPLES):
        watch.ran(0.02, 1.0)
    state = json.loads(json.dumps(watch.state_dict()))
    del state["settled_sync"]
    restored = Reconsideration.from_state(state)
    assert restored.drift_s() == 0.0 and restored.sync() == pytest.approx(0.02)
    restored.ran(0.02, 1.0)  # it settles again from the restored steps
    assert restored.settled_sync == pytest.approx(0.02)
