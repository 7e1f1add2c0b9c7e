"""`flexcomm emulate record`: recorded networks (an iperf3 --json log, a
mahimahi trace, an agent's store) as time-keyed schedules that read back."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from flexcomm.cli import main
from flexcomm.emulation.record import (
    TCP_PAYLOAD_SHARE,
    RecordError,
    Sample,
    iperf3_samples,
    mahimahi_samples,
    merged,
    schedule_text,
    windows,
)
from flexcomm.emulation.schedule import parse_schedule
from flexcomm.store import Store
from flexcomm.store.records import Measurement


def iperf3_log(rates_mbit: list[float]) -> str:
    return json.dumps({"start": {}, "intervals": [
        {"streams": [], "sum": {"start": i, "end": i + 1.0, "bits_per_second": r * 1e6}}
        for i, r in enumerate(rates_mbit)], "end": {}})


def record(*argv: str) -> subprocess.CompletedProcess:
    """The CLI in this process (as `flexcomm emulate record ARGV`)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["emulate", "record", *argv])
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def test_windows_average_by_time_and_neighbours_merge() -> None:
    samples = [Sample(0, 1, 10e6), Sample(1, 3, 40e6), Sample(3, 4, 100e6)]
    assert windows(samples, 2.0) == [(2.0, 25e6), (2.0, 70e6)]
    assert merged([(10, 50e6), (10, 52e6), (10, 20e6)], 0.1) == [(20, 51e6), (10, 20e6)]


def test_an_iperf3_log_becomes_the_rates_that_carry_its_goodput() -> None:
    text = schedule_text(iperf3_samples(iperf3_log([95, 95, 95, 95, 48, 48, 48, 48])),
                         window_s=4, merge=0.1, payload_share=TCP_PAYLOAD_SHARE, name="x",
                         provenance="from a test")
    schedule = parse_schedule(text)
    assert not schedule.by_epoch and [s.duration_s for s in schedule.steps] == [4, 4]
    rates = [s.state.rate_bps * TCP_PAYLOAD_SHARE for s in schedule.steps]
    assert rates == [pytest.approx(95e6, rel=1e-3), pytest.approx(48e6, rel=1e-3)]
    assert text.startswith("# from a test\n")


def test_a_mahimahi_trace_is_its_delivery_rate() -> None:
    trace = "\n".join(str(ms) for ms in range(1, 1001))  # one 1500-byte packet a ms
    (sample,) = mahimahi_samples(trace)
    assert sample.rate_bps == pytest.approx(12e6)


@pytest.mark.parametrize(("text", "message"), [
    ("not json {", "iperf3 log: not JSON"),
    ('{"error": "unable to connect"}', "iperf3 reported an error: unable to connect"),
    ('{"intervals": []}', "iperf3 log: no intervals"),
    ('{"intervals": [{"sum": {"start": 0}}]}', "interval 1: no sum with start, end"),
])
def test_bad_iperf3_logs_are_named(text: str, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        iperf3_samples(text)


def test_bad_mahimahi_traces_are_named() -> None:
    with pytest.raises(RecordError, match=r"line 2: '1\.5' is not a whole number"):
        mahimahi_samples("1\n1.5\n")
    with pytest.raises(RecordError, match="delivery times go backwards"):
        mahimahi_samples("5\n3\n")


def test_the_cli_writes_a_schedule_and_bad_input_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "run.json"
    log.write_text(iperf3_log([20.0] * 10))
    out = tmp_path / "recorded.toml"
    proc = record(str(log), "--window", "5s", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert parse_schedule(out.read_text()).steps[0].duration_s == 10.0
    bad = tmp_path / "bad.json"
    bad.write_text('{"intervals": 7}')
    for argv in ([str(bad)], [str(tmp_path / "missing")], [str(log), "--window", "0s"]):
        proc = record(*argv)
        assert proc.returncode == 2, argv
        assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_an_agents_store_is_read_without_being_changed(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    with Store(db) as store:
        for i, (peer, mbit) in enumerate([("10.0.0.2", 90), ("10.0.0.3", 5), ("10.0.0.2", 91),
                                          ("10.0.0.2", 30), ("10.0.0.2", 31)]):
            store.add_measurement(Measurement(peer=peer, kind="bandwidth",
                                              bandwidth_bps=mbit * 1e6, ts=1000.0 + 10 * i))
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    proc = record(str(db))
    assert proc.returncode == 2 and "measured 2 peers (10.0.0.2, 10.0.0.3); name one" in proc.stderr
    proc = record(str(db), "--peer", "10.0.0.2", "--window", "10s")
    assert proc.returncode == 0, proc.stderr
    steps = parse_schedule(proc.stdout).steps
    assert [s.duration_s for s in steps] == [30.0, 20.0]  # 90, 91 (merged) then 30, 31
    assert steps[1].state.rate_bps * TCP_PAYLOAD_SHARE == pytest.approx(30.5e6, rel=1e-3)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    proc = record(str(db), "--peer", "10.9.9.9")
    assert proc.returncode == 2 and "no successful bandwidth measurement" in proc.stderr
