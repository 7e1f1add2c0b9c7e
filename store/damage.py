"""Finding a damaged store, and moving one aside.

A store is damaged when SQLite says so (the file is not a database, a page is
malformed, `PRAGMA quick_check` finds a fault), when a table or column the
schema made is missing, or when a job or policy-state row does not decode.
`check` finds all of that; the agent runs it at start, so damage stops it there
instead of failing a later write. `move_aside` renames the file with its WAL
and shared-memory files (a new store at the old path must not replay the old
WAL), and `what_it_held` says, as far as it can still be read, what was in it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from flexcomm.store import schema

# SQLite keeps a database's uncommitted and recent pages beside it in these.
COMPANION_SUFFIXES = ("-wal", "-shm")
MAX_FAULTS_SHOWN = 3


class StoreDamaged(ValueError):
    """The store's file is damaged (not a database, malformed, undecodable rows)."""


def check(conn: sqlite3.Connection, where: str) -> None:
    """Raise StoreDamaged naming the first faults found in the open database."""
    try:
        faults = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
        if faults != ["ok"]:
            raise StoreDamaged(f"db: {where} is damaged: {'; '.join(faults[:MAX_FAULTS_SHOWN])}")
        _check_schema(conn, where)
        _check_rows(conn, where)
    except sqlite3.DatabaseError as exc:
        raise StoreDamaged(f"db: {where} is damaged: {exc}") from None


def _check_schema(conn: sqlite3.Connection, where: str) -> None:
    for table, wanted in schema.expected_columns().items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info([{table}])")}
        if not have:
            raise StoreDamaged(f"db: {where} is damaged: table {table} is missing")
        missing = sorted(wanted - have)
        if missing:
            raise StoreDamaged(f"db: {where} is damaged: table {table} lacks {', '.join(missing)}")


def _check_rows(conn: sqlite3.Connection, where: str) -> None:
    for table, key, column in (("jobs", "job_id", "spec"), ("policy_state", "job_id", "state")):
        for row_key, text in conn.execute(f"SELECT [{key}], [{column}] FROM [{table}]"):
            try:
                decoded = json.loads(text)
            except (TypeError, ValueError):
                decoded = None
            if not isinstance(row_key, str) or not isinstance(decoded, dict):
                raise StoreDamaged(f"db: {where} is damaged: the {column} of {table} row {row_key!r:.80} "
                                   "does not decode")


def move_aside(path: Path) -> Path:
    """Rename the store (and its WAL and shared memory) to PATH.damaged-TIME; return the new path."""
    moved = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    for suffix in ("", *COMPANION_SUFFIXES):
        source = Path(f"{path}{suffix}")
        if source.exists():
            source.rename(f"{moved}{suffix}")
    return moved


def what_it_held(path: Path) -> dict[str, Any]:
    """Rows per table and the job ids of a (damaged) store, each "unreadable" where
    it cannot be read any more. Opens the file read-only."""
    held: dict[str, Any] = {}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return {"tables": "unreadable"}
    try:
        for table in schema.expected_columns():
            held[table] = _read(conn, f"SELECT COUNT(*) FROM [{table}]", lambda rows: rows[0][0])
        held["job_ids"] = _read(conn, "SELECT job_id FROM jobs ORDER BY job_id",
                                lambda rows: [r[0] for r in rows])
    finally:
        conn.close()
    return held


def _read(conn: sqlite3.Connection, sql: str, shape: Any) -> Any:
    try:
        return shape(conn.execute(sql).fetchall())
    except (sqlite3.Error, IndexError, ValueError):
        return "unreadable"
