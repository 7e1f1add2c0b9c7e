"""The cost-model validation: its analysis on hand-made rows, and a tiny grid end
to end on the emulated cluster (real namespaces, HTB and gloo ranks)."""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from flexcomm.emulation.shaping import CEIL_OVER_RATE, RATE_BUCKET_SECONDS
from flexcomm.lab.accuracy_report import analyse, load_measured
from flexcomm.lab.calibrate import Grid, Measured
from flexcomm.lab.model_accuracy import REGRET_OK, regrets_per_cr, split
from flexcomm.lab.netns import list_namespaces
from flexcomm.policy.types import LinkBucket
from support.names import run_prefix
from support.waiting import scaled

ROOT = Path(__file__).resolve().parents[2]
PREFIX = run_prefix("fcv")
SUBNET = "10.205.0.0/24"
KEYS = ("median_abs_error_raw", "median_abs_error_calibrated", "regret_within_5pct_share")


def paper_seconds(r: Measured, bucket: LinkBucket | None = None) -> float:
    """The paper's alpha-beta forms written out by hand (log2 N), with the agent's
    inputs: alpha half the TCP connect RTT, beta 8 / probed goodput (the shaped
    rate when not probed); a token bucket (peak p, credit b) sends B bytes after
    idle in max(beta B / p, beta B - b)."""
    n, m, mc, lg = r.nodes, r.size_bytes, r.size_bytes * r.cr, math.log2(r.nodes)
    messages, link_bytes = {
        "dense_ring": (2 * (n - 1), 2 * (n - 1) / n * m),
        "ag_topk": (lg, 2 * (n - 1) * mc),
        "art_ring": (lg + 2 * (n - 1), mc * lg + 2 * (n - 1) / n * mc),  # index broadcast, ring AllReduce
        "art_tree": (3 * lg, 3 * mc * lg),
    }[r.collective]
    beta = 8 / (r.bandwidth_probe_bps or r.rate_bps)
    bucket = bucket or r.bucket
    return r.alpha_tcp_s * messages + max(beta * link_bytes / bucket.peak_over_rate,
                                          beta * link_bytes - bucket.burst_s)


def row(collective: str, cr: float, t: float, spread: float = 0.01, rate: float = 100e6, size: int = 1_000_000,
        nodes: int = 4) -> Measured:
    samples = [t * (1 - spread), t, t * (1 + spread)]
    return Measured(rate, nodes, size, collective, cr, t, samples, 0.01, 1e-4, 5e-5)


def test_regret_is_the_chosen_collectives_time_over_the_fastest() -> None:
    # The model prefers the ring AR-Topk at this point; the measurement says AG-Topk is 1.5x faster.
    rows = [row("ag_topk", 0.1, 0.10), row("art_ring", 0.1, 0.15), row("art_tree", 0.1, 0.30)]
    predicted = {"ag_topk": 0.2, "art_ring": 0.1, "art_tree": 0.3}
    (g,) = regrets_per_cr(rows, lambda r: predicted[r.collective])
    assert g.chosen.collective == "art_ring" and g.fastest.collective == "ag_topk"
    assert g.ratio == pytest.approx(1.5)
    assert g.reason.startswith("mis-ranked: predicted art_ring@0.1/ag_topk@0.1 = 0.50, measured 1.50")
    # Overlapping repetitions are called noise, not a model error.
    noisy = [replace(r, samples_s=[r.t_sync_s * 0.3, r.t_sync_s * 0.6, r.t_sync_s, r.t_sync_s * 2, r.t_sync_s * 3])
             for r in rows]
    (g,) = regrets_per_cr(noisy, lambda r: predicted[r.collective])
    assert g.ratio > REGRET_OK and g.reason.startswith("within noise")


def test_split_is_a_deterministic_checkerboard() -> None:
    rows = [row(c, cr, 0.1, rate=rate) for rate in (10e6, 100e6) for cr in (0.1, 0.01)
            for c in ("ag_topk", "art_ring")]
    fit, held = split(rows)
    assert len(fit) == len(held) == 4
    assert split(list(reversed(rows))) == (sorted(fit, key=rows.index)[::-1], sorted(held, key=rows.index)[::-1])
    for r in fit:  # each fitted point's neighbour along the CR axis is held out
        other = next(h for h in held if h.collective == r.collective and h.rate_bps == r.rate_bps)
        assert other.cr != r.cr


def test_grid_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="rates"):
        Grid(rates_bps=(-5.0,))
    with pytest.raises(ValueError, match="crs"):
        Grid(crs=(1.0,))
    with pytest.raises(ValueError, match="collectives"):
        Grid(collectives=("ps",))
    assert 0 < Grid(rates_bps=(1e9,), nodes=(2,), sizes=(65536,)).estimate_seconds() < Grid().estimate_seconds()


def test_short_operations_are_repeated_more() -> None:
    grid = Grid(rates_bps=(10e6,), nodes=(2,), sizes=(1_000_000, 16_000_000), crs=(0.1, 0.001), repeats=3)
    reps = {(s, c, cr): n for s, c, cr, n in grid.point_repeats(10e6, 2)}
    assert len(reps) == len(grid.points(2))
    assert reps[(1_000_000, "ag_topk", 0.001)] == 45  # a few ms: most repetitions
    assert reps[(1_000_000, "ag_topk", 0.1)] == 15  # 0.16 s at 10 Mbit/s
    assert reps[(16_000_000, "dense_ring", 1.0)] == 3  # 12.8 s: the grid's own count
    assert Grid(repeats=60).repeats_for(0.001) == 60  # never fewer than asked


@pytest.mark.privileged
@pytest.mark.slow
def test_tiny_grid_end_to_end(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "bench" / "model_accuracy.py"), "--out", str(out), "--prefix", PREFIX,
           "--subnet", SUBNET, "--rates", "50Mbit", "--nodes", "2", "--sizes", "256KB", "--crs", "0.1,0.01",
           "--repeats", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=scaled(240), check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    written = json.loads((out / "model_accuracy.json").read_text())
    assert printed == written
    for key in KEYS:
        assert isinstance(written[key], float) and math.isfinite(written[key]) and written[key] >= 0, key
    assert 0 <= written["regret_within_5pct_share"] <= 1
    assert (out / "predicted_vs_measured.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not {f"{PREFIX}hub", f"{PREFIX}0", f"{PREFIX}1"} & set(list_namespaces())

    rows = load_measured(out / "measured.json")
    assert len(rows) == 1 + 3 * 2  # dense, and three Top-k collectives at two CRs
    assert all(r.t_sync_s > 0 and len(r.samples_s) >= 3 and r.alpha_op_s > 0 for r in rows)
    # The agent's bandwidth probe saw the shaped link: never above its 50 Mbit/s
    # (unshaped, the veths carry gigabits) and not far below it (a failed probe
    # reads 0). How close it reads is test_iperf's to judge, with a plain test
    # beside it: here the suite's other worker loads the host, and in two CI runs
    # all three readings fell below 85% (83-87% in one).
    readings = [r.bandwidth_probes_bps for r in rows]
    assert all(0.5 * 50e6 < max(probes) < 1.0 * 50e6 for probes in readings), readings
    assert all(len(r.bandwidth_probes_bps) == 3 and r.bandwidth_probe_bps == statistics.median(r.bandwidth_probes_bps)
               for r in rows)
    # 256 KB dense over 50 Mbit/s with 2 nodes is 41 ms of wire time (38 ms after the
    # shaper's 16 KB burst); unshaped veths take a few ms: the measurement must see the link.
    dense = next(r for r in rows if r.collective == "dense_ring")
    assert dense.t_sync_s > 0.6 * 0.041
    # Every row carries the token bucket the lab's shaper gave the links; the headline model uses it.
    assert {r.bucket for r in rows} == {LinkBucket(CEIL_OVER_RATE, RATE_BUCKET_SECONDS)}
    assert written["headline"]["link_bucket"] == [{"peak_over_rate": CEIL_OVER_RATE,
                                                   "burst_s": RATE_BUCKET_SECONDS}]

    # The headline raw prediction of every point is the paper's formula by hand,
    # and the raw error is its median error against the measurement.
    with (out / "table.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [float(t["raw_paper+alpha_tcp+beta_probe+bucket_s"]) for t in table] == pytest.approx(
        [paper_seconds(r) for r in rows], rel=1e-5)
    errs = [abs(paper_seconds(r) - r.t_sync_s) / r.t_sync_s for r in rows]
    assert written["median_abs_error_raw"] == pytest.approx(statistics.median(errs), abs=1e-4)
    # Each figure follows the measurements: change them and the figures change.
    # (An offset, not a factor: the calibration rightly absorbs a factor per collective.)
    slower = [replace(r, t_sync_s=r.t_sync_s + 0.02) for r in rows]
    again, _, _ = analyse(slower)
    assert again["median_abs_error_raw"] != written["median_abs_error_raw"]
    assert again["median_abs_error_calibrated"] != written["median_abs_error_calibrated"]
    # Plumbing: the headline regret share is the held-out half's, aggregated from the
    # table's own calibrated column (the calibration's arithmetic is checked by hand
    # in tests/policy/test_costmodel.py): per CR, the measured time of the collective
    # with the lowest calibrated prediction over the fastest measured one.
    shares = []
    held = [t for t in table if t["half"] == "heldout" and t["collective"] != "dense_ring"]
    assert held and written["regret_points"] == len({t["cr"] for t in held})
    for cr in {t["cr"] for t in held}:
        group = [t for t in held if t["cr"] == cr]
        chosen = min(group, key=lambda t: (float(t["calibrated_s"]), t["collective"]))
        fastest = min(float(t["measured_s"]) for t in group)
        shares.append(float(chosen["measured_s"]) / fastest <= REGRET_OK)
    assert written["regret_within_5pct_share"] == pytest.approx(sum(shares) / len(shares))


def test_calibrate_command_reanalyses_a_run_without_measuring(tmp_path: Path, capsys) -> None:
    import argparse
    from dataclasses import asdict

    from flexcomm.commands.lab_calibrate import add_parser, grid_from

    # Synthetic measurements that follow the paper forms at alpha 50 us, plus a 2 ms per-call overhead.
    rows = []
    for rate in (1e9, 100e6, 10e6):
        for cr in (0.1, 0.01):
            for coll in ("ag_topk", "art_ring", "art_tree"):
                r = row(coll, cr, 1.0, rate=rate)
                rows.append(replace(r, t_sync_s=paper_seconds(r) + 0.002, samples_s=[paper_seconds(r) + 0.002] * 3))
        dense = row("dense_ring", 1.0, 1.0, rate=rate)
        rows.append(replace(dense, t_sync_s=paper_seconds(dense) * 1.2 + 0.002))
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "measured.json").write_text(json.dumps([asdict(r) for r in rows]))
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["calibrate", "--out", str(tmp_path / "again"), "--from", str(earlier)])
    assert args.func(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["median_abs_error_raw"] > 0.01  # the raw model lacks the overhead
    assert result["median_abs_error_calibrated"] < 0.01  # an affine calibration recovers it exactly
    assert result["regret_within_5pct_share"] == 1.0
    assert (tmp_path / "again" / "table.csv").exists()
    bad = parser.parse_args(["calibrate", "--out", str(tmp_path / "bad"), "--nodes", "two"])
    with pytest.raises(ValueError, match="nodes"):
        grid_from(bad)


def test_a_run_that_did_not_record_its_links_bucket_can_be_given_it(tmp_path: Path, capsys) -> None:
    import argparse
    from dataclasses import asdict

    from flexcomm.commands.lab_calibrate import add_parser

    bucket = LinkBucket(1.2, 0.005)
    rows = []  # taken on token-bucket links that the (older) run did not record: stored as plain
    for rate in (1e9, 100e6, 10e6):
        for cr in (0.1, 0.01):
            for coll in ("ag_topk", "art_ring", "art_tree"):
                r = row(coll, cr, 1.0, rate=rate)
                t = paper_seconds(r, bucket)
                rows.append(replace(r, t_sync_s=t, samples_s=[t] * 3))
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "measured.json").write_text(json.dumps([asdict(r) for r in rows]))
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))

    def analysed(*extra: str) -> dict:
        args = parser.parse_args(["calibrate", "--out", str(tmp_path / "again"), "--from", str(earlier), *extra])
        assert args.func(args) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert analysed()["median_abs_error_raw"] > 0.01  # read as plain links, the model is off
    given = analysed("--link-bucket", "1.2,5ms")
    assert given["median_abs_error_raw"] < 1e-9 and given["link_bucket_given"] == "1.2,5ms"
    assert given["headline"]["link_bucket"] == [asdict(bucket)]

    for bad, message in ((["--link-bucket", "1.2"], "expected PEAK,BURST"),
                         (["--link-bucket", "0.5,5ms"], "link-bucket PEAK: must be in"),
                         (["--link-bucket", "1.2,0s"], "link-bucket BURST: needed with link-bucket PEAK"),
                         (["--link-bucket", "x,5ms"], "link-bucket PEAK: expected a number"),
                         (["--link-bucket", "1.2,5"], "link-bucket BURST: duration '5' needs a unit")):
        args = parser.parse_args(["calibrate", "--out", str(tmp_path / "bad"), "--from", str(earlier), *bad])
        with pytest.raises(ValueError, match=message):
            args.func(args)
    args = parser.parse_args(["calibrate", "--out", str(tmp_path / "bad"), "--link-bucket", "1.2,5ms"])
    with pytest.raises(ValueError, match="only with --from"):
        args.func(args)
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "measured.json").write_text(json.dumps(  # two configurations, two other buckets
        [asdict(replace(r, peak_over_rate=1.5 if r.rate_bps > 50e6 else 1.3, bucket_s=0.002)) for r in rows]))
    args = parser.parse_args(["calibrate", "--out", str(tmp_path / "bad"), "--from", str(recorded),
                              "--link-bucket", "1.2,5ms"])
    with pytest.raises(ValueError, match=r"recorded its links' bucket \(LinkBucket\(peak_over_rate=1.3"):
        args.func(args)
    assert not (tmp_path / "bad").exists()
