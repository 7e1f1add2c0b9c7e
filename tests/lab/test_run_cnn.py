"""A few steps of the lab's cnn workload under a shipped schedule, twice per
policy: real namespaces, agents and gloo ranks; the report gives medians and spreads.

Namespace prefix "fclc<pid>-", subnet 10.203.2.0/24 (this test file's own).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.lab_runs import LabRuns
from support.names import run_prefix

LAB = LabRuns(run_prefix("fclc"), "10.203.2.0/24")


@pytest.mark.privileged
@pytest.mark.slow
def test_a_few_cnn_steps_twice_per_policy_give_medians(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "cnn"
    stdout, summary = LAB.run_ok(out, "--workload", "cnn", "--schedule", "random-walk", "--policies",
                                 "powersgd-1 moo", "--steps", "12", "--repeats", "2", timeout=280)
    assert "(repeat 2/2)" in stdout
    assert (summary["workload"], summary["settings"]["repeats"]) == ("cnn", 2)
    for name in ("powersgd-1", "moo"):
        s = summary["policies"][name]
        assert s["per_repeat"]["steps"] == [12, 12] and s["steps"] == 12
        assert len(s["per_repeat"]["final_accuracy"]) == 2
        lo, hi = s["spread"]["final_accuracy"]
        assert lo <= s["final_accuracy"] <= hi
        assert (out / "policies" / f"{name}@1" / "records.jsonl").exists()
    assert summary["policies"]["powersgd-1"]["phases"][0]["rate_bps"] == 820e6  # the walk's first rate
    assert summary["verdicts"][0].startswith("moo vs powersgd-1: time to target")
    LAB.assert_nothing_left(out)
