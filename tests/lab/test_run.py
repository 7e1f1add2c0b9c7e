"""The lab end to end: real namespaces and HTB links, real `flexcomm agent`s, real
gloo ranks training under a two-phase schedule, the report, and the cleanup
(the lm and cnn workloads: test_run_lm.py, test_run_cnn.py).

Namespace prefix "fcl<pid>-", subnet 10.203.0.0/24 (this test file's own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flexcomm.lab.estimate_tracking import read_estimates
from flexcomm.lab.netns import list_namespaces
from flexcomm.lab.plan import policy_dir
from flexcomm.lab.report import read_jsonl
from flexcomm.policy.types import Compression
from support.lab_runs import LabRuns
from support.names import run_prefix
from support.waiting import scaled, wait_for

PREFIX = run_prefix("fcl")
SUBNET = "10.203.0.0/24"
FAST, SLOW = 1e9, 10e6
# 2 nodes, batch 32: 22 steps per epoch; epochs 0-1 fast, then slow (88 steps: 44 and
# 44, so the slow phase outlasts detecting the change and exploring it, even when
# the whole suite loads the machine).
TWO_PHASE = """
[[step]]
epoch = 0
rate = "1Gbit"

[[step]]
epoch = 2
rate = "10Mbit"
"""


LAB = LabRuns(PREFIX, SUBNET)


@pytest.mark.privileged
@pytest.mark.slow
def test_short_lab_adapts_reports_and_leaves_nothing(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "run"
    schedule = tmp_path / "two-phase.toml"
    schedule.write_text(TWO_PHASE)
    stdout, summary = LAB.run_ok(out, "--schedule", str(schedule), "--policies", "topk-0.1 moo",
                                 "--steps", "88", timeout=280)
    assert "links shaped" in stdout and "to target" in stdout
    for name in ("topk-0.1", "moo"):
        s = summary["policies"][name]
        assert s["steps"] == 88
        assert 0.5 < s["final_accuracy"] <= 1.0
        assert s["bytes_sent"] > 0 and s["wall_s"] > 0
        assert "time_to_target_s" in s
        assert s["warnings"] == []  # e.g. the agent answered and its decisions were adopted
    assert summary["hindsight_best_fixed_s"] > 0
    for png in ("network.png", "quality.png", "step_time.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The links really changed, and MOO's choice changed with them.
    phases = {p["rate_bps"]: p for p in summary["policies"]["moo"]["phases"]}
    assert set(phases) == {FAST, SLOW}
    fast, slow = phases[FAST], phases[SLOW]
    assert fast["steps"] == 44 and slow["steps"] == 44
    # On the slow link it sends less than dense. Top-k 0.1 over AllGather on 4 nodes
    # moves about as many bytes as bf16 over the ring, so either may be the choice
    # there (one run in five beside two CPU hogs ran bf16 at 1.27x fixed Top-k's step).
    assert Compression.parse(slow["compression"]).family != "dense", slow
    # Fixed Top-k's steps got slower on the slow link: the shaping was real. CR 0.1
    # (about 150 KB a step), so the message outlasts the shaper's burst many times
    # over; at CR 0.01 (15 KB) it fits the 16 KB bucket and the difference is noise.
    fixed = {p["rate_bps"]: p for p in summary["policies"]["topk-0.1"]["phases"]}
    assert fixed[SLOW]["mean_step_s"] > fixed[FAST]["mean_step_s"]
    # On the slow link the MOO keeps up with the budget's reference run fixed (Top-k
    # 0.1, which it may also choose where it is fastest): bf16 through the slow phase
    # ran 1.9x its step. Exploring and the switch at the change cost some. (Not on the
    # fast link: there every option's sync is a few ms of host work, and two runs
    # minutes apart on a shared host differ by more than the options do: in one CI
    # try the same option, Top-k 0.1 over AllGather, ran 14.3 ms a step in the MOO's
    # run and 8.9 ms in the fixed one.)
    assert slow["mean_step_s"] <= 1.5 * fixed[SLOW]["mean_step_s"], (slow, fixed[SLOW])
    # The agent's estimate was recorded beside the shaped rate, and followed the 100x
    # drop: some figure after it between half the slow link's goodput and 25% over
    # it. (Within 10% in 5 s of every change is a goal the lab's estimate_tracking
    # measures and the estimator does not reach every time: with no probe in the
    # duty budget and the overhead not yet learned, a sync reads as if its whole time
    # were the wire, and gloo's own work is part of it: in a CI run beside the rest
    # of the suite it was ~150 ms of a 520 ms sync, read as 6.9 against 9.6 Mbit/s;
    # quiet, what the Top-k syncs bound reads 8-17% either side of goodput.)
    # Checked on fixed Top-k's run, whose slow phase (~10 s) outlasts the 5 s the
    # estimate is given: the MOO's can be shorter (PowerSGD there: 44 steps of 92
    # ms beside two CPU hogs), and its small syncs bound the link loosely.
    tracked = {e["shaped_bps"]: e for e in summary["policies"]["topk-0.1"]["estimate_tracking"]}
    assert set(tracked) == {FAST, SLOW}
    goodput = tracked[SLOW]["goodput_bps"]
    drop = next(link["applied_at"] for link in read_jsonl(policy_dir(out, "topk-0.1") / "links.jsonl")
                if link["rate_bps"] == SLOW)
    seen = [e["bandwidth_bps"] for e in read_estimates(out, "topk-0.1") if e["wall"] >= drop]
    assert any(0.5 * goodput <= b <= 1.25 * goodput for b in seen), (tracked[SLOW], seen)

    LAB.assert_nothing_left(out)


@pytest.mark.slow
def test_a_loopback_lab_runs_flexcomm_policies_through_node_0s_agent(tmp_path: Path) -> None:
    # Without root, or with --loopback, every rank is 127.0.0.1: the job's nodes
    # name that host once, and node 0's agent decides (it refused the job when
    # the address came once per rank, and every flexcomm policy failed).
    out = tmp_path / "loopback"
    _, summary = LAB.run_ok(out, "--loopback", "--policies", "topk-0.1", "--steps", "4", "--eval-every", "2",
                            timeout=180)
    s = summary["policies"]["topk-0.1"]
    assert s["steps"] == 4 and s["warnings"] == [], s
    log = (policy_dir(out, "topk-0.1") / "agents" / "node0.log").read_text()
    assert "job registered" in log and "nodes=['127.0.0.1']" in log, log[-2000:]


@pytest.mark.privileged
@pytest.mark.slow
def test_ctrl_c_mid_run_removes_everything(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "run"
    schedule = tmp_path / "two-phase.toml"
    schedule.write_text(TWO_PHASE)
    proc = subprocess.Popen(
        LAB.argv(out, "--schedule", str(schedule), "--policies", "topk-0.1", "--steps", "100000"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    records = out / "policies" / "topk-0.1" / "records.jsonl"
    try:
        def trained() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            return records.exists() and '"kind": "step"' in records.read_text()

        wait_for(trained, 120, "a training step", interval_s=0.2)
        assert any(ns.startswith(PREFIX) for ns in list_namespaces())
        os.kill(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=scaled(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run([sys.executable, "-m", "flexcomm.cli", "lab", "clean",
                            "--prefix", PREFIX], check=False)
    assert proc.returncode == 130, output[-2000:]
    assert "interrupted" in output
    LAB.assert_nothing_left(out)


@pytest.mark.privileged
def test_clean_kills_processes_and_removes_namespaces(privileged: None, tmp_path: Path) -> None:
    from flexcomm.lab.cleanup import clean
    from flexcomm.lab.netns import ip

    ns = f"{PREFIX}crash0"
    ip("netns", "add", ns)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"])
    try:
        wait_for(lambda: subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.strip(),
                 10, "the sleeper in its namespace")
        gone = clean(f"{PREFIX}crash")
        assert gone["namespaces"] == [ns]
        assert sleeper.wait(timeout=scaled(10)) != 0
        assert ns not in list_namespaces()
    finally:
        sleeper.kill()
        clean(f"{PREFIX}crash")
