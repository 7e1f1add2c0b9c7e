"""The lab end to end: real namespaces and HTB links, real `flexcomm agent`s, real
gloo ranks training under a two-phase schedule, the report, and the cleanup; and
a few steps of the lm and cnn workloads under shipped schedules named on the
command line, the cnn twice per policy.

Namespace prefix "fcl<pid>-", subnet 10.203.0.0/24 (this test file's own).
"""

from __future__ import annotations

import json
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


def lab_argv(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flexcomm.cli", "lab", "run", "--out", str(out),
            "--nodes", "2", "--prefix", PREFIX, "--subnet", SUBNET, *extra]


def run_lab_ok(out: Path, *extra: str, timeout: float) -> tuple[str, dict]:
    """Run the lab to the end; its stdout and summary."""
    proc = subprocess.run(lab_argv(out, *extra), capture_output=True, text=True, timeout=scaled(timeout))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads((out / "summary.json").read_text())


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def assert_nothing_left(out: Path) -> None:
    assert [ns for ns in list_namespaces() if ns.startswith(PREFIX)] == []
    assert processes_mentioning(str(out)) == []  # ranks and agents name the run dir
    # Every link end's qdisc was restored (Revert deletes its record) before its
    # namespace went away.
    assert list((out / "emulation-state").glob("*.json")) == []


@pytest.mark.privileged
@pytest.mark.slow
def test_short_lab_adapts_reports_and_leaves_nothing(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "run"
    schedule = tmp_path / "two-phase.toml"
    schedule.write_text(TWO_PHASE)
    stdout, summary = run_lab_ok(out, "--schedule", str(schedule), "--policies", "topk-0.1 moo",
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

    assert_nothing_left(out)


@pytest.mark.slow
def test_a_loopback_lab_runs_flexcomm_policies_through_node_0s_agent(tmp_path: Path) -> None:
    # Without root, or with --loopback, every rank is 127.0.0.1: the job's nodes
    # name that host once, and node 0's agent decides (it refused the job when
    # the address came once per rank, and every flexcomm policy failed).
    out = tmp_path / "loopback"
    _, summary = run_lab_ok(out, "--loopback", "--policies", "topk-0.1", "--steps", "4", "--eval-every", "2",
                            timeout=180)
    s = summary["policies"]["topk-0.1"]
    assert s["steps"] == 4 and s["warnings"] == [], s
    log = (policy_dir(out, "topk-0.1") / "agents" / "node0.log").read_text()
    assert "job registered" in log and "nodes=['127.0.0.1']" in log, log[-2000:]


@pytest.mark.privileged
@pytest.mark.slow
def test_a_few_lm_steps_report_validation_loss(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "lm"
    stdout, summary = run_lab_ok(out, "--workload", "lm", "--schedule", "up-and-down", "--policies",
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
    assert_nothing_left(out)


@pytest.mark.privileged
@pytest.mark.slow
def test_a_few_cnn_steps_twice_per_policy_give_medians(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "cnn"
    stdout, summary = run_lab_ok(out, "--workload", "cnn", "--schedule", "random-walk", "--policies",
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
    assert_nothing_left(out)


@pytest.mark.privileged
@pytest.mark.slow
def test_ctrl_c_mid_run_removes_everything(privileged: None, tmp_path: Path) -> None:
    out = tmp_path / "run"
    schedule = tmp_path / "two-phase.toml"
    schedule.write_text(TWO_PHASE)
    proc = subprocess.Popen(
        lab_argv(out, "--schedule", str(schedule), "--policies", "topk-0.1", "--steps", "100000"),
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
    assert_nothing_left(out)


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
