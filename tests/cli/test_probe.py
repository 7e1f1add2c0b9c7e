"""`flexcomm probe PEER` and `flexcomm probe history`, run through the real CLI."""

from __future__ import annotations

import json

import pytest

from flexcomm.cli import main
from flexcomm.emulation.shaping import LinkState, Shaper
from flexcomm.lab.netns import netns_pair
from flexcomm.probe.iperf import IperfServer
from flexcomm.store import LATEST_VERSION, Measurement, Store
from support.link_rate import reads_the_link
from support.names import run_prefix


@pytest.mark.privileged
def test_probe_peer_prints_figures_records_them_and_history_reads_them(
        privileged, iperf3_binary, tmp_path, capsys):
    db = str(tmp_path / "p.db")
    with netns_pair(run_prefix("fcpc"), "10.201.0.128/26") as (a, b):
        Shaper(a.ifname, netns=a.ns).apply(LinkState(100e6))
        with IperfServer(5201, netns=b.ns):
            code = main(["probe", b.address, "--netns", a.ns, "--time", "1s", "--db", db, "--json"])
            result = json.loads(capsys.readouterr().out)
            assert code == 0 and result["ok"] and result["errors"] == []
            assert reads_the_link(result["bandwidth_bps"], 100e6, b.address, 5201, a.ns), result
            assert result["beta_s_per_byte"] == pytest.approx(8 / result["bandwidth_bps"])
            rtt = result["rtt"]
            assert 0 < rtt["min_s"] <= rtt["p50_s"] <= rtt["p99_s"] and rtt["loss"] == 0
            assert result["alpha_s"] == pytest.approx(rtt["min_s"] / 2)

            assert main(["probe", b.address, "--netns", a.ns, "--time", "1s"]) == 0
            text = capsys.readouterr().out
            assert "bandwidth" in text and "Mbit/s" in text and "p99" in text and "beta" in text

    assert main(["probe", "history", "--db", db, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["kind"] for r in rows} == {"bandwidth", "latency"}  # only the --db run was stored
    assert main(["probe", "history", "--db", db, "--peer", "10.201.0.130"]) == 0
    assert "10.201.0.130" in capsys.readouterr().out


def test_missing_iperf3_is_a_clear_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    # latency still works against loopback (a refused connect is a round trip)
    code = main(["probe", "127.0.0.1", "--port", "9", "--count", "2", "--time", "1s", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and not result["ok"]
    assert any("iperf3" in e and "not found on PATH" in e for e in result["errors"])
    assert result["rtt"]["p50_s"] > 0


def test_history_renders_each_table(tmp_path, capsys):
    db = tmp_path / "h.db"
    with Store(db) as store:
        store.add_measurement(Measurement(peer="p", kind="passive", alpha_s=1e-4, beta_s_per_byte=8e-8))
        store.add_measurement(Measurement(peer="p", kind="latency", ok=False, error="no answer"))
    assert main(["probe", "history", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "passive" in out and "FAILED: no answer" in out
    assert main(["probe", "history", "--db", str(db), "--table", "decisions"]) == 0
    assert "no decisions recorded" in capsys.readouterr().out
    assert main(["probe", "history", "--db", str(db), "--since", "1h", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["probe", "history", "--db", "{tmp}/absent.db"], "db: no flexcomm store at"),
    (["probe", "history", "--db", "{tmp}/h.db", "--since", "5"], "since:"),
    (["probe", "127.0.0.1", "--time", "0.5s"], "time: iperf3 runs whole seconds"),
    (["probe", "127.0.0.1", "--streams", "0"], "streams:"),
])
def test_bad_input_exits_2_naming_it(tmp_path, capsys, argv, message):
    Store(tmp_path / "h.db").close()
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_history_refuses_a_newer_store(tmp_path, capsys):
    db = tmp_path / "new.db"
    with Store(db) as store:
        store.db.execute("UPDATE schema_version SET version = ?", [LATEST_VERSION + 1])
        store.db.conn.commit()
    assert main(["probe", "history", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert f"schema version {LATEST_VERSION + 1}" in err and f"(version {LATEST_VERSION})" in err
