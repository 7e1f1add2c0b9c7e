"""`flexcomm model`: the table, the decision, --json, --sweep, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flexcomm.cli import main
from flexcomm.policy.costmodel import sync_time
from flexcomm.policy.types import LinkBucket, NetworkObservation

BASE = ["model", "--nodes", "4", "--size", "100MB", "--latency", "1ms"]


def run_json(capsys, *extra: str) -> dict:
    assert main([*BASE, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_decision_and_full_table(capsys) -> None:
    out = run_json(capsys, "--bandwidth", "1Gbit")
    assert {"cr", "collective"} <= set(out["decision"])
    names = {r["collective"] for r in out["table"]}
    assert names == {"ps", "dense_ring", "dense_tree", "ag_topk", "art_ring", "art_tree"}
    assert len(out["table"]) == 3 + 3 * 5
    net = NetworkObservation.from_link(1e-3, 1e9, 4)
    ring = next(r for r in out["table"] if r["collective"] == "dense_ring")
    assert ring["seconds"] == pytest.approx(sync_time("dense_ring", 100e6, 1.0, net))


def test_dense_at_high_bandwidth_with_slow_compression(capsys) -> None:
    out = run_json(capsys, "--bandwidth", "100Gbit", "--t-comp", "50ms")
    assert (out["decision"]["collective"], out["decision"]["cr"]) == ("dense_ring", 1.0)


def test_compression_at_low_bandwidth(capsys) -> None:
    out = run_json(capsys, "--bandwidth", "10Mbit")
    assert out["decision"]["cr"] < 0.1 and out["decision"]["collective"] in ("ag_topk", "art_ring", "art_tree")


def test_forms_change_the_prediction(capsys) -> None:
    paper = run_json(capsys, "--bandwidth", "1Gbit", "--cr", "0.01")
    ring = run_json(capsys, "--bandwidth", "1Gbit", "--cr", "0.01", "--ag-form", "ring", "--tree-form", "pipelined")
    ag = [next(r for r in t["table"] if r["collective"] == "ag_topk")["seconds"] for t in (paper, ring)]
    assert ag[0] != ag[1]
    assert {r["cr"] for r in paper["table"] if r["collective"] == "ag_topk"} == {0.01}


def test_sweep_shows_the_choice_changing(capsys) -> None:
    out = run_json(capsys, "--bandwidth", "1Gbit", "--sweep", "--t-comp", "20ms")
    choices = [(p["collective"], p["cr"]) for p in out["sweep"]]
    assert choices[0] != choices[-1] and choices[-1] == ("dense_ring", 1.0)
    assert main([*BASE, "--bandwidth", "1Gbit", "--sweep"]) == 0
    assert "where the choice changes" in capsys.readouterr().out


def test_a_token_bucket_link_is_modelled_and_shown(capsys) -> None:
    bucket = LinkBucket(1.2, 0.005)
    out = run_json(capsys, "--bandwidth", "50Mbit", "--link-peak-over-rate", "1.2", "--link-burst", "5ms",
                   "--sweep")
    assert out["inputs"]["link_bucket"] == {"peak_over_rate": 1.2, "burst_s": 0.005}
    net = NetworkObservation.from_link(1e-3, 50e6, 4, bucket)
    for row in out["table"]:
        assert row["sync_s"] == pytest.approx(sync_time(row["collective"], 100e6, row["cr"], net))
    plain = run_json(capsys, "--bandwidth", "50Mbit", "--sweep")
    tree = [next(r["sync_s"] for r in t["table"] if r["collective"] == "art_tree" and r["cr"] == 0.001)
            for t in (out, plain)]
    assert tree[0] < tree[1]  # the bucket's credit shortens it
    # The sweep keeps the bucket: at 1 Mbit/s the same sync time as a model with it.
    assert out["sweep"][0]["seconds"] != plain["sweep"][0]["seconds"]
    assert main([*BASE, "--bandwidth", "50Mbit", "--link-peak-over-rate", "1.2", "--link-burst", "5ms"]) == 0
    assert "token bucket, 1.2x the bandwidth for 5 ms" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "field"), [
    (["--link-peak-over-rate", "0.5", "--link-burst", "5ms"], "link-peak-over-rate: must be in"),
    (["--link-peak-over-rate", "x"], "link-peak-over-rate: expected a number"),
    (["--link-peak-over-rate", "1.2"], "link-burst: needed with link-peak-over-rate"),
    (["--link-burst", "5ms"], "link-peak-over-rate: needed with link-burst"),
    (["--link-peak-over-rate", "1.2", "--link-burst", "5"], "link-burst: duration '5' needs a unit"),
    (["--nodes", "1"], "nodes"), (["--size", "0MB"], "size"), (["--size", "10XB"], "size"),
    (["--latency", "-1ms"], "latency"), (["--latency", "5"], "latency"), (["--bandwidth", "nanGbit"], "bandwidth"),
    (["--bandwidth", "100"], "bandwidth"), (["--cr", "1.5"], "cr"), (["--cr", "1"], "cr"),
    (["--gains", "0.1=2"], "gains"),
])
def test_bad_input_exits_2_naming_the_field_without_traceback(flags: list[str], field: str) -> None:
    args = {"--nodes": "4", "--size": "100MB", "--latency": "1ms", "--bandwidth": "1Gbit"}
    args.update(dict(zip(flags[::2], flags[1::2], strict=True)))
    argv = [sys.executable, "-m", "flexcomm.cli", "model", *[f"{k}={v}" for k, v in args.items()]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"error: {field}" in proc.stderr and "Traceback" not in proc.stderr


def test_gains_between_and_below_the_given_ones_are_filled_in_log_cr() -> None:
    from flexcomm.commands.model import fill_gains

    filled = fill_gains({0.1: 0.95, 0.01: 0.7}, (0.1, 0.0316, 0.01, 0.001, 1e-5))
    assert filled[0.1] == 0.95 and filled[0.01] == 0.7
    assert filled[0.0316] == pytest.approx(0.825, abs=1e-3)  # halfway in log CR
    assert filled[0.001] == pytest.approx(0.45)  # the 0.01-0.1 line, extended
    assert filled[1e-5] == 0.01  # kept above zero
    assert fill_gains({0.01: 0.7}, (0.1,))[0.1] == pytest.approx(0.85)  # toward gain 1 at CR 1
    assert fill_gains({}, (0.1,)) == {}


def test_a_partial_gains_flag_is_taken_and_shown(capsys) -> None:
    assert main(["model", "--nodes", "4", "--size", "25MB", "--latency", "50us", "--bandwidth", "200Mbit",
                 "--gains", "0.1=0.95,0.01=0.7"]) == 0
    assert "0.033=0.83*" in capsys.readouterr().out
