"""Fixed choices: always dense, or always one compression over one collective.

These are the baselines the adaptive policies are compared with, and what a
user pins when they do not want adaptation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flexcomm.policy.types import (
    AG_TOPK,
    DENSE_RING,
    ROOT_STAR,
    TOPK,
    Choice,
    Compression,
    Decision,
    NetworkObservation,
    StepReport,
    check_options,
)


def default_collective(compression: Compression) -> str:
    """What a fixed choice runs over when none is named: AllGather for Top-k,
    the ring AllReduce otherwise."""
    return AG_TOPK if compression.family == TOPK else DENSE_RING


@dataclass(frozen=True)
class StaticConfig:
    """The options of the static policy (its decision checks their values)."""

    compression: str = "dense"
    collective: str | None = None
    root: str = ROOT_STAR

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> StaticConfig:
        return cls(**check_options(options, cls, "static"))


class StaticPolicy:
    """Always the same compression over the same collective."""

    name = "static"

    @classmethod
    def from_config(cls, config: StaticConfig) -> StaticPolicy:
        return cls(config.compression, config.collective, config.root)

    def __init__(self, compression: str | Compression = "dense", collective: str | None = None,
                 root: str = ROOT_STAR) -> None:
        c = compression if isinstance(compression, Compression) else Compression.parse(compression)
        collective = default_collective(c) if collective is None else collective
        # Decision validates the pairing and the root, naming the bad field.
        self._decision = Decision.of(Choice(c, collective), root=root, version=1,
                                     reason=f"static: {c.name} over {collective}")

    def observe_network(self, net: NetworkObservation) -> None:
        pass

    def observe_steps(self, reports: Sequence[StepReport]) -> None:
        pass

    def choose(self) -> Decision:
        return self.decide()  # it chooses as it observes

    def decide(self) -> Decision:
        return self._decision

    def model_error(self) -> float | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "decision": self._decision.to_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._decision = Decision.from_dict(state["decision"])


def dense_policy() -> StaticPolicy:
    policy = StaticPolicy()
    policy.name = "dense"
    return policy
