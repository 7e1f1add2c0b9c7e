"""A damaged store is found when checked (`Store.check`: quick_check, schema, every
job and policy-state row decoded), can be moved aside with its WAL, and says what
it held; several writes in `transaction()` are all committed or none is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flexcomm.store import Store, StoreDamaged
from flexcomm.store.damage import move_aside, what_it_held
from support.store_damage import filled_store, overwrite_in_place, overwrite_table_root


@pytest.mark.parametrize("table", ["jobs", "policy_state", "step_reports"])
def test_an_overwritten_page_is_found(tmp_path: Path, table: str) -> None:
    db = tmp_path / "s.db"
    filled_store(db)
    overwrite_table_root(db, table)
    with pytest.raises(StoreDamaged, match=rf"^db: {db} (is damaged|is not a usable SQLite database)"), \
            Store(db) as store:
        store.check()


def test_a_row_that_does_not_decode_is_found(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    filled_store(db)
    overwrite_in_place(db, b'"pad": "yyyy', b'"pad": ]]]]]')
    with Store(db) as store, pytest.raises(StoreDamaged) as err:
        store.check()
    assert re.fullmatch(rf"db: {db} is damaged: the state of policy_state row 'job-\d\d' does not decode",
                        str(err.value))


def test_a_missing_table_is_found_and_a_sound_store_passes(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    filled_store(db, jobs=2)
    with Store(db) as store:
        store.check()
        store.db.execute("DROP TABLE policy_state")
        with pytest.raises(StoreDamaged, match=r"table policy_state is missing$"):
            store.check()


def test_moved_aside_with_its_wal_and_what_it_held_is_told(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    filled_store(db, jobs=3)
    with Store(db) as store:  # a write left in the WAL only
        store.db.execute("PRAGMA wal_autocheckpoint=0")
        store.add_job("in-wal", {"job_id": "in-wal"})
        moved = move_aside(db)
        assert not db.exists() and not Path(f"{db}-wal").exists()
        assert Path(f"{moved}-wal").exists()
    held = what_it_held(moved)
    assert held["job_ids"] == ["in-wal", "job-00", "job-01", "job-02"] and held["step_reports"] == 3
    damaged = tmp_path / "d.db"
    filled_store(damaged)
    overwrite_table_root(damaged, "sqlite_autoindex_jobs_1")  # the ids are read off the index
    held = what_it_held(damaged)
    assert held["job_ids"] == "unreadable" and held["step_reports"] == 30


def test_a_zero_byte_file_opens_as_a_new_store_and_says_so(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    db.write_bytes(b"")
    with Store(db) as store:
        assert store.was_empty_file
        store.check()
    with Store(db) as store:
        assert not store.was_empty_file


def test_a_transaction_is_all_or_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        with pytest.raises(OSError), store.transaction():
            store.add_job("half", {"job_id": "half"})
            store.save_policy_state("half", {"format": 1})
            raise OSError("disk full")
        assert store.jobs() == [] and store.load_policy_state("half") is None
        with store.transaction():
            store.add_job("whole", {"job_id": "whole"})
            store.save_policy_state("whole", {"format": 1})
        assert [j.job_id for j in store.jobs()] == ["whole"]
