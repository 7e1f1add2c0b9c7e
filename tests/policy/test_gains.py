"""The gain figures (policy.gains): smoothed per step elapsed, probes apart from deliveries."""

from __future__ import annotations

import pytest

from flexcomm.policy.gains import GainFigures
from flexcomm.policy.types import Choice, Compression

TOPK_AG = Choice(Compression("topk", 0.1), "ag_topk")
TOPK_TREE = Choice(Compression("topk", 0.1), "art_tree")
TOPK_TREE_SMALL = Choice(Compression("topk", 0.01), "art_tree")
RANK4 = Choice(Compression("powersgd", 4), "dense_ring")
RANK2 = Choice(Compression("powersgd", 2), "dense_ring")


def test_a_figure_read_every_tenth_step_settles_as_fast_in_steps_as_one_read_every_step() -> None:
    every, tenth = GainFigures(0.05), GainFigures(0.05)
    every.probe("topk:0.1", 0.9, 0)
    tenth.probe("topk:0.1", 0.9, 0)
    for step in range(1, 101):
        every.probe("topk:0.1", 0.3, step)
        if step % 10 == 0:
            tenth.probe("topk:0.1", 0.3, step)
    assert every.probed["topk:0.1"] < 0.35
    assert tenth.probed["topk:0.1"] == pytest.approx(every.probed["topk:0.1"], abs=0.01)


def test_probes_and_deliveries_are_separate_figures() -> None:
    gains = GainFigures(0.05)
    gains.probe("topk:0.1", 0.5, 0)
    gains.deliver(TOPK_TREE.label, 0.07, 0)
    assert gains.probed == {"topk:0.1": 0.5} and gains.delivered == {TOPK_TREE.label: 0.07}


def test_an_untimed_option_is_expected_to_deliver_as_its_family_delivered_over_its_collective() -> None:
    gains = GainFigures(0.05)
    gains.probe("topk:0.1", 0.5, 0)
    gains.probe("topk:0.01", 0.2, 0)
    gains.deliver(TOPK_TREE.label, 0.1, 0)  # a fifth of its probes' reading
    gains.deliver(TOPK_AG.label, 0.6, 0)  # more than its probes read: capped at 1
    ratios = gains.delivery_ratios({c.label: c for c in (TOPK_AG, TOPK_TREE, TOPK_TREE_SMALL)})
    assert ratios == {("topk", "art_tree"): pytest.approx(0.2), ("topk", "ag_topk"): 1.0}
    assert gains.expected(TOPK_TREE_SMALL, ratios) == pytest.approx(0.04)
    assert gains.expected(TOPK_TREE, ratios) == 0.1  # measured: as delivered
    assert gains.expected(RANK2, ratios) is None  # nothing read


def test_deliveries_of_options_no_longer_candidates_set_no_ratio() -> None:
    gains = GainFigures(0.05)
    gains.probe("topk:0.1", 0.5, 0)
    gains.deliver(TOPK_TREE.label, 0.1, 0)
    assert gains.delivery_ratios({TOPK_AG.label: TOPK_AG}) == {}


def test_a_rank_is_priced_as_its_share_of_its_family_references_probes() -> None:
    gains = GainFigures(0.05)
    assert gains.share_of(RANK2, RANK4, 0.9) is None  # no probe read yet
    gains.probe("powersgd:4", 0.5, 0)
    gains.probe("powersgd:2", 0.3, 0)
    assert gains.share_of(RANK2, RANK4, 0.9) == pytest.approx(0.54)
    assert gains.share_of(RANK4, RANK4, 0.9) == 0.9  # the reference keeps what it is said to
    gains.probe("powersgd:2", 1.0, 1000)
    assert gains.share_of(RANK2, RANK4, 0.9) == 1.0  # never more than all


def test_the_state_round_trips() -> None:
    gains = GainFigures(0.05)
    gains.probe("topk:0.1", 0.5, 3)
    gains.deliver(TOPK_AG.label, 0.4, 4)
    again = GainFigures.from_state(gains.state_dict(), 0.05)
    assert again == gains
    again.probe("topk:0.1", 0.1, 13)
    gains.probe("topk:0.1", 0.1, 13)
    assert again.probed == gains.probed
