"""An exploration's plan: the options it measures, in order, each marked
exploring (run only to measure it, charged to the exploring budget) or free
(the job would run it anyway), and why it started.

The job adopts a decision at its agreements only, so an option the last plan
explored runs on after the policy has moved on; its steps are still spent
exploring (`spent_on`).

Pure and deterministic; its state is plain data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Item = tuple[str, bool]  # (option label, exploring)


@dataclass
class ExplorationPlan:
    items: list[Item] = field(default_factory=list)
    index: int = 0  # the item being measured
    explored_before: list[str] = field(default_factory=list)  # the last plan's explored options
    why: str = ""  # what started it
    started: int = 0  # explorations started in the job

    def start(self, items: Iterable[Item], why: str) -> None:
        """Measure `items` from the first, for `why` (an exploration started, if
        there is anything to measure); the last plan's explored options stay
        spent on while the job runs them on."""
        self.explored_before = [label for label, exploring in self.items if exploring]
        self.items, self.index, self.why = list(items), 0, why
        self.started += bool(self.items)

    def item(self) -> Item | None:
        """The item being measured; None once every item has been."""
        return self.items[self.index] if self.index < len(self.items) else None

    def next(self) -> None:
        self.index += 1

    def replan_rest(self, rest: Iterable[Item], most: int) -> None:
        """Keep the items run so far and the one running; measure `rest` after
        them (those not run already), `most` items in all."""
        done = self.items[:self.index + 1]
        ran = {label for label, _ in done}
        self.items = done + [item for item in rest if item[0] not in ran][:max(0, most - len(done))]

    def spent_on(self, label: str) -> bool:
        """Steps of `label` are spent exploring: this plan or the last explored it."""
        return any(item == label and exploring for item, exploring in self.items) or label in self.explored_before

    def describe(self) -> str:
        return f"measuring {self.index + 1}/{len(self.items)} ({self.why})"

    def state_dict(self) -> dict[str, Any]:
        return {"items": [[label, exploring] for label, exploring in self.items], "index": self.index,
                "explored_before": list(self.explored_before), "why": self.why, "started": self.started}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ExplorationPlan:
        return cls([(str(label), bool(exploring)) for label, exploring in state["items"]], int(state["index"]),
                   [str(label) for label in state["explored_before"]], str(state["why"]), int(state["started"]))


__all__ = ["ExplorationPlan", "Item"]
