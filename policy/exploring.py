"""The exploring budget: steps a policy may spend running options only to
measure them, charged as the job actually ran them.

The job adopts a decision at its agreements only (every K steps), so an option
planned for 2 steps runs until the next agreement: in the lab a 2-step item ran
4-6 steps with agreements every 2 steps. The budget counts every step the job
ran on an explored option. It charges an item the steps it is planned for plus
the steps the job took to adopt a new decision, as the last few decisions
made at a step showed (the policy does not know K; with the hook's default
K = 10 a first exploration charged 2 steps an item ran 10 each, four times its
share), or the most an item that ran in the last plan cost when that is more.
An explored item kept as the choice is charged the steps the job runs it as
explored until it adopts the choice.

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flexcomm.policy.types import plain_fields

# Adoption lags kept: an agreement every K steps shows a lag of 0 to K-1, so the
# most of a few is near K; one long outage of the client is forgotten soon.
ADOPTION_LAGS = 4


@dataclass
class ExploreBudget:
    steps_seen: int = 0
    spent: int = 0  # steps run on an option only to measure it
    spent_before: int = 0  # `spent` when the last plan started
    item_steps: float = 0.0  # the most an explored item has run (0: not yet seen)
    lags: list[int] = field(default_factory=list)  # steps the last decisions took to be adopted
    changed_at: int | None = None  # steps seen when the decision changed, until a step runs it
    items: int = 0  # explored items the plan started has run (items the budget skipped are not)
    named: str | None = None  # the option the policy's decision last named

    def decision_changed(self, option: str) -> None:
        """The policy made a decision naming `option`. One naming the option the
        last one did is nothing for the job to adopt (an exploration's choice of
        the item it ended on: counted, a simulated job learned lags of 0 alone
        and charged 2-step items that ran 10)."""
        if option != self.named:
            self.changed_at = self.steps_seen
        self.named = option

    def change_untimed(self) -> None:
        """The last change came with news of the network, at any point between
        the job's agreements: how long it takes to be adopted says nothing of
        what an item pays, whose end comes with a step (a simulated job whose
        moves all came at its agreements learned lags of 0 alone, and charged
        2-step items that ran 10)."""
        self.changed_at = None

    def observe(self, exploring: bool, runs_decision: bool = True) -> None:
        """One step of the job; `exploring` when it ran an option only to measure it,
        `runs_decision` when it ran the policy's current decision."""
        if runs_decision and self.changed_at is not None:
            self.lags = [*self.lags, self.steps_seen - self.changed_at][-ADOPTION_LAGS:]
            self.changed_at = None
        self.steps_seen += 1
        self.spent += exploring

    def kept_item(self) -> None:
        """The running explored item became the choice: the job runs it as
        explored until its next agreement, as long as a decision takes to be
        adopted (the most of the last few lags), and those steps are spent."""
        self.spent += max(self.lags, default=0)

    def allowance(self, share: float, horizon: int) -> int:
        """Exploring steps still allowed: `share` of the steps seen so far (of
        `horizon` while fewer have run) less those already spent."""
        return math.floor(share * max(self.steps_seen, horizon)) - self.spent

    def item_cost(self, planned_steps: int) -> float:
        """What one explored item will cost: the steps it is planned for and the
        steps the job takes to adopt the decision that ends it (the most of the
        last few), or what the last plan's items actually ran when more."""
        return max(float(planned_steps + max(self.lags, default=0)), self.item_steps)

    def item_started(self) -> None:
        """An explored item of the plan begins to run."""
        self.items += 1

    def plan_started(self) -> None:
        """A new plan starts. An item is charged the most one has cost so far: the
        share is a ceiling, and the last plan's own figure swung (its last item,
        the one the job went on running, stops counting when the plan ends), so a
        plan charged 2 steps an item ran 5 and broke the share. Only the items that
        ran share what the last plan spent: over the three it planned, one that
        ran 10 steps (agreements every 10) was charged 3.3, and the share broke."""
        if self.items:
            last = (self.spent - self.spent_before) / self.items
            self.item_steps = max(self.item_steps, last)
        self.spent_before, self.items = self.spent, 0

    def state_dict(self) -> dict[str, Any]:
        return plain_fields(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ExploreBudget:
        return cls(**state)


__all__ = ["ExploreBudget"]
