"""100 short jobs launched and finished in a row against a real agent process.

One long job stays running throughout. Each short job is its own Python process
with an AgentClient (as rank 0 of a training job): it registers, reports
--steps steps, waits for the agent's decision, and exits; every other job calls
close(), the rest leave it to the interpreter's exit. Then `flexcomm status
--json` must list only the long job, and the store must hold every short job as
ended with its step reports and decisions.

Goal: after the 100 jobs, status lists only the running one and the store keeps
their history. Last line: one JSON object (status_jobs, ended_in_store,
with_history, wall_s, per_job_s median and max).

    python bench/job_lifecycle.py [--jobs 100] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flexcomm.client.agent_client import AgentClient
from flexcomm.store import Store
from support.agent_process import AgentProcess

JOB = """
import sys, time
from flexcomm.client.agent_client import AgentClient
from flexcomm.policy.types import StepReport
socket, job_id, steps, close = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "close"
client = AgentClient(socket, job_id=job_id, world_size=4, grad_bytes=10_000_000, nodes=["127.0.0.1"],
                     poll_interval_s=0.05)
for i in range(steps):
    client.report(StepReport(step=i, family="dense", param=0.0, collective="dense_ring", t_comp_s=0.0,
                             t_sync_s=0.02, t_compute_s=0.05, gain=1.0, bytes_sent=10_000_000))
deadline = time.monotonic() + 30
while client.latest() is None and time.monotonic() < deadline:
    time.sleep(0.01)
if close:
    client.close()
"""


def run_job(socket: str, i: int, steps: int) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", JOB, socket, f"short-{i:03d}", str(steps), "close" if i % 2 else "exit"],
                   check=True, timeout=120)
    return time.perf_counter() - t0


def status(socket: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "flexcomm.cli", "status", "--socket", socket, "--json"],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="flexcomm-jobs-") as tmp:
        agent = AgentProcess(Path(tmp)).start()
        try:
            long_job = AgentClient(agent.socket, job_id="long", world_size=2, grad_bytes=1_000_000,
                                   nodes=["127.0.0.1"], poll_interval_s=0.2)
            t0 = time.perf_counter()
            per_job = [run_job(agent.socket, i, args.steps) for i in range(args.jobs)]
            wall = time.perf_counter() - t0
            listed = [j["job_id"] for j in status(agent.socket)["jobs"]]
            with Store(agent.db, create=False) as store:
                ended = [j for j in store.jobs(running=False) if j.job_id.startswith("short-")]
                with_history = sum(
                    1 for j in ended
                    if sum(a.count for a in store.step_reports(j.job_id)) == args.steps and store.decisions(j.job_id))
                running = [j.job_id for j in store.jobs(running=True)]
            long_job.close()
        finally:
            agent.stop()
    print(f"{args.jobs} jobs of {args.steps} reports each in {wall:.1f} s "
          f"(median {statistics.median(per_job):.2f} s a job, process start included)")
    print(f"status lists {listed}; store: {len(ended)} ended short jobs, {with_history} with all their "
          f"reports and decisions; running in the store: {running}")
    ok = listed == ["long"] and len(ended) == args.jobs == with_history and running == ["long"]
    print(json.dumps({"jobs": args.jobs, "status_jobs": listed, "ended_in_store": len(ended),
                      "with_history": with_history, "running_in_store": running, "goal_met": ok,
                      "wall_s": round(wall, 2), "per_job_s_median": round(statistics.median(per_job), 3),
                      "per_job_s_max": round(max(per_job), 3), "cpus": os.cpu_count(),
                      "load_avg": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
