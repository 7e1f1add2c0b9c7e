"""The trainer's equal-time stop: when rank 0 looks at its clock (a pure rule,
walked with steady and slowing steps), and 2 real gloo ranks stopping at the
same step with a broadcast at few of their steps."""

from __future__ import annotations

import math
import time

import pytest

from flexcomm.lab.trainer import STOP_LOOK_INTERVAL, next_look
from support.client_ranks import run_ranks


def walk(budget_s: float, step_s: list[float] | float) -> tuple[int, list[int], list[float]]:
    """Train with the given step times, looking where `next_look` says: (the step
    training stops before, the steps looked at, the clock at each look)."""
    times = step_s if isinstance(step_s, list) else [step_s] * 100_000
    step, now, look_at, looks, clocks, last = 0, 0.0, 0, [], [], None
    while True:
        if step == look_at:
            recent = (now - last[1]) / (step - last[0]) if last and step > last[0] else None
            looks.append(step)
            clocks.append(now)
            last = (step, now)
            look_at = next_look(step, now, budget_s, recent)
            if look_at == step:
                return step, looks, clocks
        now += times[step]
        step += 1


def test_a_look_is_the_step_itself_once_the_budget_is_spent() -> None:
    assert next_look(7, 10.0, 10.0, 0.1) == 7
    assert next_look(7, 9.0, 10.0, None) == 8  # no step time known yet: look at the next
    assert next_look(7, 0.0, 10.0, 0.1) == 7 + STOP_LOOK_INTERVAL  # far: the longest stride
    assert next_look(7, 9.5, 10.0, 0.1) == 8  # 5 steps left: every step


def test_steady_steps_stop_at_the_first_step_past_the_budget_with_few_looks() -> None:
    stop, looks, clocks = walk(10.03, 0.1)
    assert stop == math.ceil(10.03 / 0.1)  # the first step that starts past the budget
    assert clocks[-1] >= 10.03 > clocks[-2]
    assert len(looks) < stop / 4  # no collective at most steps


def test_steps_that_slow_down_near_the_end_overshoot_by_little() -> None:
    # 0.1 s steps, then 0.3 s ones from step 90 on (the link slowed at a phase)
    stop, looks, clocks = walk(10.0, [0.1] * 90 + [0.3] * 1000)
    assert clocks[-2] < 10.0 <= clocks[-1] < 10.0 + 0.3  # at most a slow step past the budget
    assert stop == 94 and looks[-2:] == [93, 94]


def stop_on_budget(rank: int, world: int, budget_s: float) -> dict:
    from flexcomm.lab.trainer import StopRule, TrainClock, TrainConfig

    looked: list[int] = []

    class CountingStopRule(StopRule):
        """The trainer's rule, noting each step at which it broadcast."""

        def _look(self, step: int, now: float) -> int:
            looked.append(step)
            return super()._look(step, now)

    cfg = TrainConfig(policy="dense", world=world, master_addr="", master_port=0, records="",
                      budget_s=budget_s)
    clock = TrainClock()
    rule = CountingStopRule(cfg, clock, rank)
    step, trained_s = 0, 0.0
    while not rule(step, trained_s):
        assert not rule(step, trained_s)  # asked again at the same step (an epoch's end): no broadcast
        time.sleep(0.002 if rank == 0 else 0.004)  # the ranks' clocks differ; rank 0's decides
        trained_s = clock.now()
        step += 1
    return {"stop": step, "looked": looked}


def test_the_rule_compares_the_clock_as_the_last_step_ended_not_as_it_looks() -> None:
    """Time spent between a step's end and the next look (writing records) is
    not a step: a step that ended just short of the budget is followed by one
    more, however long the look is delayed."""
    from flexcomm.lab.trainer import StopRule, TrainClock, TrainConfig

    class OneRank(StopRule):
        def _look(self, step: int, now: float) -> int:
            return next_look(step, now, self.cfg.budget_s, None)  # rank 0 alone: no broadcast

    cfg = TrainConfig(policy="dense", world=1, master_addr="", master_port=0, records="",
                      budget_s=0.05)
    clock = TrainClock()
    rule = OneRank(cfg, clock, 0)
    assert not rule(0, 0.0)
    time.sleep(0.06)  # the clock passes the budget between the step's end and the look
    assert not rule(1, 0.049)  # the last step ended short of the budget: one more
    assert rule(2, 0.051)


@pytest.mark.timeout(120)
def test_two_gloo_ranks_stop_at_the_same_step_broadcasting_at_few() -> None:
    ranks = run_ranks(2, "lab/test_trainer.py:stop_on_budget", {"budget_s": 0.5}, timeout=100)
    assert ranks[0]["stop"] == ranks[1]["stop"]
    assert ranks[0]["looked"] == ranks[1]["looked"]
    assert ranks[0]["looked"][-1] == ranks[0]["stop"]
    assert len(ranks[0]["looked"]) < ranks[0]["stop"] / 2
