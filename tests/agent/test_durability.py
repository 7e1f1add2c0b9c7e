"""An acknowledged step report is on disk: the agent is killed (SIGKILL) while
reports stream, and after the restart the store holds every report it had
acknowledged (bench/agent_durability.py does the same 20 times)."""

from __future__ import annotations

import random
import time
from pathlib import Path

from flexcomm.proto import agent_pb2 as pb
from support.agent_process import AgentProcess, spec, wait_for
from support.report_stream import ReportStreamer, stored_reports

JOBS = ("durable-0", "durable-1", "durable-2")


def test_no_acknowledged_report_is_lost_to_kill_9(tmp_path: Path) -> None:
    # A long flush interval: what is on disk at the kill got there by the acknowledgement.
    agent = AgentProcess(tmp_path, "--flush-interval", "60s")
    rng = random.Random(16)
    try:
        agent.start()
        for job in JOBS:
            agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec(job, policy="dense")), timeout=5)
        acked = dict.fromkeys(JOBS, 0)
        for _ in range(3):
            streamer = ReportStreamer(agent.socket, JOBS).start()
            wait_for(lambda s=streamer: sum(s.acked.values()) > 500, what="reports acknowledged")
            time.sleep(rng.uniform(0, 0.3))
            agent.kill9()
            for job, n in streamer.stop().items():
                acked[job] += n
            stored = stored_reports(agent.db, JOBS)
            assert all(stored[job] >= acked[job] for job in JOBS), (stored, acked)
            agent.start()
            resumed = {j.spec.job_id: j.reports for j in agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs}
            assert resumed == stored  # the job's count is written with its reports
    finally:
        agent.stop()
