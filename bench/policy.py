"""How long one MOO decision takes over the full candidate set.

Feeds a MooPolicy (every compressor family: dense, bf16, PowerSGD at 3 ranks,
Top-k at 5 CRs over 3 collectives) through warm-up and exploration on a modelled
job, then times a decision two ways:
- fresh: choose() after a new network observation (the bandwidth a few percent
  off the last, below the change threshold): it evaluates every candidate,
  ranks them and applies hysteresis. This is what an agent pays once per
  observation. Goal: median < 1 ms, p99 < 2 ms.
- cached: decide(), the read an agent makes for repeated requests.
Each fresh figure also on the thread's CPU clock (decide_fresh_cpu_*), which a
busy host's scheduler does not inflate.
Last line: {"decide_fresh_us": median, "decide_fresh_p99_us": ..., "decide_cached_us": ...}.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flexcomm.policy.moo import MooPolicy
from support.policy_sim import LAYOUT, Job


def timed(call: Callable[[int], object], n: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    samples = []
    for i in range(n):
        t0 = clock()
        call(i)
        samples.append((clock() - t0) * 1e6)
    return sorted(samples)


def main() -> None:
    policy = MooPolicy(LAYOUT.grad_bytes, layout=LAYOUT)
    job = Job(policy)
    job.run(60, 1e-3, 1e9)
    candidates = len(policy.evaluate())
    net = policy.network
    assert net is not None
    # Two figures 2% apart, alternated: each is news, neither a change worth exploring.
    nets = [replace(net, beta_s_per_byte=net.beta_s_per_byte * f) for f in (1.0, 1.02)]

    def fresh(i: int) -> None:
        policy.observe_network(nets[i % 2])
        policy.choose()

    fresh_us = timed(fresh, 2000)
    # The same on the thread's CPU clock: on a shared host the wall clock's tail is
    # the scheduler's (another process's time slice), not the policy's.
    fresh_cpu_us = timed(fresh, 2000, time.thread_time)
    cached_us = timed(lambda i: policy.decide(), 2000)
    result = {
        "decide_fresh_us": round(statistics.median(fresh_us), 2),
        "decide_fresh_p99_us": round(fresh_us[int(len(fresh_us) * 0.99)], 2),
        "decide_fresh_cpu_us": round(statistics.median(fresh_cpu_us), 2),
        "decide_fresh_cpu_p99_us": round(fresh_cpu_us[int(len(fresh_cpu_us) * 0.99)], 2),
        "decide_cached_us": round(statistics.median(cached_us), 2),
        "candidates": candidates,
        "machine": f"{platform.machine()} {platform.python_implementation()} {platform.python_version()}",
    }
    print(f"choose() over {candidates} candidates on a fresh observation: median {result['decide_fresh_us']} us, "
          f"p99 {result['decide_fresh_p99_us']} us (CPU time: median {result['decide_fresh_cpu_us']} us, "
          f"p99 {result['decide_fresh_cpu_p99_us']} us); decide() {result['decide_cached_us']} us")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
