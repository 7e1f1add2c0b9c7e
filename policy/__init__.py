"""flexcomm.policy: pure, deterministic decision making (no I/O, no clocks, no torch).

It takes observations (network alpha/beta, step reports) and returns decisions
(compression ratio, collective, AR-Topk root selection).
"""

from flexcomm.policy.types import (
    AG_TOPK,
    ART_RING,
    ART_TREE,
    BF16,
    COLLECTIVES,
    DENSE,
    DENSE_RING,
    DENSE_TREE,
    FAMILIES,
    POWERSGD,
    PS,
    ROOT_SELECTIONS,
    ROOT_STAR,
    ROOT_VAR,
    RUNNABLE_COLLECTIVES,
    TOPK,
    Choice,
    Compression,
    Decision,
    GradientLayout,
    LinkBucket,
    NetworkObservation,
    Policy,
    StepReport,
)

__all__ = [
    "AG_TOPK",
    "ART_RING",
    "ART_TREE",
    "BF16",
    "COLLECTIVES",
    "DENSE",
    "DENSE_RING",
    "DENSE_TREE",
    "FAMILIES",
    "POWERSGD",
    "PS",
    "ROOT_SELECTIONS",
    "ROOT_STAR",
    "ROOT_VAR",
    "RUNNABLE_COLLECTIVES",
    "TOPK",
    "Choice",
    "Compression",
    "Decision",
    "GradientLayout",
    "LinkBucket",
    "NetworkObservation",
    "Policy",
    "StepReport",
]


POLICY_NAMES = ("dense", "static", "moo", "gravac")


def make_policy(name: str, *, grad_bytes: float, nodes: int, options: dict | None = None,
                layout: GradientLayout | None = None) -> Policy:
    """Build a policy by name ("dense", "static", "moo", "gravac").

    options are plain values (from the CLI, a TOML file or an RPC); an unknown
    option or a value of the wrong type or range raises ValueError naming it
    (each config's fields give the types). static takes StaticConfig's fields
    (compression as text such as "topk:0.01", collective, root); moo
    MooConfig's; gravac GravacConfig's. layout (the gradient's matrices, for
    PowerSGD's cost) defaults to one flat vector of grad_bytes.
    """
    from flexcomm.policy.gravac import GravacConfig, GravacPolicy
    from flexcomm.policy.moo import MooConfig, MooPolicy
    from flexcomm.policy.static import StaticConfig, StaticPolicy, dense_policy

    if not isinstance(nodes, int) or nodes < 2:
        raise ValueError(f"nodes: need at least 2 workers, got {nodes!r}")
    opts = dict(options or {})
    if name == "dense":
        if opts:
            raise ValueError(f"{sorted(opts)[0]}: the dense policy takes no options")
        return dense_policy()
    if name == "static":
        return StaticPolicy.from_config(StaticConfig.from_options(opts))
    if name == "moo":
        return MooPolicy(grad_bytes, MooConfig.from_options(opts), layout)
    if name == "gravac":
        return GravacPolicy(GravacConfig.from_options(opts))
    raise ValueError(f"policy: unknown policy {name!r} (one of {', '.join(POLICY_NAMES)})")


def policy_from_state(state: dict) -> Policy:
    """Rebuild a policy from its `state_dict()` (what the agent persists)."""
    kind = state.get("kind")
    if kind in ("static", "dense"):
        from flexcomm.policy.static import StaticPolicy

        policy = StaticPolicy()
        policy.name = kind
    elif kind == "moo":
        from flexcomm.policy.moo import MooPolicy

        policy = MooPolicy(float(state["grad_bytes"]))  # load_state_dict restores its layout
    elif kind == "gravac":
        from flexcomm.policy.gravac import GravacPolicy

        policy = GravacPolicy()
    else:
        raise ValueError(f"kind: unknown policy kind {kind!r} in stored state")
    policy.load_state_dict(state)
    return policy


__all__ += ["POLICY_NAMES", "make_policy", "policy_from_state"]
