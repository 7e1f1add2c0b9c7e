"""alpha/beta estimation: smoothing, the bottleneck, passive fits, change detection."""

from __future__ import annotations

import pytest

from flexcomm.policy.costmodel import sync_time
from flexcomm.policy.types import NetworkObservation
from flexcomm.probe.estimate import (
    ChangeDetector,
    Estimator,
    SyncObservation,
    fit_alpha_beta,
    relative_change,
    sync_observation,
)
from flexcomm.store import Measurement

ALPHA = 5e-4
BETA = 8 / 100e6  # 100 Mbit/s


def test_active_measurements_set_alpha_and_beta_with_smoothing():
    est = Estimator(smoothing=0.5)
    est.observe(Measurement(peer="p", kind="bandwidth", bandwidth_bps=100e6, beta_s_per_byte=8e-8))
    est.observe(Measurement(peer="p", kind="latency", rtt_p50_s=1e-3, alpha_s=5e-4))
    assert est.peer("p").beta_s_per_byte == 8e-8 and est.peer("p").alpha_s == 5e-4
    est.observe(Measurement(peer="p", kind="bandwidth", bandwidth_bps=50e6, beta_s_per_byte=16e-8))
    assert est.peer("p").beta_s_per_byte == pytest.approx(12e-8)  # halfway: smoothing 0.5
    est.observe(Measurement(peer="p", kind="bandwidth", ok=False, error="timed out"))
    assert est.peer("p").beta_samples == 2  # a failed probe carries nothing


def test_bottleneck_takes_worst_alpha_and_beta_and_waits_for_every_peer():
    est = Estimator()
    est.observe_beta("fast", 8e-9)
    est.observe_alpha("fast", 2e-3)  # fast link, far away
    assert est.bottleneck(["fast", "slow"]) is None  # slow not measured yet: could be the bottleneck
    est.observe_beta("slow", 8e-8)
    est.observe_alpha("slow", 1e-4)
    net = est.bottleneck(["fast", "slow"])
    assert net == NetworkObservation(alpha_s=2e-3, beta_s_per_byte=8e-8, nodes=3)
    assert est.bottleneck(["fast", "slow"], nodes=8).nodes == 8
    with pytest.raises(ValueError, match=r"^peers:"):
        est.bottleneck([])


def test_sync_observation_coefficients_are_the_paper_forms():
    # N = 4, M = 16 MB, log2 N = 2, by hand from the paper's forms
    expected = {("dense_ring", 1.0): (2 * 3, 2 * 3 / 4 * 16e6),  # 2(N-1) a + 2(N-1)/N M b
                ("ag_topk", 0.01): (2, 2 * 3 * 16e6 * 0.01),  # a logN + 2(N-1) M c b
                ("art_tree", 0.1): (3 * 2, 3 * 16e6 * 0.1 * 2)}  # 3 a logN + 3 M c b logN
    for (collective, cr), (alpha_coeff, beta_bytes) in expected.items():
        obs = sync_observation(collective, 16e6, cr, 4, 0.25)
        assert (obs.alpha_coeff, obs.beta_bytes, obs.seconds) == pytest.approx((alpha_coeff, beta_bytes, 0.25))


def test_passive_fit_recovers_alpha_and_beta_from_two_sizes():
    net = NetworkObservation(ALPHA, BETA, 4)
    observations = [sync_observation("dense_ring", m, 1.0, 4, sync_time("dense_ring", m, 1.0, net))
                    for m in (1e4, 1e5, 1e6, 1e7)]
    alpha, beta = fit_alpha_beta(observations)
    assert alpha == pytest.approx(ALPHA, rel=1e-6) and beta == pytest.approx(BETA, rel=1e-6)
    same_size = [observations[0]] * 3
    assert fit_alpha_beta(same_size) is None  # cannot tell alpha from beta


def test_passive_observations_feed_the_same_estimate():
    net = NetworkObservation(ALPHA, BETA, 4)
    est = Estimator(smoothing=1.0)  # no smoothing: the estimate is the last contribution
    est.observe_alpha("job", ALPHA)
    t = sync_time("dense_ring", 4e6, 1.0, net)
    alpha, beta = est.observe_sync("job", sync_observation("dense_ring", 4e6, 1.0, 4, t))
    assert alpha is None and beta == pytest.approx(BETA)  # one size: charged to beta given alpha
    t2 = sync_time("dense_ring", 4e4, 1.0, net)
    alpha, beta = est.observe_sync("job", sync_observation("dense_ring", 4e4, 1.0, 4, t2))
    assert alpha == pytest.approx(ALPHA) and est.peer("job").beta_s_per_byte == pytest.approx(BETA)


def test_bad_passive_observation_names_the_field():
    with pytest.raises(ValueError, match=r"^seconds:"):
        SyncObservation(1.0, 1.0, -1.0)
    with pytest.raises(ValueError, match=r"^beta_bytes:"):
        SyncObservation(1.0, 0.0, 1.0)


def test_change_detector_fires_at_threshold_and_moves_its_reference():
    det = ChangeDetector(threshold=0.1, alpha_floor_s=1e-4)
    assert det.update(1e-3, 8e-8) is False  # first sight is the reference
    assert det.update(1.05e-3, 8.4e-8) is False  # 5%
    assert det.update(1e-3, 8.8e-8) is True  # beta +10%
    assert det.update(1e-3, 8.8e-8 * 1.05) is False  # measured from the new reference
    assert det.update(1.2e-3, 8.8e-8) is True  # alpha +20%, 200 us
    small = ChangeDetector(threshold=0.1, alpha_floor_s=1e-4)
    small.update(5e-5, 8e-8)
    assert small.update(8e-5, 8e-8) is False  # +60% but only 30 us: jitter


def test_relative_change():
    assert relative_change(2.0, 2.2) == pytest.approx(0.1)
    assert relative_change(0.0, 0.0) == 0.0
    assert relative_change(0.0, 1.0) == float("inf")
