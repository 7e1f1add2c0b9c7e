"""Stores damaged as a bad disk or a stray write would: a table's root page
overwritten, bytes of a row changed in place."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from flexcomm.policy.types import StepReport
from flexcomm.store import Store


def filled_store(path: Path, jobs: int = 30) -> None:
    """Enough rows that jobs and policy state span several pages, then every page in the main file."""
    with Store(path) as store:
        for i in range(jobs):
            store.add_job(f"job-{i:02d}", {"job_id": f"job-{i:02d}", "pad": "x" * 300}, created=1.0)
            store.save_policy_state(f"job-{i:02d}", {"format": 1, "pad": "y" * 2000})
            store.add_step_reports(f"job-{i:02d}", [
                StepReport(step=k, family="dense", param=0, collective="dense_ring", t_comp_s=0.0, t_sync_s=0.1,
                           gain=1.0)
                for k in range(5)])
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def overwrite_table_root(path: Path, table: str) -> None:
    """Random bytes over the first page of `table` (its root; an index's too), as a bad disk would."""
    with sqlite3.connect(path) as conn:
        page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek((page - 1) * size)
        f.write(random.Random(table).randbytes(size))


def overwrite_in_place(path: Path, old: bytes, new: bytes) -> None:
    """Replace bytes of one row's text inside its page (the page structure stays valid)."""
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    path.write_bytes(data.replace(old, new, 1))
