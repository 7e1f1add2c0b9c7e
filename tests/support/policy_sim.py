"""A deterministic stand-in for a training job, to drive policies in tests.

Policies are pure, so their tests feed them what a job would report: sync time
from the alpha-beta model times a systematic error (real systems are ~10-20% off
the model), compression time, and gains from a fixed curve.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from flexcomm.policy.costmodel import sync_time
from flexcomm.policy.types import NetworkObservation, Policy, StepReport


def gain_curve(cr: float) -> float:
    return 1.0 if cr >= 1.0 else min(1.0, 0.35 + 0.65 * (cr / 0.1) ** 0.3)


class Job:
    def __init__(self, policy: Policy, grad_bytes: float, nodes: int = 4, *, model_error: float = 1.15,
                 t_compute: float = 0.02, t_comp: Callable[[float], float] | None = None) -> None:
        self.policy, self.m, self.nodes = policy, grad_bytes, nodes
        self.model_error, self.t_compute = model_error, t_compute
        self.t_comp = t_comp or (lambda cr: 0.0 if cr == 1.0 else 0.005 + grad_bytes * cr * 2e-8)
        self.step = 0
        self.decisions: list[tuple[float, str]] = []

    def run(self, steps: int, latency_s: float, bandwidth_bps: float, *, noise: Callable[[int], float] | None = None
            ) -> None:
        net = NetworkObservation.from_link(latency_s, bandwidth_bps, self.nodes)
        self.policy.observe_network(net)
        for _ in range(steps):
            d = self.policy.decide()
            self.decisions.append((d.cr, d.collective))
            t_sync = sync_time(d.collective, self.m, d.cr, net) * self.model_error
            if noise:
                t_sync *= noise(self.step)
            self.policy.observe_step(StepReport(
                step=self.step, cr=d.cr, collective=d.collective, t_comp_s=self.t_comp(d.cr), t_sync_s=t_sync,
                gain=gain_curve(d.cr), t_compute_s=self.t_compute, gains={c: gain_curve(c) for c in d.probe_crs}))
            self.step += 1

    def switches(self, last: int) -> int:
        tail = self.decisions[-last:]
        return sum(1 for a, b in itertools.pairwise(tail) if a != b)
