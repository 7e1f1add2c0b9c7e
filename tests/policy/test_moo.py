"""The MOO policy: candidate grid, choices at the extremes, re-exploration,
hysteresis, persistence, determinism and input validation."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexcomm.policy import make_policy, policy_from_state
from flexcomm.policy.costmodel import crossover_ratio
from flexcomm.policy.moo import EXPLOIT, EXPLORE, MooConfig, MooPolicy, candidate_crs
from flexcomm.policy.types import NetworkObservation, StepReport
from support.policy_sim import Job, gain_curve

M = 16e6  # a 4M-parameter fp32 model


def settle(policy: MooPolicy, job: Job, latency: float, bw: float, steps: int = 60) -> None:
    job.run(steps, latency, bw)
    assert policy.phase == EXPLOIT


def test_default_candidate_grid_is_the_papers() -> None:
    assert candidate_crs(0.001, 0.1, 3) == (0.1, 0.033, 0.011, 0.004, 0.001)
    assert MooConfig().crs == (0.1, 0.033, 0.011, 0.004, 0.001)
    assert candidate_crs(0.01, 0.01, 3) == (0.01,)


def test_dense_when_bandwidth_is_high_and_compression_is_expensive() -> None:
    policy = MooPolicy(M)
    job = Job(policy, M, t_comp=lambda cr: 0.0 if cr == 1.0 else 0.05)
    settle(policy, job, 50e-6, 100e9)
    d = policy.decide()
    assert (d.collective, d.cr) == ("dense_ring", 1.0), d.reason


def test_small_cr_when_bandwidth_is_low() -> None:
    policy = MooPolicy(M)
    job = Job(policy, M)
    settle(policy, job, 1e-3, 10e6)
    d = policy.decide()
    assert d.cr <= 0.011 and d.collective != "dense_ring", d.reason


def test_choice_follows_the_network_both_ways() -> None:
    policy = MooPolicy(M)
    job = Job(policy, M, t_comp=lambda cr: 0.0 if cr == 1.0 else 0.03)
    settle(policy, job, 50e-6, 100e9)
    fast = policy.decide()
    settle(policy, job, 1e-3, 20e6)
    slow = policy.decide()
    settle(policy, job, 50e-6, 100e9)
    assert fast.cr == 1.0 and slow.cr < 0.1 and policy.decide().cr == 1.0


@pytest.mark.parametrize(("change", "explores"), [(0.10, True), (0.12, True), (0.05, False), (-0.05, False)])
def test_reexploration_fires_at_ten_percent_not_five(change: float, explores: bool) -> None:
    policy = MooPolicy(M)
    job = Job(policy, M)
    settle(policy, job, 1e-3, 100e6)
    before = policy.explorations
    # beta = 8 / bandwidth: a 10% change in beta is bandwidth / 1.10
    policy.observe_network(NetworkObservation.from_link(1e-3, 100e6 / (1 + change), 4))
    assert (policy.explorations == before + 1) is explores
    assert (policy.phase == EXPLORE) is explores


def test_the_exploration_names_the_evidence_the_network_moved_on() -> None:
    policy = MooPolicy(M)
    settle(policy, Job(policy, M), 1e-3, 100e6)
    net = NetworkObservation(1e-3, 8 / 20e6, 4, evidence="passive+probe")
    policy.observe_network(net)
    assert policy.decide().reason.endswith("(network moved (passive+probe): bandwidth 100 -> 20 Mbit/s, "
                                           "latency 1 -> 1 ms)")


def test_latency_change_below_the_absolute_floor_does_not_reexplore() -> None:
    policy = MooPolicy(M)
    job = Job(policy, M)
    settle(policy, job, 20e-6, 100e6)
    before = policy.explorations
    policy.observe_network(NetworkObservation.from_link(40e-6, 100e6, 4))  # +100%, but 20 us
    assert policy.explorations == before
    policy.observe_network(NetworkObservation.from_link(2e-3, 100e6, 4))
    assert policy.explorations == before + 1


def _collapse_gains(policy: MooPolicy, steps: int) -> None:
    d = policy.decide()
    measured = next(r for r in policy.evaluate() if (r.collective, r.cr) == (d.collective, d.cr))
    for i in range(steps):  # same sync time as measured; every CR's gain halves
        policy.observe_step(StepReport(step=1000 + i, cr=d.cr, collective=d.collective, t_comp_s=measured.t_comp_s,
                                       t_sync_s=measured.t_sync_s, gain=gain_curve(d.cr) / 2,
                                       gains={c: gain_curve(c) / 2 for c in d.probe_crs}))


def test_gain_change_triggers_reexploration_when_asked() -> None:
    policy = MooPolicy(M, MooConfig(min_exploit_steps=2, reexplore_on_gain=True))
    settle(policy, Job(policy, M), 1e-3, 50e6)
    before = policy.explorations
    _collapse_gains(policy, 10)
    assert policy.explorations == before + 1


def test_by_default_a_gain_change_re_decides_without_exploring() -> None:
    # Every CR's gain is read off every gradient, so there is nothing to explore.
    policy = MooPolicy(M, MooConfig(min_exploit_steps=2))
    settle(policy, Job(policy, M), 1e-3, 50e6)
    before, gain_before = policy.explorations, policy.evaluate()[1].gain
    _collapse_gains(policy, 40)
    assert policy.explorations == before
    assert policy.evaluate()[1].gain < gain_before * 0.6  # smoothed (0.05 per step) towards half


_TIE_CR = 0.01


def _tied_job(hysteresis: float, settle_steps: int = 10) -> tuple[Job, float]:
    """One CR, two collectives, at the paper's ART-Ring/AG boundary: the model says
    they tie. Returns the job, settled and exploiting, and the alpha of the tie."""
    config = MooConfig(c_low=_TIE_CR, c_high=_TIE_CR, collectives=("ag_topk", "art_ring"), dense_collectives=(),
                       hysteresis=hysteresis, warmup_steps=1)
    policy = MooPolicy(M, config)
    alpha = crossover_ratio("ring_vs_ag", 4, M, _TIE_CR) * 8 / 100e6
    job = Job(policy, M, model_error=1.0, t_compute=0.0, t_comp=lambda c: 0.001)
    job.run(settle_steps, alpha, 100e6)
    assert policy.phase == EXPLOIT
    assert {r.collective for r in policy.evaluate() if r.measured} == {"ag_topk", "art_ring"}
    policy.calibration.error = lambda collective=None: 0.0  # isolate the hysteresis margin
    return job, alpha


def _near_tie(hysteresis: float) -> Job:
    # Measurements swing +-4% in blocks of ten steps.
    job, alpha = _tied_job(hysteresis)
    job.run(200, alpha, 100e6, noise=lambda step: 1.04 if (step // 10) % 2 else 0.96)
    return job


def test_no_flapping_between_near_equal_candidates() -> None:
    # Two options the model says tie; measurements swing +-4% in blocks of ten.
    assert _near_tie(hysteresis=0.05).switches(200) == 0
    assert _near_tie(hysteresis=0.0).switches(200) >= 1  # the margin is what holds it


def test_hysteresis_keeps_an_option_within_the_margin_on_both_objectives() -> None:
    from flexcomm.policy.moo import Evaluation, _within

    cur = Evaluation("ag_topk", 0.01, 0.1, 0.0, 0.104, 0.50, True)
    best = Evaluation("art_ring", 0.01, 0.1, 0.0, 0.100, 0.50, True)
    assert _within(cur, best, 0.05) and not _within(cur, best, 0.03)
    worse_gain = Evaluation("ag_topk", 0.004, 0.1, 0.0, 0.100, 0.40, True)
    assert not _within(worse_gain, best, 0.05)


def test_hysteresis_holds_between_options_the_asf_scores_alike() -> None:
    """Far apart on both objectives (2.2x the step time, 2.9x the gain), alike by
    ASF: a drift of 5% in one gain flips the ASF choice, but not the job; a clear
    ASF difference still switches it."""
    from flexcomm.policy.moo import Evaluation

    policy = MooPolicy(M)
    fast = Evaluation("art_tree", 0.011, 0.008, 0.002, 0.0100, 0.07, True)
    rich = Evaluation("art_ring", 0.033, 0.019, 0.003, 0.0224, 0.20, True)
    choices = set()
    for rich_gain in (0.195, 0.205):
        rows = [fast, replace(rich, gain=rich_gain)]
        best = policy.choose(rows)
        choices.add(best.collective)
        current = rows[1] if best == rows[0] else rows[0]
        assert policy._not_worth_switching(current, best, rows, 0.05)
    assert choices == {"art_tree", "art_ring"}  # the ASF choice did flip
    rows = [fast, replace(rich, gain=0.5)]
    assert policy.choose(rows) == rows[1]
    assert not policy._not_worth_switching(rows[0], rows[1], rows, 0.05)


def test_a_slow_step_of_the_running_option_does_not_switch_the_job() -> None:
    # Two tied options; the running one has two steps 30% slower. Compared on its
    # fresh EWMA against the other's explored figure, the job switched once.
    job, alpha = _tied_job(hysteresis=0.05, settle_steps=30)
    job.run(20, alpha, 100e6, noise=lambda step: 1.3 if step % 20 in (0, 1) else 1.0)
    assert job.switches(20) == 0


def test_state_round_trips_through_json_and_resumes_identically() -> None:
    a = MooPolicy(M)
    job = Job(a, M)
    job.run(25, 1e-3, 80e6)
    b = policy_from_state(json.loads(json.dumps(a.state_dict())))
    assert b.decide() == a.decide()
    job_a, job_b = Job(a, M), Job(b, M)
    job_a.run(40, 1e-3, 20e6)
    job_b.run(40, 1e-3, 20e6)
    assert job_a.decisions == job_b.decisions


reports = st.builds(
    lambda step, cr_i, coll, t_sync, gain: (step, cr_i, coll, t_sync, gain),
    st.integers(0, 10_000), st.integers(0, 5), st.sampled_from(["ag_topk", "art_ring", "art_tree"]),
    st.floats(1e-4, 5.0), st.floats(0.05, 1.0))
networks = st.tuples(st.floats(0, 0.05), st.floats(1e6, 1e11), st.integers(2, 64))


@settings(max_examples=60, deadline=None)
@given(net=networks, events=st.lists(st.one_of(reports, networks), max_size=40))
def test_identical_inputs_give_identical_decisions(net: tuple, events: list) -> None:
    crs = (1.0, *MooConfig().crs)
    policies = [MooPolicy(M), MooPolicy(M)]
    seen: list[list] = [[], []]
    for i, p in enumerate(policies):
        p.observe_network(NetworkObservation.from_link(net[0], net[1], net[2]))
        for ev in events:
            if len(ev) == 3:
                p.observe_network(NetworkObservation.from_link(*ev))
            else:
                step, cr_i, coll, t_sync, gain = ev
                cr = crs[cr_i]
                p.observe_step(StepReport(step=step, cr=cr, collective="dense_ring" if cr == 1.0 else coll,
                                          t_comp_s=0.0 if cr == 1.0 else 0.01, t_sync_s=t_sync,
                                          gain=1.0 if cr == 1.0 else gain, t_compute_s=0.01,
                                          gains={c: gain for c in crs[1:]}))
            seen[i].append(p.decide())
    assert seen[0] == seen[1]


@pytest.mark.parametrize(("options", "field"), [
    ({"c_low": 0.0}, "c_low"), ({"c_high": 1.5}, "c_high"), ({"c_low": 0.2, "c_high": 0.1}, "c_low"),
    ({"factor": 1.0}, "factor"), ({"collectives": ["dense_ring"]}, "collectives"),
    ({"collectives": ["bogus"]}, "collectives"), ({"objective": "fastest"}, "objective"),
    ({"weight_time": -0.1}, "weight_time"), ({"change_threshold": float("nan")}, "change_threshold"),
    ({"explore_steps": 0}, "explore_steps"), ({"root": "random"}, "root"), ({"bogus": 1}, "bogus"),
    ({"ag_form": "tree"}, "ag_form"),
])
def test_bad_options_name_the_field(options: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_policy("moo", grad_bytes=M, nodes=4, options=options)


@pytest.mark.parametrize(("kw", "field"), [
    ({"name": "moo", "grad_bytes": 0, "nodes": 4}, "grad_bytes"),
    ({"name": "moo", "grad_bytes": float("nan"), "nodes": 4}, "grad_bytes"),
    ({"name": "moo", "grad_bytes": M, "nodes": 1}, "nodes"),
    ({"name": "magic", "grad_bytes": M, "nodes": 4}, "policy"),
    ({"name": "static", "grad_bytes": M, "nodes": 4, "options": {"cr": 1.5, "collective": "ag_topk"}}, "cr"),
    ({"name": "static", "grad_bytes": M, "nodes": 4, "options": {"cr": 0.1, "collective": "x"}}, "collective"),
    ({"name": "dense", "grad_bytes": M, "nodes": 4, "options": {"cr": 0.1}}, "cr"),
])
def test_make_policy_validates(kw: dict, field: str) -> None:
    name = kw.pop("name")
    with pytest.raises(ValueError, match=field):
        make_policy(name, **kw)


def test_decisions_carry_probe_crs_reason_and_increasing_versions() -> None:
    policy = MooPolicy(M)
    job = Job(policy, M)
    versions = []
    for _ in range(30):
        job.run(1, 1e-3, 50e6)
        versions.append(policy.decide().version)
    d = policy.decide()
    assert d.probe_crs == MooConfig().crs and d.reason and d.model_forms == "ag=paper,tree=paper"
    assert versions == sorted(versions) and versions[-1] > versions[0]


def test_stale_reports_of_an_old_decision_do_not_advance_exploration() -> None:
    policy = MooPolicy(M, MooConfig(warmup_steps=2))
    for i in range(5):  # reports of a CR the policy never asked for
        policy.observe_step(StepReport(step=i, cr=0.5, collective="ag_topk", t_comp_s=0.01, t_sync_s=0.1, gain=0.9))
    assert policy.phase == "warmup"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=25))
def test_fast_2d_front_equals_the_definition(points: list) -> None:
    from flexcomm.policy import pareto

    brute = [i for i, p in enumerate(points)
             if not any(pareto.dominates(q, p) for j, q in enumerate(points) if j != i)]
    assert pareto.pareto_front(points) == brute


def test_measured_sync_change_triggers_reexploration_without_a_probe() -> None:
    policy = MooPolicy(M)
    job = Job(policy, M)
    settle(policy, job, 1e-3, 100e6)
    before = policy.explorations
    job.run(12, 1e-3, 100e6)  # settles the sync baseline
    assert policy.explorations == before
    # The link slows 5x but no probe reports it: only the step reports show it.
    job.model_error *= 5
    policy.observe_network = lambda net: None  # the probe is silent
    job.run(15, 1e-3, 100e6)
    assert policy.explorations == before + 1


def test_brief_sync_noise_does_not_start_an_exploration() -> None:
    policy = MooPolicy(M)
    job = Job(policy, M)
    settle(policy, job, 1e-3, 100e6)
    job.run(12, 1e-3, 100e6)
    before = policy.explorations
    # Three steps 2x slower (a loaded machine), then back: one step over the
    # threshold would explore (sync_change_steps=1 does); three in a row is a move.
    job.run(20, 1e-3, 100e6, noise=lambda step: 2.0 if step % 20 in (0, 1, 2) else 1.0)
    assert policy.explorations == before
    assert job.switches(20) == 0
