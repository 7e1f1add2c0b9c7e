"""A few steps of the lab's lm workload under a shipped schedule: real namespaces,
agents and gloo ranks; the report gives validation loss.

Namespace prefix "fcll<pid>-", subnet 10.203.1.0/24 (this test file's own).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.lab_runs import LabRuns
from support.names import run_prefix

LAB = LabRuns(run_prefix("fcll"), "10.203.1.0/24")


@pytest.mark.privileged
@pytest.mark.slow
def test_a_few_lm_steps_report_validation_loss(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "lm"
    stdout, summary = LAB.run_ok(out, "--workload", "lm", "--schedule", "up-and-down", "--policies",
                                 "topk-0.01 moo", "--steps", "10", "--eval-every", "5", timeout=240)
    assert "target validation loss" in stdout and "quality.png" in stdout
    assert (summary["workload"], summary["schedule"]) == ("lm", "up-and-down")
    assert summary["settings"]["target_metric"] == "loss"
    for name in ("topk-0.01", "moo"):
        s = summary["policies"][name]
        assert s["steps"] == 10 and s["warnings"] == []
        assert 0.5 < s["final_loss"] < 5.0  # learned from ln(256) = 5.55 nats
        assert 0.0 < s["final_accuracy"] < 1.0
        assert 0 <= s["explore_steps"] <= 10 and s["compute_s"] > 0
        assert [p["rate_bps"] for p in s["phases"]] == [30e6]  # up-and-down starts slow
    assert (out / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    LAB.assert_nothing_left(out)
