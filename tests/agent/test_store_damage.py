"""The agent checks its store at start: a damaged one stops it with one line (exit
2), or, with --move-damaged-db, is moved aside and a new one started with a log
line saying what was lost; a 0-byte store file is said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flexcomm.proto import agent_pb2 as pb
from support.agent_process import AgentProcess, spec
from support.cli import assert_one_line_error, flexcomm
from support.store_damage import filled_store, overwrite_in_place, overwrite_table_root


def start_agent(tmp_path: Path, *flags: str) -> object:
    return flexcomm(["agent", "--no-probe", "--metrics", "", "--socket", str(tmp_path / "agent.sock"),
                     "--db", str(tmp_path / "agent.db"), *flags])


def log_lines(agent: AgentProcess) -> list[dict]:
    return [json.loads(line) for line in agent.log.read_text().splitlines() if line.startswith("{")]


@pytest.mark.parametrize("damage", ["jobs", "policy_state", "step_reports", "undecodable row", "not sqlite"])
def test_a_damaged_store_stops_the_agent_with_one_line(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "agent.db"
    filled_store(db)
    if damage == "undecodable row":
        overwrite_in_place(db, b'"pad": "yyyy', b'"pad": ]]]]]')
    elif damage == "not sqlite":
        overwrite_in_place(db, b"SQLite format 3", b"not a database!")
    else:
        overwrite_table_root(db, damage)
    before = db.read_bytes()
    line = assert_one_line_error(start_agent(tmp_path), "agent", f"db: {db} ")
    assert "damaged" in line or "not a usable SQLite database" in line
    assert line.endswith("move_damaged_db (--move-damaged-db) moves it aside and starts a new store")
    assert db.read_bytes() == before  # nothing stored is touched
    assert not (tmp_path / "agent.sock").exists()


def test_a_damaged_store_moved_aside_says_what_was_lost(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    filled_store(db, jobs=3)
    overwrite_table_root(db, "policy_state")
    agent = AgentProcess(tmp_path, "--move-damaged-db")
    try:
        agent.start()
        assert list(agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == []
        agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("after")), timeout=5)
    finally:
        agent.stop()
    moved = [p for p in tmp_path.iterdir()
             if p.name.startswith("agent.db.damaged-") and not p.name.endswith(("-wal", "-shm"))]
    assert len(moved) == 1
    told = next(rec for rec in log_lines(agent) if rec["msg"] == "store damaged: moved aside, starting a new one")
    assert told["level"] == "error" and told["moved_to"] == str(moved[0])
    assert told["lost"]["job_ids"] == ["job-00", "job-01", "job-02"] and told["lost"]["jobs"] == 3
    assert "malformed" in told["error"]


def test_an_empty_store_file_is_said(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    db.write_bytes(b"")
    agent = AgentProcess(tmp_path)
    try:
        agent.start()
    finally:
        agent.stop()
    told = [rec for rec in log_lines(agent) if rec["msg"].startswith("store file was empty")]
    assert told and told[0]["level"] == "warning" and told[0]["db"] == str(db)
