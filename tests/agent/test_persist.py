"""A failed store write gives back what it did not write; nothing is dropped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flexcomm.agent.jobs import Job
from flexcomm.agent.persist import Persister
from flexcomm.policy import make_policy
from flexcomm.policy.types import StepReport
from flexcomm.proto.validate import JobSpec


def _job() -> Job:
    spec = JobSpec(job_id="j", world_size=2, grad_bytes=4096, nodes=(), policy="dense", options={})
    return Job(spec, make_policy("dense", grad_bytes=4096, nodes=2))


def test_a_failed_flush_keeps_reports_and_decisions_for_the_next(tmp_path: Path, monkeypatch) -> None:
    """The second of two decisions fails: the first stays written and is not written again."""
    async def scenario() -> None:
        persister = Persister(str(tmp_path / "a.db"))
        await persister.open()
        job = _job()
        await persister.save_registration(job)
        job.ingest([StepReport(step=i, family="dense", param=0, collective="dense_ring", t_comp_s=0.0, t_sync_s=0.01,
                               gain=1.0)
                    for i in range(5)], on_policy_error=lambda _: None)
        job.pending_decisions += [(job.decision, 123.0), (job.decision, 124.0)]
        real = persister.store.add_decision
        calls = []

        def full_on_second(*args, **kwargs):
            calls.append(args)
            if len(calls) == 2:
                raise OSError("disk full")
            return real(*args, **kwargs)

        monkeypatch.setattr(persister.store, "add_decision", full_on_second)
        with pytest.raises(OSError):
            await persister.flush([job])
        assert job.pending_reports == []  # reports were written
        assert [ts for _, ts in job.pending_decisions] == [124.0]  # only the unwritten one
        monkeypatch.setattr(persister.store, "add_decision", real)
        await persister.flush([job])
        assert job.pending_decisions == []
        stored = persister.store.history("decisions", limit=10)
        assert len(stored) == 3  # registration's, then 123 once and 124 once
        await persister.close()

    asyncio.run(scenario())
