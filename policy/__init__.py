"""flexcomm.policy: pure, deterministic decision making (no I/O, no clocks, no torch).

It takes observations (network alpha/beta, step reports) and returns decisions
(compression ratio, collective, AR-Topk root selection).
"""

from flexcomm.policy.types import (
    AG_TOPK,
    ART_RING,
    ART_TREE,
    COLLECTIVES,
    DENSE_RING,
    DENSE_TREE,
    PS,
    ROOT_SELECTIONS,
    ROOT_STAR,
    ROOT_VAR,
    RUNNABLE_COLLECTIVES,
    Decision,
    NetworkObservation,
    Policy,
    StepReport,
)

__all__ = [
    "AG_TOPK",
    "ART_RING",
    "ART_TREE",
    "COLLECTIVES",
    "DENSE_RING",
    "DENSE_TREE",
    "PS",
    "ROOT_SELECTIONS",
    "ROOT_STAR",
    "ROOT_VAR",
    "RUNNABLE_COLLECTIVES",
    "Decision",
    "NetworkObservation",
    "Policy",
    "StepReport",
]
