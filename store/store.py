"""`Store`: the typed API over the SQLite database (see the package docstring)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from flexcomm.policy.types import Decision, StepReport
from flexcomm.store import damage, schema
from flexcomm.store.damage import StoreDamaged
from flexcomm.store.records import (
    DecisionRecord,
    EmulationStep,
    JobRecord,
    Measurement,
    StepAggregate,
    aggregate_steps,
)

DEFAULT_PATH = "/var/lib/flexcomm/flexcomm.db"
BUSY_TIMEOUT_MS = 10_000


def now() -> float:
    """The store's clock (seconds since the epoch): the one used when a caller
    passes no timestamp."""
    return time.time()


def default_path() -> str:
    """$FLEXCOMM_DB, else /var/lib/flexcomm/flexcomm.db."""
    return os.environ.get("FLEXCOMM_DB") or DEFAULT_PATH


def _row(record: Any) -> dict[str, Any]:
    d = dataclasses.asdict(record)
    d.pop("id")
    return {k: (int(v) if isinstance(v, bool) else v) for k, v in d.items()}


def _measurement(row: Mapping[str, Any]) -> Measurement:
    d = dict(row)
    d["ok"] = bool(d["ok"])
    d["error"] = d["error"] or ""
    d["reverse"] = None if d["reverse"] is None else bool(d["reverse"])
    return Measurement(**d)


def _job(row: Mapping[str, Any]) -> JobRecord:
    return JobRecord(row["job_id"], json.loads(row["spec"]), row["created"], row["ended"],
                     row["end_reason"] or "")
def _check_place(path: Path, create: bool) -> None:
    """ValueError naming what stops a store living at `path` (a directory, a
    read-only file system, a directory that cannot be made)."""
    if path.is_dir():
        raise ValueError(f"db: {path} is a directory")
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"db: cannot create the directory {path.parent}: {exc.strerror}") from None
    where = path if path.exists() else path.parent
    if where.exists() and os.statvfs(where).f_flag & os.ST_RDONLY:
        raise ValueError(f"db: {path} is on a read-only file system")


def _is_empty_file(path: Path) -> bool:
    try:
        return path.stat().st_size == 0 and not Path(f"{path}-wal").exists()
    except FileNotFoundError:
        return False


class Store:
    """One SQLite database of measurements, decisions, step reports, emulation
    steps, jobs and policy state. Safe to share between threads (one connection,
    one lock) and between processes (WAL, busy timeout)."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True,
                 clock: Callable[[], float] = now) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
        self._depth = 0  # nesting of _write(): inner ones join the outer transaction
        if not create and not self.path.exists():
            raise ValueError(f"db: no flexcomm store at {self.path}")
        _check_place(self.path, create)
        # A 0-byte file opens as a new, empty store; whoever opened it may want to say so.
        self.was_empty_file = _is_empty_file(self.path)
        try:
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise ValueError(f"db: cannot open {self.path}: {exc}") from None
        try:
            self.db = sqlite_utils.Database(conn, execute_plugins=False)
            self._open_patiently()
        except sqlite3.OperationalError as exc:  # locked, read-only, I/O: not the file's fault
            conn.close()
            raise ValueError(f"db: cannot use {self.path}: {exc}") from None
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreDamaged(f"db: {self.path} is not a usable SQLite database ({exc})") from None
        except BaseException:
            conn.close()
            raise

    def _open_patiently(self) -> None:
        """`_open`, tried again while another process holds the file. Two processes
        switching a new file to WAL at once can deadlock on the lock upgrade, and
        SQLite then answers "database is locked" at once, without the busy timeout.
        Opening is idempotent (the migration re-reads its version under the write lock)."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        pause = 0.005
        while True:
            try:
                self._open()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(2 * pause, 0.25)

    def _open(self) -> None:
        where = str(self.path)
        schema.check_not_newer(schema.read_version(self.db), where)  # before WAL touches the file
        self.db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self.db.enable_wal()
        # FULL: a committed row survives a power cut, not only a killed process.
        self.db.execute("PRAGMA synchronous=FULL")
        self.migrated_from = schema.migrate(self.db, where)

    def check(self) -> None:
        """Raise StoreDamaged when the file is damaged: `PRAGMA quick_check`, the
        schema's tables and columns, every job and policy-state row decoded
        (store/damage.py). Reads the whole file: run it at start, not per request."""
        with self._lock:
            damage.check(self.db.conn, str(self.path))

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        with self._lock:
            return schema.read_version(self.db)

    def transaction(self) -> contextlib.AbstractContextManager[sqlite_utils.Database]:
        """Every write inside the block is one transaction: all of them are
        committed (one sync to disk) or none is."""
        return self._write()

    @contextmanager
    def _write(self) -> Iterator[sqlite_utils.Database]:
        """One write transaction, or a part of the enclosing one. IMMEDIATE takes
        the write lock up front (waiting out other writers): a deferred one that
        reads first (sqlite-utils reads the table's columns) fails with "database
        is locked" when another process commits in between, and the busy timeout
        cannot help it."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self.db
                finally:
                    self._depth -= 1
                return
            self.db.conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield self.db  # sqlite-utils' own atomic() nests as savepoints
                self.db.conn.execute("COMMIT")
            except BaseException:
                if self.db.conn.in_transaction:
                    self.db.conn.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0

    def _ts(self, ts: float | None) -> float:
        return self._clock() if ts is None else float(ts)

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.db.query(sql, params))

    # -- measurements --------------------------------------------------------
    def add_measurement(self, m: Measurement) -> Measurement:
        """Store `m` (stamped now if it has no ts); return it with ts and id."""
        m = dataclasses.replace(m, ts=self._ts(m.ts))
        with self._write() as db:
            row_id = db["measurements"].insert(_row(m)).last_pk
        return dataclasses.replace(m, id=row_id)

    def latest_measurements(self, peer: str | None = None, per_kind: int = 1) -> list[Measurement]:
        """The newest `per_kind` measurements of each kind for `peer` (every peer if
        None), by peer and kind, each kind's oldest first."""
        if not isinstance(per_kind, int) or per_kind < 1:
            raise ValueError(f"per_kind: must be an integer >= 1, got {per_kind!r}")
        where, params = ("WHERE peer = ?", [peer]) if peer is not None else ("", [])
        rows = self._query(
            "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY peer, kind ORDER BY ts DESC, id DESC)"
            f" AS newest FROM measurements {where}) WHERE newest <= ? ORDER BY peer, kind, ts, id",
            [*params, per_kind],
        )
        for r in rows:
            del r["newest"]
        return [_measurement(r) for r in rows]

    def measurements(self, peer: str | None = None, kind: str | None = None,
                     since: float | None = None, limit: int = 1000) -> list[Measurement]:
        """Measurements newest first, optionally of one peer/kind, from `since` on."""
        rows = self.history("measurements", peer=peer, kind=kind, since=since, limit=limit)
        return [_measurement(r) for r in rows]

    # -- decisions -----------------------------------------------------------
    def add_decision(self, job_id: str, decision: Decision, ts: float | None = None) -> DecisionRecord:
        rec = DecisionRecord(job_id=job_id, decision=decision, ts=self._ts(ts))
        d = decision.to_dict()
        row = {"ts": rec.ts, "job_id": job_id, **{k: d[k] for k in (
            "version", "family", "param", "collective", "root", "reason", "predicted_sync_s",
            "predicted_comp_s", "model_forms", "exploring")}}
        with self._write() as db:
            row_id = db["decisions"].insert(row).last_pk
        return dataclasses.replace(rec, id=row_id)

    def decisions(self, job_id: str, limit: int = 1000) -> list[DecisionRecord]:
        """The job's decisions, newest first."""
        out = []
        for r in self.history("decisions", job_id=job_id, limit=limit):
            fields = {k: r[k] for k in ("version", "family", "param", "collective", "root", "predicted_sync_s",
                                        "predicted_comp_s")}
            decision = Decision(**fields, reason=r["reason"] or "", model_forms=r["model_forms"] or "",
                                exploring=bool(r["exploring"]))
            out.append(DecisionRecord(job_id=r["job_id"], decision=decision, ts=r["ts"], id=r["id"]))
        return out

    # -- step reports (aggregated) ---------------------------------------------
    def add_step_reports(self, job_id: str, reports: Iterable[StepReport],
                         ts: float | None = None) -> list[StepAggregate]:
        """Aggregate a batch of step reports (one row per epoch, compression and collective)
        and store the rows in one transaction; return them."""
        return self.add_step_aggregates(aggregate_steps(job_id, reports), ts)

    def add_step_aggregates(self, aggregates: Iterable[StepAggregate],
                            ts: float | None = None) -> list[StepAggregate]:
        stamp = self._ts(ts)
        aggs = [dataclasses.replace(a, ts=stamp if a.ts is None else a.ts) for a in aggregates]
        out = []
        with self._write() as db:
            table = db["step_reports"]
            for a in aggs:
                out.append(dataclasses.replace(a, id=table.insert(_row(a)).last_pk))
        return out

    def step_reports(self, job_id: str, limit: int = 1000) -> list[StepAggregate]:
        """The job's aggregated step reports, newest first."""
        return [StepAggregate(**r) for r in self.history("step_reports", job_id=job_id, limit=limit)]

    # -- emulation steps -----------------------------------------------------
    def add_emulation_step(self, step: EmulationStep) -> EmulationStep:
        step = dataclasses.replace(step, ts=self._ts(step.ts))
        with self._write() as db:
            row_id = db["emulation_steps"].insert(_row(step)).last_pk
        return dataclasses.replace(step, id=row_id)

    def emulation_steps(self, interface: str | None = None, limit: int = 1000) -> list[EmulationStep]:
        """Applied emulation steps newest first, optionally for one interface."""
        rows = self.history("emulation_steps", interface=interface, limit=limit)
        return [EmulationStep(**{**r, "netns": r["netns"] or ""}) for r in rows]

    # -- jobs and policy state -------------------------------------------------
    def add_job(self, job_id: str, spec: Mapping[str, Any], created: float | None = None) -> JobRecord:
        """Register (or re-register, replacing the spec) a job; it is running again."""
        rec = JobRecord(job_id=job_id, spec=dict(spec), created=self._ts(created))
        with self._write() as db:
            db["jobs"].upsert({"job_id": job_id, "spec": json.dumps(rec.spec, sort_keys=True),
                               "created": rec.created, "ended": None, "end_reason": None}, pk="job_id")
        return rec

    def end_job(self, job_id: str, reason: str, ts: float | None = None) -> None:
        """Mark the job ended (its row and history stay); ValueError if unknown."""
        with self._write() as db:
            cursor = db.execute("UPDATE jobs SET ended = ?, end_reason = ? WHERE job_id = ?",
                                [self._ts(ts), reason, job_id])
            if cursor.rowcount != 1:
                raise ValueError(f"job_id: no job {job_id!r} in the store")

    def job(self, job_id: str) -> JobRecord | None:
        rows = self._query("SELECT * FROM jobs WHERE job_id = ?", [job_id])
        return _job(rows[0]) if rows else None

    def jobs(self, *, running: bool | None = None) -> list[JobRecord]:
        """Jobs oldest first: every one, or only the running (True) or ended (False) ones."""
        where = {None: "", True: "WHERE ended IS NULL", False: "WHERE ended IS NOT NULL"}[running]
        return [_job(r) for r in self._query(f"SELECT * FROM jobs {where} ORDER BY created")]

    def save_policy_state(self, job_id: str, state: Mapping[str, Any], ts: float | None = None) -> None:
        """Replace the job's policy state in one transaction: a reader (or an
        agent restarted after a crash) sees the old state or the new, never a mix."""
        text = json.dumps(dict(state), sort_keys=True)  # fails before anything is written
        with self._write() as db:
            db["policy_state"].upsert({"job_id": job_id, "state": text, "updated": self._ts(ts)},
                                      pk="job_id")

    def load_policy_state(self, job_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT state FROM policy_state WHERE job_id = ?", [job_id])
        return json.loads(rows[0]["state"]) if rows else None

    # -- reading and retention -------------------------------------------------
    def history(self, table: str = "measurements", *, since: float | None = None,
                limit: int = 100, **equal: Any) -> list[dict[str, Any]]:
        """Rows of a time-series table, newest first, as plain dicts. `equal`
        filters on columns (None means no filter), e.g. peer="10.0.0.2"."""
        if table not in schema.TIME_SERIES_TABLES:
            raise ValueError(f"table: must be one of {', '.join(schema.TIME_SERIES_TABLES)}, got {table!r}")
        with self._lock:
            columns = set(self.db[table].columns_dict)
        clauses, params = [], []
        for column, value in equal.items():
            if column not in columns:
                raise ValueError(f"{column}: not a column of {table}")
            if value is not None:
                clauses.append(f"[{column}] = ?")
                params.append(value)
        if since is not None:
            clauses.append("ts >= ?")
            params.append(float(since))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        params.append(int(limit))
        return self._query(f"SELECT * FROM [{table}] {where} ORDER BY ts DESC, id DESC LIMIT ?", params)

    def prune(self, older_than_s: float, now_ts: float | None = None) -> dict[str, int]:
        """Delete time-series rows older than `older_than_s` seconds (jobs and
        policy state are kept); return how many rows went from each table."""
        if older_than_s < 0:
            raise ValueError(f"older_than_s: must be >= 0, got {older_than_s!r}")
        cutoff = self._ts(now_ts) - older_than_s
        deleted = {}
        with self._write() as db:
            for table in schema.TIME_SERIES_TABLES:
                deleted[table] = db.execute(f"DELETE FROM [{table}] WHERE ts < ?", [cutoff]).rowcount
        return deleted
