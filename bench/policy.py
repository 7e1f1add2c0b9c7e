"""How long one MOO decision takes over the full candidate set.

Feeds a MooPolicy (every compressor family: dense, bf16, PowerSGD at 3 ranks,
Top-k at 5 CRs over 3 collectives) through warm-up and exploration on a modelled
job, then times an observation followed by decide() (which evaluates every
candidate, computes the exact Pareto front and applies hysteresis). Goal: well
under a millisecond.
Last line: {"decide_us": median, ...}.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flexcomm.policy.moo import MooPolicy
from support.policy_sim import LAYOUT, Job


def main() -> None:
    policy = MooPolicy(LAYOUT.grad_bytes, layout=LAYOUT)
    job = Job(policy)
    job.run(60, 1e-3, 1e9)
    candidates = len(policy.evaluate())
    net = policy.network
    samples = []
    for _ in range(2000):
        t0 = time.perf_counter()
        policy.observe_network(net)  # a new observation: decide() re-evaluates every candidate
        policy.decide()
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    result = {
        "decide_us": round(statistics.median(samples), 2),
        "p99_us": round(samples[int(len(samples) * 0.99)], 2),
        "candidates": candidates,
        "machine": f"{platform.machine()} {platform.python_implementation()} {platform.python_version()}",
    }
    print(f"decide() over {candidates} candidates: median {result['decide_us']} us, p99 {result['p99_us']} us")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
