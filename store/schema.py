"""The store's schema: the one place that knows its tables, and how to move a
database forward from any older version.

`schema_version` holds a single row with the version the database is at.
`MIGRATIONS[i]` takes a database from version i to version i + 1; a migration is
never edited once released (old databases in the field were made by it): change
the schema by appending one. `migrate` runs the missing ones, all in one
`BEGIN IMMEDIATE` transaction, so two processes opening the same old file at
once cannot both migrate it, and a crash mid-migration leaves the old version.
A database from a newer flexcomm is refused (`SchemaVersionError`), never touched.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable

import sqlite_utils

# Tables whose rows are a time series (column `ts`): what retention pruning trims.
TIME_SERIES_TABLES: tuple[str, ...] = ("measurements", "decisions", "step_reports", "emulation_steps")


class SchemaVersionError(ValueError):
    """The database was written by a newer flexcomm than this one."""


def _v0_to_v1(db: sqlite_utils.Database) -> None:
    db["measurements"].create(
        {
            "id": int, "ts": float, "peer": str, "kind": str, "ok": int, "error": str,
            "bandwidth_bps": float, "rtt_min_s": float, "rtt_p50_s": float,
            "rtt_p99_s": float, "loss": float, "alpha_s": float, "beta_s_per_byte": float,
        },
        pk="id", not_null={"ts", "peer", "kind", "ok"},
    )
    db["decisions"].create(
        {
            "id": int, "ts": float, "job_id": str, "version": int, "cr": float,
            "collective": str, "root": str, "reason": str, "predicted_sync_s": float,
            "predicted_comp_s": float, "model_forms": str,
        },
        pk="id", not_null={"ts", "job_id", "version", "cr", "collective"},
    )
    db["step_reports"].create(
        {
            "id": int, "ts": float, "job_id": str, "step_first": int, "step_last": int,
            "epoch": int, "cr": float, "collective": str, "count": int,
            "mean_t_comp_s": float, "mean_t_sync_s": float, "mean_gain": float,
            "mean_t_compute_s": float, "bytes_sent": int,
        },
        pk="id", not_null={"ts", "job_id", "step_first", "step_last", "cr", "collective", "count"},
    )
    db["emulation_steps"].create(
        {
            "id": int, "ts": float, "interface": str, "netns": str, "step_index": int,
            "rate_bps": float, "delay_s": float, "jitter_s": float, "loss": float,
        },
        pk="id", not_null={"ts", "interface", "step_index"},
    )
    db["jobs"].create({"job_id": str, "spec": str, "created": float}, pk="job_id")
    db["policy_state"].create({"job_id": str, "state": str, "updated": float}, pk="job_id")


def _v1_to_v2(db: sqlite_utils.Database) -> None:
    # How a bandwidth test was run (a reverse or multi-stream figure is not
    # comparable with a single forward stream), and ts indexes for pruning and
    # "latest per peer" reads.
    table = db["measurements"]
    table.add_column("streams", int)
    table.add_column("reverse", int)
    table.add_column("duration_s", float)
    table.create_index(["peer", "kind", "ts"], if_not_exists=True)
    for name in TIME_SERIES_TABLES:
        db[name].create_index(["ts"], if_not_exists=True)


def _v2_to_v3(db: sqlite_utils.Database) -> None:
    # A step runs a compressor family and its parameter, not just a Top-k CR:
    # older rows ran Top-k below cr 1 and dense at 1.
    for name in ("decisions", "step_reports"):
        db.execute(f"ALTER TABLE {name} ADD COLUMN family TEXT NOT NULL DEFAULT 'dense'")
        db.execute(f"ALTER TABLE {name} ADD COLUMN param FLOAT NOT NULL DEFAULT 0")
        db.execute(f"UPDATE {name} SET family = 'topk', param = cr WHERE cr < 1")
        db.execute(f"ALTER TABLE {name} DROP COLUMN cr")
    db.execute("ALTER TABLE decisions ADD COLUMN exploring INTEGER NOT NULL DEFAULT 0")


def _v3_to_v4(db: sqlite_utils.Database) -> None:
    # A job that ended (its client said so, or it sat idle past the agent's expiry)
    # keeps its row and its history; a restarted agent resumes only running ones.
    table = db["jobs"]
    table.add_column("ended", float)
    table.add_column("end_reason", str)


def _v4_to_v5(db: sqlite_utils.Database) -> None:
    # A look's reading is judged through the link's bucket, which needs the bytes
    # of the train it came from.
    db["measurements"].add_column("bytes_sent", int)


MIGRATIONS: tuple[Callable[[sqlite_utils.Database], None], ...] = (
    _v0_to_v1, _v1_to_v2, _v2_to_v3, _v3_to_v4, _v4_to_v5)
LATEST_VERSION = len(MIGRATIONS)


def read_version(db: sqlite_utils.Database) -> int:
    """The version the database is at; 0 for an empty (new) database."""
    if not db["schema_version"].exists():
        return 0
    row = db.execute("SELECT version FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def check_not_newer(version: int, where: str) -> None:
    if version > LATEST_VERSION:
        raise SchemaVersionError(
            f"db: {where} has schema version {version}, newer than this flexcomm supports "
            f"(version {LATEST_VERSION}); upgrade flexcomm or use another database"
        )


def migrate(db: sqlite_utils.Database, where: str, target: int = LATEST_VERSION) -> int:
    """Bring `db` to version `target` (default: the latest) and return the version
    it was at. `where` names the database in error messages."""
    if not 0 <= target <= LATEST_VERSION:
        raise ValueError(f"target: schema version must be in 0..{LATEST_VERSION}, got {target}")
    found = read_version(db)
    check_not_newer(found, where)
    if found >= target:
        return found
    db.conn.execute("BEGIN IMMEDIATE")  # re-read under the write lock: another process may have won
    try:
        found = read_version(db)
        check_not_newer(found, where)
        if not db["schema_version"].exists():
            db["schema_version"].create({"version": int})
        for step in MIGRATIONS[found:target]:
            step(db)
        db.execute("DELETE FROM schema_version")
        db.execute("INSERT INTO schema_version (version) VALUES (?)", [max(found, target)])
        db.conn.execute("COMMIT")
    except BaseException:
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        raise
    return found


@functools.cache
def expected_columns() -> dict[str, frozenset[str]]:
    """Every table of the latest schema and its columns, read off a new in-memory
    database that the migrations built (so they cannot disagree)."""
    db = sqlite_utils.Database(sqlite3.connect(":memory:"))
    try:
        migrate(db, ":memory:")
        return {name: frozenset(db[name].columns_dict) for name in db.table_names()}
    finally:
        db.close()
