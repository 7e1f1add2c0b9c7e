"""A failed store write gives back what it did not write; nothing is dropped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flexcomm.agent.commit import GroupCommit
from flexcomm.agent.jobs import Job
from flexcomm.agent.persist import Persister
from flexcomm.policy import make_policy
from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.types import StepReport


def _job() -> Job:
    spec = JobSpec(job_id="j", world_size=2, grad_bytes=4096, nodes=(), policy="dense", options={})
    return Job(spec, make_policy("dense", grad_bytes=4096, nodes=2))


def test_a_failed_flush_writes_nothing_and_keeps_everything_for_the_next(tmp_path: Path, monkeypatch) -> None:
    """The second of two decisions fails: the flush is one transaction, so nothing
    of it is written, and the next flush writes each report and decision once."""
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
        assert len(job.pending_reports) == 5 and [ts for _, ts in job.pending_decisions] == [123.0, 124.0]
        assert persister.store.step_reports("j") == [] and len(persister.store.decisions("j")) == 1
        monkeypatch.setattr(persister.store, "add_decision", real)
        await persister.flush([job])
        assert job.pending_decisions == [] and job.pending_reports == []
        assert len(persister.store.decisions("j")) == 3  # registration's, then 123 once and 124 once
        assert sum(a.count for a in persister.store.step_reports("j")) == 5
        await persister.close()

    asyncio.run(scenario())


def test_a_registration_that_fails_leaves_no_half_job(tmp_path: Path, monkeypatch) -> None:
    async def scenario() -> None:
        persister = Persister(str(tmp_path / "a.db"))
        await persister.open()

        def disk_full(*args, **kwargs):
            raise OSError("disk full")

        monkeypatch.setattr(persister.store, "save_policy_state", disk_full)
        with pytest.raises(OSError):
            await persister.save_registration(_job())
        assert persister.store.jobs() == [] and persister.store.decisions("j") == []
        await persister.close()

    asyncio.run(scenario())


def test_group_commit_shares_writes_and_never_acks_before_a_write_that_started_after() -> None:
    async def scenario() -> None:
        started: list[int] = []
        finished: list[int] = []
        release = asyncio.Event()

        async def write() -> None:
            started.append(len(started))
            await release.wait()
            finished.append(started[-1])

        commits = GroupCommit(write)
        first = asyncio.create_task(commits.commit())
        while not started:  # the first write is running
            await asyncio.sleep(0)
        waiters = [asyncio.create_task(commits.commit()) for _ in range(20)]
        await asyncio.sleep(0)  # one turn of the loop: each waiter runs up to its wait
        assert started == [0] and not first.done() and not any(w.done() for w in waiters)
        release.set()
        await first
        await asyncio.gather(*waiters)
        assert started == [0, 1] and finished == [0, 1]  # twenty callers, one more write

        async def failing() -> None:
            raise OSError("disk full")

        with pytest.raises(OSError, match="disk full"):
            await GroupCommit(failing).commit()

    asyncio.run(scenario())
