"""The SQLite store: round trips, aggregation, retention, schema versions, and a
writer killed mid-write."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import sqlite_utils

from flexcomm.policy.types import Decision, StepReport
from flexcomm.store import (
    LATEST_VERSION,
    EmulationStep,
    Measurement,
    SchemaVersionError,
    Store,
    schema,
)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.db") as s:
        yield s


def test_new_store_is_wal_at_latest_version(tmp_path):
    with Store(tmp_path / "new.db") as s:
        assert s.version == LATEST_VERSION
        assert s.migrated_from == 0
        assert s.db.journal_mode == "wal"


def test_measurement_round_trip_and_latest_per_kind(store):
    store.add_measurement(Measurement(peer="p1", kind="bandwidth", bandwidth_bps=1e8,
                                      beta_s_per_byte=8e-8, streams=2, reverse=True, ts=10.0))
    newer = store.add_measurement(Measurement(peer="p1", kind="bandwidth", bandwidth_bps=5e7, ts=20.0))
    lat = store.add_measurement(Measurement(peer="p1", kind="latency", rtt_min_s=1e-4,
                                            rtt_p50_s=2e-4, rtt_p99_s=9e-4, loss=0.0, ts=15.0))
    store.add_measurement(Measurement(peer="p2", kind="latency", ok=False, error="timed out", ts=30.0))

    latest = store.latest_measurements("p1")
    assert [(m.kind, m.id) for m in latest] == [("bandwidth", newer.id), ("latency", lat.id)]
    assert latest[0].bandwidth_bps == 5e7 and latest[1].rtt_p99_s == 9e-4
    assert {m.peer for m in store.latest_measurements()} == {"p1", "p2"}
    tie = store.add_measurement(Measurement(peer="p1", kind="bandwidth", bandwidth_bps=6e7, ts=20.0))
    assert [m.id for m in store.latest_measurements("p1")] == [tie.id, lat.id]  # same ts: the later row
    # the newest two of each kind, each kind's oldest first (as a restarted agent reads them back)
    assert [m.id for m in store.latest_measurements("p1", per_kind=2)] == [newer.id, tie.id, lat.id]
    with pytest.raises(ValueError, match="per_kind"):
        store.latest_measurements(per_kind=0)
    failed = store.measurements(peer="p2")[0]
    assert failed.ok is False and failed.error == "timed out" and failed.bandwidth_bps is None
    oldest = store.measurements(peer="p1", kind="bandwidth")[-1]
    assert oldest.streams == 2 and oldest.reverse is True and oldest.ts == 10.0


def test_store_clock_stamps_rows_without_ts(tmp_path):
    with Store(tmp_path / "c.db", clock=lambda: 1234.5) as s:
        assert s.add_measurement(Measurement(peer="p", kind="latency", rtt_min_s=1.0)).ts == 1234.5


def test_bad_measurement_names_the_field():
    with pytest.raises(ValueError, match=r"^kind:"):
        Measurement(peer="p", kind="speed")
    with pytest.raises(ValueError, match=r"^error:"):
        Measurement(peer="p", kind="latency", ok=False)
    with pytest.raises(ValueError, match=r"^loss:"):
        Measurement(peer="p", kind="latency", loss=1.5)


def test_decisions_round_trip(store):
    d = Decision("topk", 0.01, "ag_topk", version=3, predicted_sync_s=0.2, reason="cheaper", exploring=True)
    store.add_decision("job", d, ts=5.0)
    store.add_decision("job", Decision("powersgd", 4, "dense_ring", version=4), ts=6.0)
    got = store.decisions("job")
    assert [r.decision.version for r in got] == [4, 3]
    assert got[1].decision == d and got[1].ts == 5.0
    assert got[0].decision.compression.name == "powersgd:4"


def test_step_reports_are_aggregated_per_epoch_compression_collective(store):
    reports = [StepReport(step=i, family="topk", param=0.1, collective="ag_topk", t_comp_s=0.01 * i, t_sync_s=0.1,
                          gain=0.5, bytes_sent=100, epoch=0) for i in range(4)]
    reports.append(StepReport(step=4, family="dense", param=0, collective="dense_ring", t_comp_s=0.0, t_sync_s=1.0,
                              gain=1.0, bytes_sent=1000, epoch=1))
    reports.append(StepReport(step=5, family="powersgd", param=2, collective="dense_ring", t_comp_s=0.0,
                              t_sync_s=1.0, gain=0.8, bytes_sent=10, epoch=1))
    rows = store.add_step_reports("job", reports, ts=7.0)
    assert len(rows) == 3 and (rows[2].family, rows[2].param) == ("powersgd", 2)
    first = rows[0]
    assert (first.step_first, first.step_last, first.count, first.bytes_sent) == (0, 3, 4, 400)
    assert first.mean_t_comp_s == pytest.approx(0.015)
    assert store.step_reports("job")[0].collective in {"ag_topk", "dense_ring"}
    assert len(store.step_reports("job")) == 3


def test_emulation_steps_jobs_and_policy_state(store):
    store.add_emulation_step(EmulationStep(interface="veth0", step_index=2, netns="ns1",
                                           rate_bps=1e8, delay_s=0.01, ts=3.0))
    assert store.emulation_steps("veth0")[0].rate_bps == 1e8
    store.add_job("job", {"nodes": 4, "model": "resnet"}, created=1.0)
    assert store.job("job").spec == {"model": "resnet", "nodes": 4}
    assert store.load_policy_state("job") is None
    store.save_policy_state("job", {"phase": "explore", "cr": 0.1})
    store.save_policy_state("job", {"phase": "exploit", "cr": 0.01})
    assert store.load_policy_state("job") == {"phase": "exploit", "cr": 0.01}
    with pytest.raises(TypeError):
        store.save_policy_state("job", {"bad": object()})
    assert store.load_policy_state("job") == {"phase": "exploit", "cr": 0.01}


def test_an_ended_job_keeps_its_row_and_history_and_runs_again_when_re_registered(store):
    store.add_job("a", {"n": 1}, created=1.0)
    store.add_job("b", {"n": 2}, created=2.0)
    store.add_decision("a", Decision("topk", 0.01, "ag_topk", version=1), ts=3.0)
    store.end_job("a", "ended", ts=4.0)
    assert [j.job_id for j in store.jobs(running=True)] == ["b"]
    ended = store.jobs(running=False)
    assert [(j.job_id, j.ended, j.end_reason, j.running) for j in ended] == [("a", 4.0, "ended", False)]
    assert [j.job_id for j in store.jobs()] == ["a", "b"]
    assert store.decisions("a")[0].decision.param == 0.01
    store.add_job("a", {"n": 3}, created=5.0)
    assert store.job("a").running and store.job("a").spec == {"n": 3}
    with pytest.raises(ValueError, match="job_id: no job 'zz'"):
        store.end_job("zz", "ended")


def test_policy_state_survives_reopen(tmp_path):
    with Store(tmp_path / "r.db") as s:
        s.save_policy_state("job", {"step": 42})
    with Store(tmp_path / "r.db") as s:
        assert s.load_policy_state("job") == {"step": 42}


def test_prune_drops_old_time_series_but_keeps_jobs_and_state(store):
    for ts in (100.0, 200.0, 300.0):
        store.add_measurement(Measurement(peer="p", kind="latency", rtt_min_s=1e-3, ts=ts))
        store.add_decision("job", Decision("dense", 0, "dense_ring"), ts=ts)
    store.add_job("job", {}, created=1.0)
    store.save_policy_state("job", {"x": 1}, ts=1.0)
    deleted = store.prune(older_than_s=150.0, now_ts=400.0)
    assert deleted["measurements"] == 2 and deleted["decisions"] == 2
    assert [m.ts for m in store.measurements()] == [300.0]
    assert store.job("job") is not None and store.load_policy_state("job") == {"x": 1}


def test_history_rejects_unknown_table_and_column(store):
    with pytest.raises(ValueError, match=r"^table:"):
        store.history("jobs")
    with pytest.raises(ValueError, match=r"^colour:"):
        store.history("measurements", colour="red")


def test_older_schema_is_migrated_keeping_rows(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    schema.migrate(db, str(path), target=1)
    db["measurements"].insert({"ts": 1.0, "peer": "p", "kind": "latency", "ok": 1, "rtt_min_s": 0.002})
    assert "streams" not in db["measurements"].columns_dict  # a real v1 layout
    db.close()

    with Store(path) as s:
        assert s.migrated_from == 1 and s.version == LATEST_VERSION
        (old,) = s.measurements()
        assert old.rtt_min_s == 0.002 and old.streams is None
        s.add_measurement(Measurement(peer="p", kind="bandwidth", bandwidth_bps=1e6, streams=4))
        assert s.measurements(kind="bandwidth")[0].streams == 4


def test_rows_of_a_topk_only_schema_read_as_families(tmp_path):
    path = tmp_path / "v2.db"
    db = sqlite_utils.Database(path)
    schema.migrate(db, str(path), target=2)
    for version, cr, collective in ((1, 1.0, "dense_ring"), (2, 0.01, "ag_topk")):
        db["decisions"].insert({"ts": float(version), "job_id": "j", "version": version, "cr": cr,
                                "collective": collective, "root": "star"})
    db["step_reports"].insert({"ts": 1.0, "job_id": "j", "step_first": 0, "step_last": 3, "epoch": 0, "cr": 0.01,
                               "collective": "ag_topk", "count": 4, "mean_t_comp_s": 0.0, "mean_t_sync_s": 0.1,
                               "mean_gain": 0.5})
    db.close()
    with Store(path) as s:
        assert s.migrated_from == 2
        got = [(r.decision.family, r.decision.param, r.decision.exploring) for r in s.decisions("j")]
        assert got == [("topk", 0.01, False), ("dense", 0.0, False)]
        (agg,) = s.step_reports("j")
        assert (agg.family, agg.param, agg.count) == ("topk", 0.01, 4)


def test_newer_schema_is_refused_untouched(tmp_path):
    path = tmp_path / "new.db"
    with Store(path) as s:
        s.add_measurement(Measurement(peer="p", kind="latency", rtt_min_s=1e-3))
        s.db.execute("UPDATE schema_version SET version = ?", [LATEST_VERSION + 5])
        s.db.conn.commit()
    before = path.read_bytes()
    with pytest.raises(SchemaVersionError) as err:
        Store(path)
    msg = str(err.value)
    assert msg.startswith("db:") and str(LATEST_VERSION + 5) in msg and f"version {LATEST_VERSION}" in msg
    assert path.read_bytes() == before


def test_missing_and_non_sqlite_files_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^db: no flexcomm store"):
        Store(tmp_path / "absent.db", create=False)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ValueError, match=r"^db: .*not a usable SQLite database"):
        Store(junk)
    assert junk.read_bytes() == b"this is not sqlite" * 100


WRITER = textwrap.dedent("""
    import sys
    from flexcomm.policy.types import StepReport
    from flexcomm.store import Measurement, Store
    s = Store(sys.argv[1])
    i = 0
    while True:
        m = s.add_measurement(Measurement(peer="p", kind="bandwidth", bandwidth_bps=float(i)))
        reports = [StepReport(step=10 * i + k, family="topk", param=0.1, collective="ag_topk", t_comp_s=0.0,
                              t_sync_s=0.1, gain=0.5, epoch=i) for k in range(10)]
        s.add_step_reports("job", reports)
        print(m.id, flush=True)  # printed only after both transactions committed
        i += 1
""")


def test_writer_killed_mid_write_loses_nothing_committed(tmp_path):
    path = tmp_path / "kill.db"
    Store(path).close()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True)
    committed = []
    try:
        while len(committed) < 30:
            line = proc.stdout.readline()
            assert line, "writer exited early"
            committed.append(int(line))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    with Store(path) as s:
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        ids = {m.id for m in s.measurements(limit=10**6)}
        assert set(committed) <= ids
        # each batch of step reports is one row of count 10: all or nothing
        counts = [r.count for r in s.step_reports("job", limit=10**6)]
        assert len(counts) >= len(committed) and set(counts) == {10}


OPENER = textwrap.dedent("""
    import sys
    from flexcomm.store import Measurement, Store
    with Store(sys.argv[1]) as s:
        for _ in range(5):
            s.add_measurement(Measurement(peer=sys.argv[2], kind="latency", rtt_min_s=1e-3))
""")


def test_processes_creating_and_writing_one_store_at_once_all_succeed(tmp_path):
    path = tmp_path / "race.db"
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, str(path), f"p{i}"], stderr=subprocess.PIPE,
                              text=True) for i in range(4)]
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    with Store(path) as s:
        assert s.version == LATEST_VERSION
        rows = s.measurements()
        assert len(rows) == 20 and {m.peer for m in rows} == {"p0", "p1", "p2", "p3"}


def test_open_tries_again_when_another_process_holds_the_lock_upgrade(tmp_path, monkeypatch):
    # Two processes switching one new file to WAL can deadlock on the lock upgrade;
    # SQLite answers "locked" at once then, without the busy timeout. Hard to time
    # between real processes (the test above races them), so the answer is injected.
    from flexcomm.store import store as store_module

    real_open, calls = store_module.Store._open, []

    def locked_twice(self):
        calls.append(1)
        if len(calls) <= 2:
            raise sqlite3.OperationalError("database is locked")
        real_open(self)

    monkeypatch.setattr(store_module.Store, "_open", locked_twice)
    with Store(tmp_path / "s.db") as s:
        assert s.version == LATEST_VERSION
    assert len(calls) == 3


def test_open_gives_up_on_a_lock_held_past_the_busy_timeout_in_one_line(tmp_path, monkeypatch):
    from flexcomm.store import store as store_module

    def always_locked(self):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 50)
    monkeypatch.setattr(store_module.Store, "_open", always_locked)
    with pytest.raises(ValueError, match=r"^db: cannot use .*s\.db: database is locked$"):
        Store(tmp_path / "s.db")


def test_concurrent_store_on_same_file_sees_commits(tmp_path):
    path = tmp_path / "two.db"
    with Store(path) as a, Store(path) as b:
        a.add_measurement(Measurement(peer="p", kind="latency", rtt_min_s=1e-3))
        assert len(b.measurements()) == 1
        with pytest.raises(sqlite3.IntegrityError):
            b.db.execute("INSERT INTO measurements (ts) VALUES (NULL)")
