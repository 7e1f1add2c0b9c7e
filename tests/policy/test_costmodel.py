"""The alpha-beta formulas against hand-computed values, the paper's crossover
inequalities on both sides of each boundary, and calibration."""

from __future__ import annotations

import json
import math

import pytest

from flexcomm.policy.costmodel import (
    Calibration,
    CompressionCost,
    ModelForms,
    alpha_beta_terms,
    crossover_ratio,
    option_terms,
    powersgd_split,
    predict,
    sync_time,
)
from flexcomm.policy.types import Compression, Decision, GradientLayout, LinkBucket, NetworkObservation

# N=4, alpha=1 ms, beta=1 ns/byte (1 GB/s), M=1e6 bytes, c=0.01 -> Mc=1e4; log2(4)=2
NET = NetworkObservation(alpha_s=1e-3, beta_s_per_byte=1e-9, nodes=4)
M, C = 1e6, 0.01

HAND = {
    # 2a + 2(N-1)Mb = 2e-3 + 6e-3
    ("ps", 1.0, "paper"): 2e-3 + 6 * 1e6 * 1e-9,
    # 2(N-1)a + 2(N-1)/N Mb = 6e-3 + 1.5e-3
    ("dense_ring", 1.0, "paper"): 6e-3 + 1.5e-3,
    # 2a logN + 2 logN Mb = 4e-3 + 4e-3
    ("dense_tree", 1.0, "paper"): 4e-3 + 4e-3,
    # pipelined: 2a logN + 2Mb = 4e-3 + 2e-3
    ("dense_tree", 1.0, "pipelined"): 4e-3 + 2e-3,
    # a logN + 2(N-1)Mcb = 2e-3 + 6e-5
    ("ag_topk", C, "paper"): 2e-3 + 6e-5,
    # ring: (N-1)a + (N-1) s cM b, s=2 -> 3e-3 + 6e-5
    ("ag_topk", C, "ring"): 3e-3 + 6e-5,
    # a[2(N-1)+logN] + Mcb[2(N-1)/N + logN] = 8e-3 + 1e-5*3.5
    ("art_ring", C, "paper"): 8e-3 + 3.5e-5,
    # 3a logN + 3Mcb logN = 6e-3 + 6e-5
    ("art_tree", C, "paper"): 6e-3 + 6e-5,
    # pipelined: broadcast a logN + Mcb logN, then 2a logN + 2Mcb = 2e-3+2e-5 + 4e-3+2e-5
    ("art_tree", C, "pipelined"): 6e-3 + 4e-5,
}


@pytest.mark.parametrize(("collective", "cr", "form"), sorted(HAND))
def test_formula_matches_hand_computation(collective: str, cr: float, form: str) -> None:
    forms = ModelForms(ag=form if collective == "ag_topk" else "paper",
                       tree=form if collective.endswith("tree") else "paper")
    assert sync_time(collective, M, cr, NET, forms) == pytest.approx(HAND[(collective, cr, form)], rel=1e-12)


def test_ag_ring_form_uses_value_and_index_widths() -> None:
    fp16 = ModelForms(ag="ring", value_bytes=2, index_bytes=4)  # s = 3
    assert fp16.sparse_ratio == 3
    assert sync_time("ag_topk", M, C, NET, fp16) == pytest.approx(3e-3 + 3 * 3 * 1e4 * 1e-9)


@pytest.mark.parametrize(("collective", "cr", "form"), sorted(HAND))
def test_the_terms_are_the_formula(collective: str, cr: float, form: str) -> None:
    forms = ModelForms(ag=form if collective == "ag_topk" else "paper",
                       tree=form if collective.endswith("tree") else "paper")
    messages, link_bytes = alpha_beta_terms(collective, M, cr, 4, forms)
    assert 1e-3 * messages + 1e-9 * link_bytes == pytest.approx(HAND[(collective, cr, form)], rel=1e-12)
    # What the passive estimator fits: with alpha 0 only the bytes remain.
    assert sync_time(collective, M, cr, NetworkObservation(0.0, 1.0, 4), forms) == pytest.approx(link_bytes)


# 50 Mbit/s, N=2: dense ring of M bytes puts M bytes on the link, 0.16 us a byte.
SLOW = 8 / 50e6
BUCKET = LinkBucket(peak_over_rate=1.2, burst_s=0.005)


@pytest.mark.parametrize(("m", "at_rate_s", "expected_s"), [
    (1e6, 0.16, 0.16 - 0.005),  # long: the credit is spent at the peak, then the rate; saves burst_s
    (1e4, 0.0016, 0.0016 / 1.2),  # short: all of it at the peak
    (1.875e5, 0.03, 0.025),  # the boundary: the credit lasts exactly the 25 ms at the peak
])
def test_a_token_bucket_link_sends_at_the_peak_while_its_credit_lasts(m: float, at_rate_s: float,
                                                                      expected_s: float) -> None:
    plain = NetworkObservation(0.0, SLOW, 2)
    shaped = NetworkObservation(0.0, SLOW, 2, BUCKET)
    assert sync_time("dense_ring", m, 1.0, plain) == pytest.approx(at_rate_s)
    assert sync_time("dense_ring", m, 1.0, shaped) == pytest.approx(expected_s)
    assert sync_time("dense_ring", m, 1.0, shaped) < sync_time("dense_ring", m, 1.0, plain)


def test_a_bucket_only_changes_the_bandwidth_term() -> None:
    latency_only = NetworkObservation(1e-3, 1e-15, 4, BUCKET)
    assert sync_time("art_ring", M, C, latency_only) == pytest.approx(8e-3, rel=1e-6)
    # Either half of the bucket alone leaves the link plain.
    for half in (LinkBucket(1.2, 0.0), LinkBucket(1.0, 0.005)):
        assert half.plain
        assert sync_time("dense_ring", M, 1.0, NetworkObservation(1e-3, 1e-9, 4, half)) == pytest.approx(
            HAND[("dense_ring", 1.0, "paper")], rel=1e-12)


def test_an_observation_round_trips_with_its_bucket() -> None:
    net = NetworkObservation(1e-3, 1e-9, 4, BUCKET)
    assert NetworkObservation(**json.loads(json.dumps(net.to_dict()))) == net
    assert net.to_dict()["bucket"] == {"peak_over_rate": 1.2, "burst_s": 0.005}
    # State saved before buckets existed (no "bucket" key) reads as a plain link.
    old = json.loads('{"alpha_s": 0.001, "beta_s_per_byte": 1e-09, "nodes": 4}')
    assert NetworkObservation(**old).bucket == LinkBucket()


def test_a_policy_restores_its_network_with_the_bucket() -> None:
    from flexcomm.policy.moo import MooPolicy

    policy = MooPolicy(grad_bytes=M)
    policy.observe_network(NetworkObservation(1e-3, 1e-9, 4, BUCKET))
    again = MooPolicy(grad_bytes=M)
    again.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert again.network == NetworkObservation(1e-3, 1e-9, 4, BUCKET)


def test_settings_name_themselves_and_refuse_half_a_bucket() -> None:
    names = ("peak_setting", "burst_setting")
    assert LinkBucket.checked(1.2, 0.005, names) == BUCKET
    assert LinkBucket.checked(1.0, 0.0, names) == LinkBucket()
    with pytest.raises(ValueError, match="burst_setting: needed with peak_setting"):
        LinkBucket.checked(1.2, 0.0, names)
    with pytest.raises(ValueError, match="peak_setting: needed with burst_setting"):
        LinkBucket.checked(1.0, 0.005, names)
    with pytest.raises(ValueError, match=r"peak_setting: must be in \[1.0, 16.0\]"):
        LinkBucket.checked(0.5, 0.005, names)


@pytest.mark.parametrize(("kw", "field"), [
    ({"peak_over_rate": 0.9}, "peak_over_rate"),
    ({"peak_over_rate": float("nan")}, "peak_over_rate"),
    ({"peak_over_rate": 20.0}, "peak_over_rate"),
    ({"burst_s": -0.001}, "burst_s"),
    ({"burst_s": float("inf")}, "burst_s"),
])
def test_bad_buckets_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LinkBucket(**kw)
    with pytest.raises(ValueError, match=field):
        NetworkObservation(1e-3, 1e-9, 4, kw)


PAIRS = {"ring_vs_tree": ("art_ring", "art_tree"), "ring_vs_ag": ("art_ring", "ag_topk"),
         "tree_vs_ag": ("art_tree", "ag_topk")}


@pytest.mark.parametrize("kind", sorted(PAIRS))
@pytest.mark.parametrize("n", [8, 16, 64, 256])
@pytest.mark.parametrize("c", [0.1, 0.01, 0.001])
def test_paper_crossovers_hold_on_both_sides(kind: str, n: int, c: float) -> None:
    first, second = PAIRS[kind]
    beta, m = 1e-9, 1e8
    boundary = crossover_ratio(kind, n, m, c) * beta  # alpha at which the two are equal
    assert boundary > 0
    below = NetworkObservation(boundary * 0.98, beta, n)
    above = NetworkObservation(boundary * 1.02, beta, n)
    at = NetworkObservation(boundary, beta, n)
    assert sync_time(first, m, c, below) < sync_time(second, m, c, below)
    assert sync_time(first, m, c, above) > sync_time(second, m, c, above)
    assert sync_time(first, m, c, at) == pytest.approx(sync_time(second, m, c, at), rel=1e-9)


def test_at_four_nodes_art_tree_never_beats_allgather() -> None:
    # (N-1)/logN - 3/2 = 0 at N=4: the boundary collapses to alpha/beta < 0.
    assert crossover_ratio("tree_vs_ag", 4, 1e8, 0.01) == 0
    for alpha in (0.0, 1e-6, 1e-3):
        net = NetworkObservation(alpha, 1e-9, 4)
        assert sync_time("ag_topk", 1e8, 0.01, net) <= sync_time("art_tree", 1e8, 0.01, net)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_bad_message_size_names_the_field(bad: float) -> None:
    with pytest.raises(ValueError, match="size"):
        sync_time("dense_ring", bad, 1.0, NET)


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, float("nan")])
def test_bad_cr_names_the_field(bad: float) -> None:
    with pytest.raises(ValueError, match="cr"):
        sync_time("ag_topk", M, bad, NET)


@pytest.mark.parametrize(("kw", "field"), [
    ({"alpha_s": -1e-3, "beta_s_per_byte": 1e-9, "nodes": 4}, "alpha_s"),
    ({"alpha_s": float("nan"), "beta_s_per_byte": 1e-9, "nodes": 4}, "alpha_s"),
    ({"alpha_s": 1e-3, "beta_s_per_byte": 0.0, "nodes": 4}, "beta_s_per_byte"),
    ({"alpha_s": 1e-3, "beta_s_per_byte": float("inf"), "nodes": 4}, "beta_s_per_byte"),
    ({"alpha_s": 1e-3, "beta_s_per_byte": 1e-9, "nodes": 1}, "nodes"),
])
def test_bad_network_names_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        NetworkObservation(**kw)


def test_unknown_collective_and_form_are_refused() -> None:
    with pytest.raises(ValueError, match="collective"):
        sync_time("allgather", M, C, NET)
    with pytest.raises(ValueError, match="ag_form"):
        ModelForms(ag="tree")


# A gradient of a 100 x 50 and a 10 x 10 matrix and 30 vector values: 5130 fp32 values.
LAYOUT = GradientLayout(((100, 50), (10, 10)), 30, 4)


def test_powersgd_split_follows_its_own_rule_by_hand() -> None:
    # rank 2: (100+50)*2*2 = 600 < 5000 and (10+10)*2*2 = 80 < 100: both compressed.
    s = powersgd_split(LAYOUT, 2)
    assert (s.dense_values, s.p_values, s.q_values, s.macs) == (30, 200 + 20, 100 + 20, 100 * 50 * 2 + 10 * 10 * 2)
    # rank 8: (10+10)*8*2 = 320 >= 100, so the small matrix goes dense.
    s = powersgd_split(LAYOUT, 8)
    assert (s.dense_values, s.p_values, s.q_values, s.macs) == (130, 800, 400, 100 * 50 * 8)
    # rank 100 on a 100 x 50 matrix is capped at 50, where nothing is saved: dense.
    assert powersgd_split(LAYOUT, 100).p_values == 0


def test_every_family_moves_its_own_bytes_by_hand() -> None:
    ring = 2 * 3 / 4  # B per byte of one ring AllReduce at N = 4
    assert option_terms(Compression("dense"), "dense_ring", LAYOUT, 4) == (6.0, ring * 5130 * 4)
    assert option_terms(Compression("bf16"), "dense_ring", LAYOUT, 4) == (6.0, ring * 5130 * 2)
    # PowerSGD at rank 2: P (220 values), then Q (120) with the dense 30; two AllReduces.
    assert option_terms(Compression("powersgd", 2), "dense_ring", LAYOUT, 4) == (12.0, ring * (220 + 150) * 4)
    # Top-k over AllGather, paper form: a logN + 2(N-1) M c b with the layout's value bytes.
    a, b = option_terms(Compression("topk", 0.01), "ag_topk", LAYOUT, 4)
    assert (a, b) == pytest.approx((2.0, 6 * 5130 * 4 * 0.01))
    with pytest.raises(ValueError, match="collective"):
        option_terms(Compression("powersgd", 2), "ag_topk", LAYOUT, 4)


def test_bf16_values_halve_topk_bytes() -> None:
    half = GradientLayout(LAYOUT.matrices, LAYOUT.vector_values, 2)
    full = option_terms(Compression("topk", 0.1), "ag_topk", LAYOUT, 4, ModelForms(ag="ring"))
    # ring form: (N-1) s c M with s = (value + index bytes) / value bytes
    assert full[1] == pytest.approx(3 * 2 * 0.1 * 5130 * 4)
    assert option_terms(Compression("topk", 0.1), "ag_topk", half, 4, ModelForms(ag="ring"))[1] == pytest.approx(
        3 * 3 * 0.1 * 5130 * 2)


def test_compression_cost_by_family_by_hand() -> None:
    cost = CompressionCost(per_byte=1e-9, per_selected_byte=1e-8, per_cast_byte=2e-9, per_mac=1e-10)
    m = 5130 * 4
    assert cost.seconds(Compression("dense"), LAYOUT) == 0
    assert cost.seconds(Compression("topk", 0.1), LAYOUT) == pytest.approx(1e-9 * m + 1e-8 * m * 0.1)
    assert cost.seconds(Compression("topk", 0.01), LAYOUT) < cost.seconds(Compression("topk", 0.1), LAYOUT)
    assert cost.seconds(Compression("bf16"), LAYOUT) == pytest.approx(2e-9 * m)
    assert cost.seconds(Compression("powersgd", 2), LAYOUT) == pytest.approx(1e-10 * 3 * 10200 + 1e-9 * m)
    p = predict(Compression("dense"), "dense_ring", LAYOUT, NET, comp=cost)
    assert p.comp_s == 0 and p.sync_s == pytest.approx(6e-3 + 1e-9 * 1.5 * m)


def test_calibration_learns_a_constant_factor_and_reports_error() -> None:
    cal = Calibration(decay=0.8)
    assert cal.apply("dense_ring", 1.0) == 1.0 and cal.error() == 0.0
    for pred in (0.1, 0.2, 0.4, 0.1, 0.3, 0.2):
        cal.observe("dense_ring", pred, 1.2 * pred)
    assert cal.apply("dense_ring", 0.25) == pytest.approx(0.30, rel=1e-6)
    assert cal.apply("ag_topk", 0.25) == 0.25  # other collectives untouched
    assert cal.error("dense_ring") < 0.05


def test_calibration_fits_a_fixed_overhead() -> None:
    cal = Calibration(decay=0.95)
    for pred in (0.01, 0.05, 0.1, 0.2, 0.02, 0.15, 0.08):
        cal.observe("ag_topk", pred, pred + 0.01)  # a per-call overhead the model lacks
    assert cal.apply("ag_topk", 0.3) == pytest.approx(0.31, rel=0.02)


def test_calibration_keeps_the_overhead_of_short_operations() -> None:
    """Millisecond operations with a per-call cost next to long bandwidth-bound ones
    (the shape the lab measured): the overhead is never fitted negative, so short
    predictions are not driven towards zero."""
    cal = Calibration(decay=0.95)
    pairs = [(0.0001, 0.0007), (0.0003, 0.0009), (0.002, 0.0025), (0.05, 0.052), (0.6, 0.75), (2.0, 2.6),
             (0.0002, 0.0008), (0.2, 0.22)]
    for pred, meas in pairs:
        cal.observe("ag_topk", pred, meas)
    slope, overhead = cal._fits["ag_topk"].line()
    assert overhead >= 0 and slope > 0
    assert cal.apply("ag_topk", 0.0001) > 0.0004  # the unweighted fit said about 0.0000
    assert cal.apply("ag_topk", 2.0) == pytest.approx(2.6, rel=0.15)


def test_calibration_state_of_another_weighting_is_relearned() -> None:
    cal = Calibration()
    for pred in (0.1, 0.2, 0.3):
        cal.observe("art_ring", pred, 1.5 * pred)
    old = {k: v for k, v in cal.state_dict().items() if k != "weighting"}  # as older versions saved it
    back = Calibration.from_state(old)
    assert back.decay == cal.decay and back.observations("art_ring") == 0
    assert back.apply("art_ring", 0.5) == 0.5


def test_calibration_error_is_judged_before_the_update() -> None:
    cal = Calibration(decay=0.5)
    cal.observe("dense_ring", 1.0, 1.0)
    cal.observe("dense_ring", 1.0, 2.0)  # predicted 1.0 (ratio 1) against 2.0: 50% off
    assert cal.error("dense_ring") == pytest.approx(0.5)  # the first judgement starts the average
    # The ratio through the origin, pairs weighted 1/measured and decayed by 0.5:
    # sum(w x y) / sum(w x x) = (0.5 * 1 + 0.5 * 2) / (0.5 * 1 + 0.5 * 1) = 1.5. Now
    # predicted 1.5 against 1.2: 1/4 off.
    cal.observe("dense_ring", 1.0, 1.2)
    assert cal.error("dense_ring") == pytest.approx(0.5 * 0.5 + 0.5 * 0.25)


def test_calibration_round_trips_and_refuses_bad_pairs() -> None:
    cal = Calibration()
    for pred in (0.1, 0.2, 0.3):
        cal.observe("art_ring", pred, 1.1 * pred)
    back = Calibration.from_state(cal.state_dict())
    assert back.apply("art_ring", 0.5) == cal.apply("art_ring", 0.5)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="measured_s"):
            cal.observe("art_ring", 0.1, bad)


@pytest.mark.parametrize(("kw", "field"), [
    ({"probes": ("topk:0",)}, "probes"), ({"probes": ("topk:nan",)}, "probes"),
    ({"probes": ("topk:5",)}, "probes"), ({"probes": tuple(["topk:0.1"] * 65)}, "probes"),
    ({"probes": ("bf16",)}, "probes"), ({"probes": ("powersgd:0",)}, "probes"),
    ({"version": -1}, "version"), ({"version": 1 << 53}, "version"), ({"version": 1.5}, "version"),
])
def test_a_decision_that_could_hang_ranks_is_refused(kw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Decision("topk", 0.01, "ag_topk", **kw)


@pytest.mark.parametrize(("args", "field"), [
    (("topk", 1.0, "ag_topk"), "param"), (("topk", 0.01, "dense_ring"), "collective"),
    (("powersgd", 2.5, "dense_ring"), "param"), (("powersgd", 2, "dense_tree"), "collective"),
    (("dense", 0.5, "dense_ring"), "param"), (("bf16", 0, "ps"), "collective"), (("zip", 0, "dense_ring"), "family"),
])
def test_a_family_needs_its_parameter_and_collective(args: tuple, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Decision(*args)


def test_compressions_read_and_write_their_text_form() -> None:
    for text in ("dense", "bf16", "powersgd:4", "topk:0.011", "topk:1e-05"):
        assert Compression.parse(text).name == text
    d = Decision("powersgd", 4, "dense_ring", probes=("topk:0.1", "powersgd:2"), exploring=True)
    assert Decision.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    assert d.label == "powersgd:4@dense_ring"


def test_a_fit_seen_at_one_point_extrapolates_the_faster_way() -> None:
    # A steady link: every prediction the same, so slope and overhead cannot be told
    # apart. From a fast link (per-call cost dominating) to a slow one, the gap is
    # overhead; from a slow link (the model's bandwidth 15% off) to a fast one, a ratio.
    fast, slow = Calibration(), Calibration()
    for _ in range(5):
        fast.observe("ag_topk", 0.001, 0.005)
        slow.observe("dense_ring", 0.5, 0.575)
    assert fast.apply("ag_topk", 0.001) == pytest.approx(0.005)
    assert fast.apply("ag_topk", 0.5) == pytest.approx(0.504)  # as a ratio: 2.5
    assert slow.apply("dense_ring", 0.5) == pytest.approx(0.575)
    assert slow.apply("dense_ring", 0.001) == pytest.approx(0.00115)  # as an overhead: 0.076


def test_calibration_draws_no_line_through_the_hosts_noise() -> None:
    """Fast-link pairs whose measured times are the host's (raw predictions of 1-5
    ms, measurements of 20-60 ms that they explain little of) extrapolate as the
    faster of a ratio and an overhead, not along the steep line the noise drew."""
    cal = Calibration()
    raw = [0.001, 0.002, 0.003, 0.004, 0.005] * 2
    noise = [0.015, -0.015, 0.015, -0.015, 0.015, -0.015, 0.015, -0.015, 0.015, -0.015]
    for pred, n in zip(raw, noise, strict=True):
        cal.observe("powersgd", pred, 3 * pred + 0.03 + n)
    assert cal._fits["powersgd"]._affine() is None
    # PowerSGD rank 4's 53 ms of wire at 16 Mbit/s: the wire plus the host's ~35 ms,
    # not three times the wire (0.19 s)
    assert cal.apply("powersgd", 0.053) == pytest.approx(0.053 + 0.036, rel=0.1)


def test_calibration_keeps_a_line_the_predictions_explain() -> None:
    cal = Calibration()
    for pred in (0.001, 0.05, 0.01, 0.2, 0.002, 0.1, 0.02, 0.4):
        cal.observe("dense_ring", pred, 1.3 * pred + 0.004 * (1 + 0.1 * math.sin(pred * 100)))
    assert cal._fits["dense_ring"]._affine() is not None
    assert cal.apply("dense_ring", 0.3) == pytest.approx(1.3 * 0.3 + 0.004, rel=0.05)


def test_calibration_fits_saved_without_the_spread_are_relearned() -> None:
    cal = Calibration()
    for pred in (0.1, 0.2, 0.3):
        cal.observe("art_ring", pred, 1.5 * pred)
    state = cal.state_dict()
    del state["fits"]["art_ring"]["yy"]  # as the version before saved it
    assert Calibration.from_state(state).observations("art_ring") == 0
