"""Quality as a budget over the run: each choice minimises step time plus the
price of its compression error, and the price follows what the steps spend
against what the reference compression would have spent on the same gradients."""

from __future__ import annotations

import json
import math

import pytest

from flexcomm.policy.budget import BALANCE_GAIN, LAMBDA_RANGE, QualityBudget, least_cost, reference_price
from flexcomm.policy.moo import MooConfig, MooPolicy
from flexcomm.policy.types import Choice, Compression, NetworkObservation, StepReport
from support.policy_sim import LAYOUT, Job, gain_of

FAST, SLOW = (50e-6, 10e9), (1e-3, 20e6)


def moo(**options) -> MooPolicy:
    # The simulated job's Top-k 0.1 loses nothing (gain_of): the reference is one that loses some.
    return MooPolicy(LAYOUT.grad_bytes, MooConfig(**{"quality_reference": "topk:0.011", **options}), LAYOUT)


def test_the_price_rises_while_steps_overspend_and_falls_while_they_save() -> None:
    budget = QualityBudget(rate=0.01)
    budget.start(0.1)
    for _ in range(50):
        budget.observe(0.6, 0.3)
    high = budget.lam
    assert high is not None and high > 0.1
    for _ in range(200):
        budget.observe(0.0, 0.3)
    assert budget.lam is not None and budget.lam < high
    assert (budget.spent, budget.allowed, budget.steps) == pytest.approx((30.0, 75.0, 250))


def test_the_price_stays_within_its_range_and_starts_once() -> None:
    budget = QualityBudget(rate=1.0)
    budget.start(0.1)
    budget.start(5.0)  # a second start changes nothing
    for _ in range(100):
        budget.observe(1.0, 0.0)
    assert budget.lam == pytest.approx(0.1 * LAMBDA_RANGE)
    assert QualityBudget.from_state(json.loads(json.dumps(budget.state_dict())), rate=1.0) == budget


def test_the_rate_is_the_settings_not_the_stored_states() -> None:
    budget = QualityBudget(rate=0.5)
    budget.start(0.1)
    budget.observe(0.3, 0.1)
    assert "rate" not in budget.state_dict()
    older = {**budget.state_dict(), "rate": 0.5}  # a state stored with its rate
    back = QualityBudget.from_state(older, rate=0.02)
    assert back.rate == 0.02 and (back.lam, back.spent, back.steps) == (budget.lam, budget.spent, budget.steps)


def test_before_any_error_is_known_the_price_is_unset() -> None:
    budget = QualityBudget()
    budget.observe(0.5, 0.2)
    assert budget.lam is None and budget.cost(1.0, 0.5) == 1.0


def test_the_budget_is_spent_where_bandwidth_is_dear() -> None:
    # The link alternates fast and slow: the job saves error on the fast link
    # (lossless) and spends it on the slow one, more than the reference would.
    policy = moo()
    job = Job(policy, t_comp=lambda c: 0.0 if c.family == "dense" else 0.01)
    for _ in range(6):
        start = job.step
        job.run(150, *FAST)
        fast = job.decisions[start + 100:]
        start = job.step
        job.run(150, *SLOW)
        slow = job.decisions[start + 100:]
    reference = gain_of(Compression.parse("topk:0.011"))
    assert all(gain_of(Choice.parse(label).compression) > reference for label in fast), fast
    assert all(gain_of(Choice.parse(label).compression) < reference for label in slow), slow
    assert 0.8 * policy.budget.allowed <= policy.budget.spent <= 1.10 * policy.budget.allowed, policy.budget


def test_a_choice_is_judged_on_the_gain_its_own_steps_delivered() -> None:
    # Probes read 0.48 for Top-k 0.033 off one gradient; over the tree its steps
    # delivered 0.07 (its non-root ranks send little): the tree is judged on 0.07.
    policy = moo()
    policy.observe_network(NetworkObservation.from_link(*SLOW, 4))
    for step in range(40):
        policy.observe_step(StepReport(step=step, family="topk", param=0.033, collective="art_tree", t_comp_s=0.0,
                                       t_sync_s=0.05, gain=0.07, gains={"topk:0.033": 0.48}))
    gains = {r.label: r.gain for r in policy.evaluate(predicted=True)}
    assert gains["topk:0.033@art_tree"] == pytest.approx(0.07, abs=0.01)
    assert gains["topk:0.033@ag_topk"] == pytest.approx(0.48, abs=0.01)


def test_a_gain_read_every_tenth_step_settles_as_fast_in_steps_as_one_read_every_step() -> None:
    every, tenth = moo(), moo()
    for policy, period in ((every, 1), (tenth, 10)):
        for step in range(0, 60, period):
            gain = 0.9 if step < 20 else 0.3
            policy.observe_step(StepReport(step=step, family="dense", param=0, collective="dense_ring", t_comp_s=0.0,
                                           t_sync_s=0.05, gain=1.0, gains={"topk:0.1": gain}))
    assert tenth._s.gains["topk:0.1"] == pytest.approx(every._s.gains["topk:0.1"], abs=0.05)


def test_the_starting_price_is_where_the_least_cost_choice_keeps_within_the_reference() -> None:
    # (step seconds, error): bf16, Top-k 0.1, Top-k 0.033, PowerSGD rank 1
    options = [(0.030, 0.0), (0.015, 0.6), (0.008, 0.8), (0.006, 0.95)]
    lam = reference_price(options, reference_error=0.8)
    assert lam is not None and least_cost(options, lam) == (0.008, 0.8)  # the fastest within 0.8
    assert least_cost(options, lam * 0.8) == (0.008, 0.8)  # inside its interval, not at an edge
    assert least_cost(options, reference_price(options, 0.5)) == (0.030, 0.0)  # Top-k 0.1 is off the hull
    assert reference_price([(0.010, 0.0), (0.030, 0.5)], 0.6) is None  # nothing trades time for error


def test_an_overspent_run_pays_more_at_once_and_a_saving_one_less() -> None:
    budget = QualityBudget(rate=0.0)  # the balance alone, no per-step drift
    budget.start(0.1)
    assert budget.price == pytest.approx(0.1)
    for _ in range(100):
        budget.observe(0.6, 0.3)
    assert budget.lam == pytest.approx(0.1) and budget.price == pytest.approx(0.1 * math.exp(BALANCE_GAIN * 30 / 60))
    for _ in range(400):
        budget.observe(0.0, 0.3)
    assert budget.price < 0.1
