"""A deterministic stand-in for a training job, to drive policies in tests.

Policies are pure, so their tests feed them what a job would report: sync time
from the alpha-beta model of the job's gradient layout times a systematic error
(real systems are ~10-20% off the model), compression time per family, a fixed
compute time, and gains from fixed curves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from flexcomm.policy.costmodel import option_sync_time
from flexcomm.policy.types import Compression, Decision, GradientLayout, NetworkObservation, Policy, StepReport

# A 4M-parameter fp32 model: 4 matrices of 1000 x 1000 and 10k vector values.
LAYOUT = GradientLayout(((1000, 1000),) * 4, 10_000, 4)


def gain_of(c: Compression) -> float:
    """Top-k keeps more of the gradient's mass at larger CRs; PowerSGD at larger ranks."""
    if c.family == "topk":
        return min(1.0, 0.35 + 0.65 * (c.param / 0.1) ** 0.3)
    if c.family == "powersgd":
        return min(1.0, 0.55 + 0.1 * math.log2(c.rank))
    return 1.0


def comp_time(c: Compression) -> float:
    return {"dense": 0.0, "bf16": 0.004, "powersgd": 0.01 + 0.002 * c.rank}.get(c.family, 0.005 + c.param * 0.3)


class Job:
    def __init__(self, policy: Policy, layout: GradientLayout = LAYOUT, nodes: int = 4, *,
                 model_error: float = 1.15, t_compute: float = 0.02,
                 t_comp: Callable[[Compression], float] = comp_time, control_interval: int = 1) -> None:
        """`control_interval`: steps between the decisions the job adopts, as the
        client's agreement every K steps (it runs the last one in between)."""
        self.policy, self.layout, self.nodes = policy, layout, nodes
        self.control_interval = control_interval
        self.adopted: Decision | None = None
        self.model_error, self.t_compute, self.t_comp = model_error, t_compute, t_comp
        self.step = 0
        self.decisions: list[str] = []
        self.exploring: list[bool] = []

    def run(self, steps: int, latency_s: float, bandwidth_bps: float, *,
            noise: Callable[[int], float] | None = None, host: Callable[[int], float] | None = None,
            observe: bool = True, grad_norm: Callable[[int], float] | None = None) -> None:
        """`steps` steps on this link; the policy is told the network first unless
        observe=False (a probe that has not seen the change). noise(step) scales
        the sync time alone (the link); host(step) every time the step reports
        (a loaded CPU slows compute, compression and gloo's own work alike);
        grad_norm(step) the gradient norm each step reads (none by default)."""
        net = NetworkObservation.from_link(latency_s, bandwidth_bps, self.nodes)
        if observe:
            self.policy.observe_network(net)
        for _ in range(steps):
            if self.adopted is None or self.step % self.control_interval == 0:
                self.adopted = self.policy.choose()
            d = self.adopted
            self.decisions.append(d.label)
            self.exploring.append(d.exploring)
            t_sync = option_sync_time(d.compression, d.collective, self.layout, net) * self.model_error
            if noise:
                t_sync *= noise(self.step)
            slow = host(self.step) if host else 1.0
            self.policy.observe_steps([StepReport(
                step=self.step, family=d.family, param=d.param, collective=d.collective,
                t_comp_s=self.t_comp(d.compression) * slow, t_sync_s=t_sync * slow, gain=gain_of(d.compression),
                t_compute_s=self.t_compute * slow,
                gains={name: gain_of(Compression.parse(name)) for name in d.probes},
                grad_norm=grad_norm(self.step) if grad_norm else 0.0)])
            self.step += 1

    def switches(self, last: int) -> int:
        tail = self.decisions[-last:]
        return sum(1 for a, b in itertools.pairwise(tail) if a != b)
