"""bench/quality_measures.py on a small run: real gloo ranks through the hook,
the update error measured outside it (dense's is exact, Top-k's is not)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.waiting import scaled

BENCH = Path(__file__).resolve().parents[2] / "bench" / "quality_measures.py"


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(240)
def test_the_quality_bench_measures_the_update_error_outside_the_hook() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--workload", "digits", "--world", "2", "--steps", "6",
                           "--options", "dense topk:0.01"], capture_output=True, text=True, timeout=scaled(180))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    dense, topk = result["options"]["dense"], result["options"]["topk:0.01"]
    assert dense["update_error"] < 1e-5 and dense["gain"] == 1.0
    assert topk["update_error"] > 0.1 and 0.0 < topk["gain"] < 0.5
    assert 0.0 <= topk["accuracy"] <= 1.0 and result["metric"] == "accuracy"
