"""Acknowledged means durable: kill -9 the agent under streaming load, many times.

Each round: 8 jobs stream step reports to a real agent (one thread per job, 50
reports per ReportSteps call, as fast as the agent answers), the agent is killed
with SIGKILL at a random moment (0.2-1.5 s in), then restarted on the same store;
every report the agent had acknowledged so far must be in the store, and each
resumed job's report count must equal what its store holds. The flush timer is
set to 60 s, so what is on disk at a kill got there by the acknowledgement.

Goal: 0 acknowledged reports lost over 20 kill -9 restarts. Last line: one JSON
object.

    python bench/agent_durability.py [--restarts 20] [--jobs 8] [--seed 16]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flexcomm.proto import agent_pb2 as pb
from support.agent_process import AgentProcess, spec
from support.report_stream import ReportStreamer, stored_reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fca-durable-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, workdir: Path) -> None:

    rng = random.Random(args.seed)
    jobs = [f"durable-{i}" for i in range(args.jobs)]
    agent = AgentProcess(workdir, "--flush-interval", "60s",
                         "--log-level", "warning")
    baseline = dict.fromkeys(jobs, 0)  # what the store held before the round
    rounds = []
    load_before = os.getloadavg()
    try:
        agent.start()
        for job in jobs:
            agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec(job, policy="moo")), timeout=10)
        for _ in range(args.restarts):
            streamer = ReportStreamer(agent.socket, jobs).start()
            time.sleep(rng.uniform(0.2, 1.5))
            agent.kill9()
            acked = streamer.stop()
            stored = stored_reports(agent.db, jobs)
            agent.start()
            resumed = {j.spec.job_id: j.reports for j in agent.stub.ListJobs(pb.ListJobsRequest(), timeout=10).jobs}
            rounds.append({"acked": sum(acked.values()), "stored_new": sum(stored[j] - baseline[j] for j in jobs),
                           "lost": sum(max(0, baseline[j] + acked[j] - stored[j]) for j in jobs),
                           "unanswered_calls": streamer.failed_calls,
                           "resumed_count_matches": resumed == stored})
            baseline = stored
    finally:
        agent.stop()

    result = {
        "restarts": len(rounds),
        "acknowledged_reports": sum(r["acked"] for r in rounds),
        "lost": sum(r["lost"] for r in rounds),
        "resumed_counts_match": all(r["resumed_count_matches"] for r in rounds),
        "goals": {"restarts": args.restarts, "lost": 0},
        "detail": {"jobs": args.jobs, "seed": args.seed, "rounds": rounds,
                   "load_avg_before": [round(x, 2) for x in load_before],
                   "load_avg_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()},
    }
    print(f"{len(rounds)} kill -9 restarts under streaming load: {result['lost']} of "
          f"{result['acknowledged_reports']} acknowledged report(s) lost")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
