"""Step reports streamed to an agent as fast as it acknowledges them, counting
what it acknowledged: the load under which a kill -9 must lose nothing acked.
Used by tests/agent/test_durability.py and bench/agent_durability.py."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import grpc

from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc
from flexcomm.store import Store
from support.waiting import scaled


def report_message(job_id: str, first_step: int, count: int) -> pb.ReportStepsRequest:
    return pb.ReportStepsRequest(job_id=job_id, reports=[
        pb.StepReport(step=first_step + k, family="dense", collective=pb.COLLECTIVE_DENSE_RING, t_sync_s=0.01,
                      t_compute_s=0.02, gain=1.0)
        for k in range(count)])


class ReportStreamer:
    """One thread per job, each sending `batch` reports per ReportSteps call until
    stopped; `acked[job]` counts the reports of answered calls only."""

    def __init__(self, socket: str, job_ids: Sequence[str], batch: int = 50) -> None:
        self.socket = socket
        self.batch = batch
        self.acked = dict.fromkeys(job_ids, 0)
        self.failed_calls = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._stream, args=(job,), daemon=True) for job in job_ids]

    def start(self) -> ReportStreamer:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> dict[str, int]:
        self._stop.set()
        for t in self._threads:
            t.join(scaled(30))
        return self.acked

    def _stream(self, job_id: str) -> None:
        with grpc.insecure_channel(f"unix:{self.socket}") as channel:
            stub = pb_grpc.AgentStub(channel)
            while not self._stop.is_set():
                message = report_message(job_id, self.acked[job_id], self.batch)
                try:
                    response = stub.ReportSteps(iter([message]), timeout=5)
                except grpc.RpcError:  # the agent is gone (killed): what was not answered does not count
                    self.failed_calls += 1
                    self._stop.wait(0.05)
                    continue
                self.acked[job_id] += response.accepted


def stored_reports(db: str | Path, job_ids: Sequence[str]) -> dict[str, int]:
    """How many step reports of each job the store holds (its aggregated rows' counts)."""
    with Store(db) as store:
        return {job: sum(a.count for a in store.step_reports(job, limit=10**9)) for job in job_ids}
