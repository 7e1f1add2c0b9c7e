"""An in-process policy follows the network with the estimate the agent uses:
its steps' syncs go to it, and the policy observes the network again when the
estimate moves. A policy that takes no network is left alone."""

from __future__ import annotations

import time

import pytest

from flexcomm.client.decisions import PolicySource
from flexcomm.policy import make_policy
from flexcomm.policy.costmodel import option_terms
from flexcomm.policy.types import DENSE_FP32, NetworkObservation, StepReport

GRAD_BYTES = 4_000_000


def dense_step(step: int, bandwidth_bps: float, moo) -> StepReport:
    _, beta_bytes = option_terms(DENSE_FP32, "dense_ring", moo.layout, 2)
    return StepReport(step=step, family="dense", param=0.0, collective="dense_ring", t_comp_s=0.0,
                      t_sync_s=0.003 + beta_bytes * 8 / bandwidth_bps, gain=1.0, t_compute_s=0.05)


def test_an_in_process_moo_sees_the_link_its_syncs_show():
    moo = make_policy("moo", grad_bytes=GRAD_BYTES, nodes=2)
    moo.observe_network(NetworkObservation.from_link(1e-4, 1e9, 2))
    clock = iter(float(t) for t in range(1000))
    source = PolicySource(moo, clock=lambda: next(clock))
    for step in range(6):
        source.report(dense_step(step, 20e6, moo))
    assert moo.network.bandwidth_bps == pytest.approx(20e6, rel=0.1)
    assert moo.network.alpha_s == 1e-4 and not moo.network.lower_bound  # the rest as it was given


def test_the_estimate_is_stamped_on_the_wall_clock():
    """It is saved in checkpoints and may resume on another host: a monotonic
    clock's stamps would mean nothing there."""
    moo = make_policy("moo", grad_bytes=GRAD_BYTES, nodes=2)
    moo.observe_network(NetworkObservation.from_link(1e-4, 1e9, 2))
    source = PolicySource(moo)
    before = time.time()
    source.report(dense_step(0, 1e9, moo))
    assert before <= source.estimate.confirmed <= time.time()


def test_a_policy_without_a_network_is_left_alone():
    moo = make_policy("moo", grad_bytes=GRAD_BYTES, nodes=2)
    source = PolicySource(moo)
    source.report(dense_step(0, 20e6, moo))
    assert moo.network is None and source.estimate.beta_s_per_byte is None
    static = PolicySource(make_policy("dense", grad_bytes=GRAD_BYTES, nodes=2))
    static.report(dense_step(0, 20e6, moo))
    assert static.latest().family == "dense"


def test_a_moo_given_no_network_learns_one_from_its_syncs_once_it_knows_the_world():
    """The one-line fallback when no agent answers: a MOO with no network. Given
    none and not the world, it is left alone; with the world, its syncs give it
    the link, and it follows the link's moves."""
    moo = make_policy("moo", grad_bytes=GRAD_BYTES, nodes=2)
    clock = iter(float(t) for t in range(1000))
    source = PolicySource(moo, clock=lambda: next(clock))
    source.report(dense_step(0, 20e6, moo))
    assert moo.network is None
    source.use_world(2)
    for step in range(1, 7):
        source.report(dense_step(step, 20e6, moo))
    assert moo.network.bandwidth_bps == pytest.approx(20e6, rel=0.1)
    assert moo.network.alpha_s == 0.0 and moo.network.nodes == 2
    for step in range(7, 40):
        source.report(dense_step(step, 200e6, moo))
    assert moo.network.bandwidth_bps == pytest.approx(200e6, rel=0.2)
