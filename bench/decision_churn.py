"""Decision churn on a steady network: how often the agent's MOO explores again
when nothing about the network changes but a CPU-heavy process shares the cores.

One lab job (real namespaces and HTB links at one steady rate, real `flexcomm
agent`s probing, real gloo ranks) trains a small model (hidden 150: ~136 KB of
gradient) for --steps steps with the agent deciding (MOO), while --competitors
busy loops run on the same cores. Counted from node 0's agent store and log:
explorations after the first (each with what started it), decision versions,
the network estimate's moves and the bandwidth tests with their share of wall
time, and the agent's bandwidth estimate (its median over the run against the
link's goodput). Goals: at most 1 exploration per 1,000 steps, the estimate's
median within 10% of the goodput. Needs root for the
namespaces (without it the lab runs on loopback, unshaped and unprobed, and the
JSON says so). The last printed line is one JSON object.

    .venv/bin/python bench/decision_churn.py [--steps 3000] [--rate 100Mbit] [--nodes 2]
        [--competitors 1] [--moo-options explore_share=0.05] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from flexcomm.lab.plan import agent_store, parse_policies
from flexcomm.lab.runner import LabConfig, run_lab
from flexcomm.lab.workload import WorkloadSpec
from flexcomm.store import Store

PREFIX, SUBNET = "fcbdc", "10.242.0.0/24"
BUSY_LOOP = "while True:\n    pass\n"
MEASURING = re.compile(r"^measuring (\d+)/\d+ \((.*)\)$")


def steady_schedule(rate: str) -> str:
    return f'name = "steady"\n[[step]]\nepoch = 0\nrate = "{rate}"\n'


def trigger(why: str) -> str:
    """What started an exploration, as a category: the network (with the evidence
    it moved on), the chosen option's measured sync time, or the gain."""
    if why.startswith("network moved"):
        evidence = re.match(r"network moved \(([^)]*)\)", why)
        return f"network ({evidence.group(1)})" if evidence else "network"
    if why.startswith("measured sync time"):
        return "sync time moved"
    return why.split(":")[0]


def explorations(db: Path) -> tuple[int, list[str], int]:
    """Explorations after the first (the policy's own count), what started each
    (one per run of decisions "measuring k/N (why)" whose why changes or whose k
    goes back), and the decision versions."""
    with Store(db, create=False) as store:
        job = next(j for j in store.jobs() if j.spec.get("policy") == "moo")
        decisions = store.decisions(job.job_id, limit=10**6)
        state = store.load_policy_state(job.job_id) or {}
    count = state.get("policy", {}).get("state", {}).get("explorations", 0)
    whys, last = [], (None, 0)
    for d in sorted(decisions, key=lambda d: d.decision.version):
        m = MEASURING.match(d.decision.reason)
        if m and (m.group(2) != last[0] or int(m.group(1)) <= last[1]):
            whys.append(m.group(2))
        last = (m.group(2), int(m.group(1))) if m else (None, 0)
    return max(count - 1, 0), whys[1:], max((d.decision.version for d in decisions), default=0)


def probing(db: Path, since: float, until: float) -> tuple[int, float]:
    with Store(db, create=False) as store:
        tests = [m for m in store.measurements(kind="bandwidth", limit=10**6)
                 if m.ts is not None and since <= m.ts <= until]
    return len(tests), sum(m.duration_s or 0.0 for m in tests)


def soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    policy = "moo" + (f":{args.moo_options}" if args.moo_options else "")
    cfg = LabConfig(out=out, policies=parse_policies(policy), nodes=args.nodes,
                    schedule_text=steady_schedule(args.rate), schedule_name="steady", steps=args.steps,
                    eval_every=max(1, args.steps // 3), workload=WorkloadSpec(hidden=150),
                    prefix=args.prefix, subnet=args.subnet, policy_timeout_s=3600.0)
    competitors = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.competitors)]
    start = time.time()
    try:
        summary = run_lab(cfg)
    finally:
        for proc in competitors:
            proc.kill()
            proc.wait()
    wall = time.time() - start
    db = agent_store(out, policy)
    count, whys, versions = explorations(db)
    tests, tested_s = probing(db, start, start + wall)
    log = db.with_suffix(".log").read_text(errors="replace")
    steps = summary.policies[policy].steps
    phase = (summary.policies[policy].estimate_tracking or [{}])[0]
    estimate, goodput = phase.get("estimated_bps"), phase.get("goodput_bps")
    return {"bench": "decision_churn", "steps": steps, "explorations": count,
            "explorations_per_1000_steps": round(1000 * count / max(steps, 1), 2),
            "triggers": dict(Counter(trigger(w) for w in whys)), "decision_versions": versions,
            "estimate_moves": log.count("network estimate moved"), "bandwidth_tests": tests,
            "bandwidth_test_share_of_wall": round(tested_s / wall, 4), "wall_s": round(wall, 1),
            "estimate_median_bps": estimate, "goodput_bps": goodput,
            "estimate_within_10pct": bool(estimate and goodput and abs(estimate - goodput) <= 0.1 * goodput),
            "shaped": summary.settings.shaped, "rate": args.rate, "nodes": args.nodes,
            "competitors": args.competitors, "moo_options": args.moo_options or None,
            "first_whys": whys[:5]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rate", default="100Mbit", help="the steady link rate")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--competitors", type=int, default=1, help="CPU busy loops beside the job")
    parser.add_argument("--moo-options", default="", help="k=v,... for the MOO (e.g. a proposed setting)")
    parser.add_argument("--out", help="run directory (default: a temporary one)")
    parser.add_argument("--prefix", default=PREFIX, help="namespace name prefix")
    parser.add_argument("--subnet", default=SUBNET, help="the nodes' subnet")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="decision-churn-")) / "run"
    result = soak(args, out)
    print(f"{result['steps']} steps in {result['wall_s']} s, {args.competitors} competitor(s), "
          f"{args.rate} steady: {result['explorations']} explorations after the first "
          f"({result['explorations_per_1000_steps']} per 1,000 steps; goal <= 1), {result['triggers']}")
    print(f"decision versions {result['decision_versions']}, estimate moves {result['estimate_moves']}, "
          f"bandwidth tests {result['bandwidth_tests']} "
          f"({100 * result['bandwidth_test_share_of_wall']:.2f}% of wall time); estimate median "
          f"{result['estimate_median_bps']} bit/s against goodput {result['goodput_bps']} bit/s; run in {out}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
