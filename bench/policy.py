"""How long one MOO decision takes over the full candidate set.

Feeds a MooPolicy (every compressor family: dense, bf16, PowerSGD at 3 ranks,
Top-k at 5 CRs over 3 collectives) through warm-up and exploration on a modelled
job, then times decide(): cached (the same observation again is no news: the
decision it has) and fresh (each call after a new observation, the network
alternating by 1%: decide() evaluates every candidate, computes the exact Pareto
front and applies hysteresis). Goal: fresh under 1 ms median, p99 under 2 ms.
Last line: {"decide_us": cached median, "decide_fresh_us": fresh median, ...}.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flexcomm.policy.moo import MooPolicy
from support.policy_sim import LAYOUT, Job


def timed(policy: MooPolicy, observe: Callable[[int], None], calls: int = 2000) -> list[float]:
    """Microseconds of each `observe(i)` followed by decide(), sorted."""
    samples = []
    for i in range(calls):
        t0 = time.perf_counter()
        observe(i)
        policy.decide()
        samples.append((time.perf_counter() - t0) * 1e6)
    return sorted(samples)


def main() -> None:
    policy = MooPolicy(LAYOUT.grad_bytes, layout=LAYOUT)
    job = Job(policy)
    job.run(60, 1e-3, 1e9)
    candidates = len(policy.evaluate())
    net = policy.network
    nets = (net, dataclasses.replace(net, beta_s_per_byte=net.beta_s_per_byte * 1.01))
    cached = timed(policy, lambda i: policy.observe_network(net))
    fresh = timed(policy, lambda i: policy.observe_network(nets[i % 2]))
    result = {
        "decide_us": round(statistics.median(cached), 2),
        "p99_us": round(cached[int(len(cached) * 0.99)], 2),
        "decide_fresh_us": round(statistics.median(fresh), 2),
        "fresh_p99_us": round(fresh[int(len(fresh) * 0.99)], 2),
        "candidates": candidates,
        "machine": f"{platform.machine()} {platform.python_implementation()} {platform.python_version()}",
    }
    print(f"decide() over {candidates} candidates: cached median {result['decide_us']} us, "
          f"p99 {result['p99_us']} us; fresh median {result['decide_fresh_us']} us, p99 {result['fresh_p99_us']} us")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
