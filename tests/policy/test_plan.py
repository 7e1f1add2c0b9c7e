"""An exploration's plan (policy.plan)."""

from __future__ import annotations

import json

from flexcomm.policy.plan import ExplorationPlan

RANK4, TOPK, BF16 = "powersgd:4@dense_ring", "topk:0.01@ag_topk", "bf16@dense_ring"


def test_items_are_measured_in_order_until_none_is_left() -> None:
    plan = ExplorationPlan()
    plan.start([(RANK4, False), (TOPK, True)], "first exploration")
    assert plan.started == 1 and plan.item() == (RANK4, False)
    assert plan.describe() == "measuring 1/2 (first exploration)"
    plan.next()
    assert plan.item() == (TOPK, True) and plan.describe() == "measuring 2/2 (first exploration)"
    plan.next()
    assert plan.item() is None


def test_the_last_plans_explored_options_stay_spent_on_while_the_job_runs_them_on() -> None:
    # The job adopts a decision at its agreements only: an option explored runs on.
    plan = ExplorationPlan()
    plan.start([(RANK4, False), (TOPK, True)], "first exploration")
    assert plan.spent_on(TOPK) and not plan.spent_on(RANK4)
    plan.start([(BF16, False)], "too close to call")
    assert plan.spent_on(TOPK) and not plan.spent_on(BF16)
    plan.start([(RANK4, False)], "network moved")
    assert not plan.spent_on(TOPK)  # two plans back


def test_replanning_keeps_what_ran_and_the_running_item_and_bounds_the_whole() -> None:
    plan = ExplorationPlan()
    plan.start([(BF16, False), ("dense@dense_ring", True), (TOPK, True)], "first exploration")
    plan.next()  # dense is running
    plan.replan_rest([(BF16, False), (RANK4, False), (TOPK, True), ("topk:0.1@ag_topk", True)], most=4)
    assert plan.items == [(BF16, False), ("dense@dense_ring", True), (RANK4, False), (TOPK, True)]
    assert plan.index == 1
    plan.replan_rest([(RANK4, False)], most=1)
    assert plan.items == [(BF16, False), ("dense@dense_ring", True)]  # never drops what ran


def test_a_plan_with_nothing_to_measure_starts_no_exploration_but_says_why() -> None:
    plan = ExplorationPlan()
    plan.start([], "network moved")
    assert plan.started == 0 and plan.item() is None and plan.why == "network moved"


def test_its_state_is_plain_data_that_restores_it() -> None:
    plan = ExplorationPlan(started=3)
    plan.start([(RANK4, False), (TOPK, True)], "first exploration")
    plan.start([(BF16, True)], "network moved")
    back = ExplorationPlan.from_state(json.loads(json.dumps(plan.state_dict())))
    assert back == plan and back.spent_on(TOPK)
