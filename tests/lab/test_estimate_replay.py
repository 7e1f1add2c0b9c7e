"""bench/estimate_replay.py on a run directory written here: a real store with a
probe and a job's dense syncs over a link that falls from 100 to 20 Mbit/s,
replayed through the real estimator and scored as the lab scores the live one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flexcomm.lab.fidelity import TCP_PAYLOAD_SHARE
from flexcomm.store import Measurement, StepAggregate, Store

BENCH = Path(__file__).resolve().parents[2] / "bench" / "estimate_replay.py"
GRAD_BYTES = 4_600_000  # one flat vector; a dense ring of two nodes moves all of it once
T0, FALL = 1_000_000.0, 1_000_010.0


def _sync_s(rate_bps: float) -> float:
    return 0.003 + GRAD_BYTES * 8 / (rate_bps * TCP_PAYLOAD_SHARE)


def _write_run(out: Path) -> None:
    pdir = out / "policies" / "dense"
    (pdir / "agents").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"policies": ["dense"], "repeats": 1}))
    (out / "cluster.json").write_text(json.dumps({"nodes": [{"address": "10.9.0.1"}], "shaped": False}))
    links = [{"step_index": i, "round": 0, "rate_bps": rate, "applied_at": at}
             for i, (rate, at) in enumerate(((100e6, T0), (20e6, FALL)))]
    (pdir / "links.jsonl").write_text("".join(json.dumps(link) + "\n" for link in links))
    steps, wall = [], T0 + 0.1
    with Store(pdir / "agents" / "node0.db") as store:
        store.add_job("job", {"job_id": "job", "world_size": 2, "grad_bytes": GRAD_BYTES,
                              "nodes": ["10.9.0.1", "10.9.0.2"], "policy": "static"}, created=T0)
        store.add_measurement(Measurement("10.9.0.2", "bandwidth", bandwidth_bps=100e6 * TCP_PAYLOAD_SHARE,
                                          beta_s_per_byte=8 / (100e6 * TCP_PAYLOAD_SHARE), duration_s=1.0, ts=T0))
        for step in range(60):
            seconds = _sync_s(100e6 if wall < FALL else 20e6)
            wall += seconds
            store.add_step_aggregates([StepAggregate("job", step, step, 0, "dense", 0.0, "dense_ring", 1, 0.0,
                                                     seconds, 1.0)], ts=wall)
            steps.append({"kind": "step", "step": step, "wall": wall, "t": wall - T0})
    (pdir / "records.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))


def test_a_replay_reads_the_recorded_syncs_through_the_estimator(tmp_path: Path) -> None:
    _write_run(tmp_path)
    proc = subprocess.run([sys.executable, str(BENCH), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["runs"] == 1 and result["live"]["phases"] == 0  # the run kept no live estimates
    assert result["replayed"] == {"phases": 2, "reached": 2, "median_within_10pct": 2}
