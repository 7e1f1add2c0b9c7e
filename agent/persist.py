"""Writing job state to the store and reading it back at start-up.

What the jobs hold unwritten (step reports, decisions, changed policy state)
is written by `flush`, every job's in one transaction (one sync to disk),
aggregated by epoch, CR and collective. The agent flushes on a timer, after a
decision changes, and before it acknowledges a report stream (group commit,
agent/commit.py): an acknowledged report is on disk. A registration is written
at once, the job row and its state in one transaction, so a job the agent said
yes to survives a kill -9 right after and a failed write leaves no half job.
The persister's store calls run on one worker thread, never on the event loop;
the probe scheduler's and the emulation's threads also write (measurements,
emulation steps) to the same Store, which serialises writers (a lock, and
BEGIN IMMEDIATE across processes).

At open the store is checked (store/damage.py). A damaged one stops the agent,
or, with `move_damaged`, is moved aside and a new one started, saying what was
lost. A 0-byte store file is said too (it opens as a new store).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from flexcomm.agent.jobs import Job
from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.types import Decision, Policy, StepReport
from flexcomm.store import BANDWIDTH, LATENCY, Measurement, Store, StoreDamaged
from flexcomm.store.damage import move_aside, what_it_held

log = logging.getLogger("flexcomm.agent.persist")
T = TypeVar("T")

Batch = tuple[str, list[StepReport], list[tuple[Decision, float]], dict[str, Any] | None]


def _checked_store(path: str) -> Store:
    store = Store(path)
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    return store


class Persister:
    def __init__(self, path: str, move_damaged: bool = False) -> None:
        self.path = path
        self.move_damaged = move_damaged
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexcomm-store")
        self.store: Store | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        self.store = await self._run(self._open_checked)

    def _open_checked(self) -> Store:
        try:
            store = _checked_store(self.path)
        except StoreDamaged as exc:
            if not self.move_damaged:
                raise StoreDamaged(f"{exc}; move_damaged_db (--move-damaged-db) moves it aside "
                                   "and starts a new store") from None
            path = Path(self.path)
            lost = what_it_held(path)
            moved = move_aside(path)
            log.error("store damaged: moved aside, starting a new one", extra={"fields": {
                "error": str(exc), "moved_to": str(moved), "lost": lost}})
            store = _checked_store(self.path)
        if store.was_empty_file:
            log.warning("store file was empty (0 bytes): starting a new store", extra={"fields": {
                "db": self.path}})
        return store

    async def close(self) -> None:
        if self.store is not None:
            await self._run(self.store.close)
            self.store = None
        self._executor.shutdown(wait=True)

    # -- writing --------------------------------------------------------------
    async def save_registration(self, job: Job) -> None:
        spec = job.spec.to_dict()
        reports, decisions, _ = job.take_pending()
        batch = (job.job_id, reports, decisions, job.state())
        await self._run(self._write_registration, spec, job.registered_unix, batch)

    def _write_registration(self, spec: dict, created: float, batch: Batch) -> None:
        assert self.store is not None
        with self.store.transaction():
            self.store.add_job(spec["job_id"], spec, created=created)
            self._write_batches([batch])

    async def save_end(self, job: Job, reason: str, ts: float) -> None:
        """Write what the job has not written yet, then mark it ended."""
        reports, decisions, _ = job.take_pending()
        await self._run(self._write_end, (job.job_id, reports, decisions, job.state()), reason, ts)

    def _write_end(self, batch: Batch, reason: str, ts: float) -> None:
        assert self.store is not None
        with self.store.transaction():
            self._write_batches([batch])
            self.store.end_job(batch[0], reason, ts=ts)

    async def flush(self, jobs: Iterable[Job]) -> int:
        """Write every job's pending reports, decisions and changed state in one
        transaction; return how many reports were written. A failed write is
        raised for the caller to log and count, and everything goes back to its
        job to be retried (nothing of it was written)."""
        batches: list[tuple[Job, Batch]] = []
        for job in list(jobs):
            reports, decisions, state = job.take_pending()
            if reports or decisions or state is not None:
                batches.append((job, (job.job_id, reports, decisions, state)))
        if not batches:
            return 0
        count = sum(len(b[1]) for _, b in batches)
        try:
            await self._run(self._write_in_one, [b for _, b in batches])
        except Exception:
            for job, (_, reports, decisions, _state) in batches:
                job.put_back(reports, decisions)
                job.dirty = True
            raise
        return count

    def _write_in_one(self, batches: list[Batch]) -> None:
        assert self.store is not None
        with self.store.transaction():
            self._write_batches(batches)

    def _write_batches(self, batches: list[Batch]) -> None:
        assert self.store is not None
        for job_id, reports, decisions, state in batches:
            if reports:
                self.store.add_step_reports(job_id, reports)
            for decision, ts in decisions:
                self.store.add_decision(job_id, decision, ts=ts)
            if state is not None:
                self.store.save_policy_state(job_id, state)

    async def prune(self, retention_s: float) -> dict[str, int]:
        """Delete rows older than `retention_s`; how many per table."""
        assert self.store is not None
        return await self._run(self.store.prune, retention_s)

    # -- reading --------------------------------------------------------------
    async def latest_measurements(self, per_kind: int = 1) -> list[Measurement]:
        """The newest `per_kind` measurements of each kind for every peer in the store."""
        assert self.store is not None
        return await self._run(self.store.latest_measurements, None, per_kind)

    async def history(self, job_id: str, peers: list[str], limit: int) -> tuple[list, dict[str, list]]:
        """The job's newest `limit` decisions (DecisionRecords, newest first) and each
        peer's newest `limit` successful probes of each kind (store rows, oldest first)."""
        assert self.store is not None
        return await self._run(self._read_history, job_id, peers, limit)

    def _read_history(self, job_id: str, peers: list[str], limit: int) -> tuple[list, dict[str, list]]:
        assert self.store is not None
        decisions = self.store.decisions(job_id, limit=limit)
        probes = {}
        for peer in peers:
            rows = []
            for kind in (BANDWIDTH, LATENCY):
                rows += self.store.history("measurements", peer=peer, kind=kind, ok=1, limit=limit)
            probes[peer] = sorted(rows, key=lambda r: r["ts"])
        return decisions, probes

    async def ended_jobs(self, limit: int) -> list[tuple[Any, list, list]]:
        """The newest `limit` ended jobs, newest first: (JobRecord, its last decision
        record (a list of at most one), its step aggregates)."""
        assert self.store is not None
        return await self._run(self._read_ended, limit)

    def _read_ended(self, limit: int) -> list[tuple[Any, list, list]]:
        assert self.store is not None
        ended = sorted(self.store.jobs(running=False), key=lambda j: j.ended or 0.0, reverse=True)[:limit]
        return [(j, self.store.decisions(j.job_id, limit=1), self.store.step_reports(j.job_id))
                for j in ended]

    async def load_jobs(self, create_policy: Callable[[JobSpec], Policy]) -> list[Job]:
        """Every running stored job with its policy resumed; a job that cannot be resumed
        (its policy is gone from this build, its state is damaged) is logged and
        skipped, and its rows are left alone."""
        assert self.store is not None
        records = await self._run(lambda: self.store.jobs(running=True))
        jobs = []
        for rec in records:
            try:
                spec = JobSpec.from_dict(rec.spec)
                job = Job(spec, create_policy(spec), registered_unix=rec.created)
                state = await self._run(self.store.load_policy_state, rec.job_id)
                if state:
                    job.restore(state)
                jobs.append(job)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("cannot resume job", extra={"fields": {"job": rec.job_id, "error": str(exc)}})
        return jobs
