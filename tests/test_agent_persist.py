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


def test_a_failed_flush_keeps_reports_and_decisions_for_the_next(tmp_path: Path) -> None:
    async def scenario() -> None:
        persister = Persister(str(tmp_path / "a.db"))
        await persister.open()
        job = _job()
        await persister.save_registration(job)
        job.ingest([StepReport(step=i, cr=1.0, collective="dense_ring", t_comp_s=0.0, t_sync_s=0.01, gain=1.0)
                    for i in range(5)], on_policy_error=lambda _: None)
        job.pending_decisions.append((job.decision, 123.0))
        real = persister.store.add_decision
        persister.store.add_decision = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
        with pytest.raises(OSError):
            await persister.flush([job])
        assert job.pending_reports == [] and len(job.pending_decisions) == 1  # reports were written
        persister.store.add_decision = real
        await persister.flush([job])
        assert job.pending_decisions == []
        assert len(persister.store.history("decisions", limit=10)) == 2  # registration's and the retried one
        await persister.close()

    asyncio.run(scenario())
