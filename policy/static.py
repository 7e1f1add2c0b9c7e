"""Fixed choices: always dense, or always one CR on one collective.

These are the baselines the adaptive policies are compared with, and what a
user pins when they do not want adaptation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flexcomm.policy.types import (
    DENSE_COLLECTIVES,
    DENSE_RING,
    ROOT_STAR,
    Decision,
    NetworkObservation,
    StepReport,
    check_options,
)


@dataclass(frozen=True)
class StaticConfig:
    """The options of the static policy (its decision checks their ranges)."""

    cr: float = 1.0
    collective: str = DENSE_RING
    root: str = ROOT_STAR

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> StaticConfig:
        return cls(**check_options(options, cls, "static"))


class StaticPolicy:
    """Always the same (cr, collective, root). Dense collectives need cr = 1."""

    name = "static"

    @classmethod
    def from_config(cls, config: StaticConfig) -> StaticPolicy:
        return cls(config.cr, config.collective, config.root)

    def __init__(self, cr: float = 1.0, collective: str = DENSE_RING, root: str = ROOT_STAR) -> None:
        if collective in DENSE_COLLECTIVES and cr == 1.0:
            reason = f"static: dense {collective}"
        else:
            reason = f"static: Top-k at cr={cr:g} over {collective}"
        # Decision validates cr, collective and root, naming the bad field.
        self._decision = Decision(cr=cr, collective=collective, root=root, version=1, reason=reason)

    def observe_network(self, net: NetworkObservation) -> None:
        pass

    def observe_step(self, report: StepReport) -> None:
        pass

    def decide(self) -> Decision:
        return self._decision

    def model_error(self) -> float | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "decision": self._decision.to_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._decision = Decision.from_dict(state["decision"])


def dense_policy() -> StaticPolicy:
    policy = StaticPolicy(1.0, DENSE_RING)
    policy.name = "dense"
    return policy
