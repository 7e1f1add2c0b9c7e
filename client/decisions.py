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
microseconds-fast, so it runs inline). A policy that knows the job's gradient
(`layout`) and takes a network (`network`) has it followed the way the agent
follows it: every step's sync goes to the same estimate (policy/linkestimate.py),
and the policy observes the network again when the estimate moves. Given none,
it gets its first from the syncs once the source knows the job's world size
(`use_world`, at set-up), with alpha 0, as the agent's for a job no probe has
reached: without it, the one-line fallback's MOO never saw the link move. The agent
client (client/agent_client.py) is the other implementation: it talks to the
node's agent in the background.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from flexcomm.policy.linkestimate import LinkEstimate, LinkEstimateConfig, SyncReader, network_news
from flexcomm.policy.types import Decision, GradientLayout, NetworkObservation, Policy, StepReport


@runtime_checkable
class DecisionSource(Protocol):
    def latest(self) -> Decision | None:
        """The newest decision, or None when there is none yet. Never blocks."""

    def report(self, report: StepReport) -> None:
        """Take one step's measurements. Never blocks."""

    def close(self) -> None:
        """Release resources."""


class PolicySource:
    """A `DecisionSource` over an in-process policy: report -> observe_steps (and
    the network estimate), latest -> choose (rank 0 asks once per agreement, as
    an agent's client once per message). `clock` stamps the estimate: the
    wall clock, as the agent's, since the estimate is saved in checkpoints and
    may resume on another host."""

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.time) -> None:
        for method in ("observe_steps", "choose"):
            if not callable(getattr(policy, method, None)):
                raise ValueError(f"policy: {type(policy).__name__} has no {method}()")
        self.policy = policy
        self.clock = clock
        self.estimate = LinkEstimate(LinkEstimateConfig(probes=False))  # nothing probes in-process
        self._reader: SyncReader | None = None
        self.world: int | None = None  # the job's ranks (`use_world`), for a policy given no network

    def use_world(self, world: int) -> None:
        """The job's ranks: with them a policy given no network learns one from
        its syncs (alpha 0, as the agent does for a job no probe has reached)."""
        self.world = world

    def latest(self) -> Decision | None:
        return self.policy.choose()

    def report(self, report: StepReport) -> None:
        self._follow_network(report)  # the network the step ran on, then the step (as the agent)
        self.policy.observe_steps((report,))

    def _follow_network(self, report: StepReport) -> None:
        net, layout = getattr(self.policy, "network", None), getattr(self.policy, "layout", None)
        given = isinstance(net, NetworkObservation)
        blind = net is None and hasattr(self.policy, "network")  # takes a network, was given none
        nodes = net.nodes if given else self.world if blind else None
        if nodes is None or not isinstance(layout, GradientLayout):
            return  # a policy that takes no network, or neither a network nor the world is known
        now = self.clock()
        if given:
            self.estimate.bucket = net.bucket  # the link's token bucket, as the policy prices it
            if self.estimate.beta_s_per_byte is None:
                self.estimate.observe_report(net.beta_s_per_byte, now)  # the network it was given
        if self._reader is None or self._reader.nodes != nodes:
            self._reader = SyncReader(layout, nodes, getattr(self.policy, "forms", None))
        self._reader.observe(self.estimate, (report,), now)
        if self.estimate.beta_s_per_byte is None:
            return  # the syncs have not read the link yet
        # Given none, the first has the estimate's bandwidth and no latency (none is measured in-process).
        seen = self.estimate.observation(net if given else NetworkObservation(0.0, self.estimate.beta_s_per_byte,
                                                                              nodes), now)
        if not given or network_news(net, seen):
            self.policy.observe_network(seen)

    def state_dict(self) -> dict[str, Any]:
        """The policy's state and the network estimate, for a checkpoint."""
        return {"policy": self.policy.state_dict(), "network_estimate": self.estimate.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict()`; a checkpoint without an estimate keeps this one."""
        self.policy.load_state_dict(state["policy"])
        if "network_estimate" in state:
            self.estimate.load_state_dict(state["network_estimate"])

    def close(self) -> None:
        pass


def as_source(source: DecisionSource | Policy) -> DecisionSource:
    """Accept either a DecisionSource or a bare Policy (wrapped in PolicySource)."""
    if all(callable(getattr(source, m, None)) for m in ("latest", "report", "close")):
        return source  # type: ignore[return-value]
    return PolicySource(source)  # type: ignore[arg-type]
