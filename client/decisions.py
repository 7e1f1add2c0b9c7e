"""Where rank 0's decisions come from: the `DecisionSource` interface.

Only rank 0 ever calls a source; every rank then adopts rank 0's decision through
the control-interval collective (client/agreement.py), so other ranks' sources,
if any, are never consulted. A source must never block the training step:

    class DecisionSource(Protocol):
        def latest(self) -> Decision | None   # the newest decision, or None for "no news"
        def report(self, report: StepReport) -> None   # one step's measurements
        def close(self) -> None

- `latest()` returns at once. None means "keep running what you run now".
  The client validates what it gets; a decision it cannot run (a model-only
  collective) is ignored and the previous one kept.
- `report()` returns at once (a remote source enqueues it). Reports carry the
  gains of the compressions in the decision's `probes`.
- `close()` releases whatever the source holds (threads, channels).

`PolicySource` wraps an in-process `flexcomm.policy` Policy (pure and
microseconds-fast, so it runs inline). The agent client (client/agent_client.py)
is the other implementation: it talks to the node's agent in the background.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from flexcomm.policy.types import Decision, Policy, StepReport


@runtime_checkable
class DecisionSource(Protocol):
    def latest(self) -> Decision | None:
        """The newest decision, or None when there is none yet. Never blocks."""

    def report(self, report: StepReport) -> None:
        """Take one step's measurements. Never blocks."""

    def close(self) -> None:
        """Release resources."""


class PolicySource:
    """A `DecisionSource` over an in-process policy: report -> observe_step,
    latest -> decide."""

    def __init__(self, policy: Policy) -> None:
        for method in ("observe_step", "decide"):
            if not callable(getattr(policy, method, None)):
                raise ValueError(f"policy: {type(policy).__name__} has no {method}()")
        self.policy = policy

    def latest(self) -> Decision | None:
        return self.policy.decide()

    def report(self, report: StepReport) -> None:
        self.policy.observe_step(report)

    def close(self) -> None:
        pass


def as_source(source: DecisionSource | Policy) -> DecisionSource:
    """Accept either a DecisionSource or a bare Policy (wrapped in PolicySource)."""
    if all(callable(getattr(source, m, None)) for m in ("latest", "report", "close")):
        return source  # type: ignore[return-value]
    return PolicySource(source)  # type: ignore[arg-type]
