"""The exploring budget's arithmetic: what it allows and what an item costs."""

from __future__ import annotations

from flexcomm.policy.exploring import ADOPTION_LAGS, ExploreBudget


def run(budget: ExploreBudget, steps: int, *, exploring: bool = False, runs_decision: bool = True) -> None:
    for _ in range(steps):
        budget.observe(exploring, runs_decision=runs_decision)


def test_an_item_costs_its_planned_steps_plus_the_steps_a_decision_took_to_be_adopted() -> None:
    budget = ExploreBudget()
    assert budget.item_cost(2) == 2  # no decision adopted yet: nothing known of the lag
    run(budget, 5)
    budget.decision_changed("bf16")
    run(budget, 7, runs_decision=False)  # the job runs the old option until its agreement
    run(budget, 3)
    assert budget.lags == [7]
    assert budget.item_cost(2) == 9


def test_a_long_lag_is_forgotten_after_a_few_decisions() -> None:
    budget = ExploreBudget()
    budget.decision_changed("bf16")
    run(budget, 100, runs_decision=False)  # the client could not reach its agent
    run(budget, 1)
    assert budget.item_cost(2) == 102
    for i in range(ADOPTION_LAGS):
        budget.decision_changed(f"topk:{i}")
        run(budget, 3, runs_decision=False)
        run(budget, 1)
    assert budget.item_cost(2) == 5


def test_the_most_an_item_of_the_last_plan_ran_counts_when_more() -> None:
    budget = ExploreBudget()
    budget.item_started()
    run(budget, 12, exploring=True)
    budget.plan_started()  # not the first plan: the last one's item ran 12
    budget.item_started()
    budget.item_started()
    budget.plan_started()
    assert budget.item_cost(2) == 12


def test_items_the_budget_skipped_share_nothing_of_what_the_last_plan_spent() -> None:
    budget = ExploreBudget()
    budget.item_started()  # one of the plan's three explored items ran; the budget skipped two
    run(budget, 10, exploring=True)
    budget.plan_started()
    assert budget.item_cost(2) == 10


def test_a_state_saved_before_lags_were_kept_loads() -> None:
    old = {"steps_seen": 40, "spent": 4, "spent_before": 0, "item_steps": 4.0}
    budget = ExploreBudget.from_state(old)
    assert budget.lags == [] and budget.changed_at is None and budget.item_cost(2) == 4
    assert ExploreBudget.from_state(budget.state_dict()) == budget


def test_a_change_that_came_with_network_news_teaches_no_lag() -> None:
    budget = ExploreBudget()
    budget.decision_changed("bf16")
    budget.change_untimed()  # a move, at whatever point between the job's agreements
    run(budget, 7, runs_decision=False)
    run(budget, 1)
    assert budget.lags == [] and budget.item_cost(2) == 2


def test_an_explored_item_kept_as_the_choice_is_charged_the_steps_it_runs_until_adopted() -> None:
    budget = ExploreBudget()
    budget.decision_changed("bf16")
    run(budget, 7, runs_decision=False)
    run(budget, 1)
    spent = budget.spent
    budget.kept_item()  # the job runs it, flagged explored, until its next agreement
    assert budget.spent == spent + 7


def test_a_decision_naming_the_option_the_last_one_named_teaches_no_lag() -> None:
    # An exploration's choice of the item it ended on: the job already runs it.
    budget = ExploreBudget()
    budget.decision_changed("bf16")
    run(budget, 7, runs_decision=False)
    run(budget, 3)
    budget.decision_changed("bf16")
    run(budget, 1)
    assert budget.lags == [7] and budget.item_cost(2) == 9
