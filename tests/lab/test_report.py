"""The lab's policy specs, configuration checks and report arithmetic (no root,
no training: the report is built from hand-written records), and one short lab
on loopback, as it runs without root."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from flexcomm.lab.fidelity import TCP_PAYLOAD_SHARE
from flexcomm.lab.plan import (
    ALL_POLICIES,
    DEFAULT_POLICIES,
    FAILED,
    SCHEDULES_DIR,
    named_schedules,
    parse_policies,
    parse_policy,
    schedule_file,
)
from flexcomm.lab.report import build_summary, is_exploring
from flexcomm.lab.runner import LabConfig, policy_dir
from flexcomm.lab.summary import LabSummary, from_json, to_json
from flexcomm.lab.table import format_table
from flexcomm.lab.trainer import STOP_LOOK_INTERVAL
from flexcomm.lab.workload import WorkloadSpec
from support.waiting import scaled, wait_for


def test_default_policies_parse() -> None:
    specs = parse_policies(" ".join(DEFAULT_POLICIES))
    assert [s.label for s in specs] == list(DEFAULT_POLICIES)
    kinds = {s.label: (s.kind, s.options, s.fixed) for s in specs}
    assert kinds["topk-0.01"] == ("static", {"compression": "topk:0.01", "collective": "ag_topk"}, True)
    assert kinds["moo"] == ("moo", {}, False)
    assert kinds["powersgd"][0] == "powersgd" and kinds["powersgd"][2]  # PyTorch's, what a user picks
    assert not kinds["gravac"][2]


def test_pytorch_baselines_and_all() -> None:
    assert parse_policy("powersgd-4").options == {"rank": 4}
    assert parse_policy("powersgd").options == {"rank": 2}  # PyTorch's default rank
    assert parse_policy("bf16").kind == "bf16" and parse_policy("bf16").fixed
    assert parse_policy("localsgd").options == {"period": 4}  # PyTorch's example's period
    assert parse_policy("localsgd-8").options == {"period": 8}
    labels = [s.label for s in parse_policies("all")]
    assert labels == list(ALL_POLICIES)
    assert {"dense", "bf16", "powersgd-1", "powersgd-4", "localsgd", "topk-0.01", "moo",
            "gravac"} <= set(labels)
    assert [s.label for s in parse_policies("moo:objective=progress all")][:2] == [
        "moo:objective=progress", "dense"]


def test_schedules_are_found_by_name_or_path(tmp_path: Path) -> None:
    assert schedule_file("up-and-down") == SCHEDULES_DIR / "up-and-down.toml"
    assert {"up-and-down", "random-walk"} <= set(named_schedules())
    mine = tmp_path / "mine.toml"
    assert schedule_file(str(mine)) == mine  # a path stays a path, even before it exists
    with pytest.raises(ValueError, match=r"^schedule: no file 'up-down' and no shipped schedule "
                                         r"of that name \(one of .*random-walk.*up-and-down"):
        schedule_file("up-down")


def test_an_unknown_schedule_name_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "flexcomm.cli", "lab", "run", "--out",
                           str(tmp_path / "run"), "--schedule", "sideways"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no shipped schedule" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_policy_options_and_collectives() -> None:
    assert parse_policy("topk-0.004-art_ring").options == {"compression": "topk:0.004", "collective": "art_ring"}
    assert parse_policy("static:compression=powersgd:2").options == {"compression": "powersgd:2"}
    spec = parse_policy("moo:objective=progress,warmup_steps=5")
    assert spec.options == {"objective": "progress", "warmup_steps": 5}
    assert [s.label for s in parse_policies("dense,moo")] == ["dense", "moo"]


@pytest.mark.parametrize(("text", "message"), [
    ("sgd", "unknown policy 'sgd'"),
    ("topk-2", "compression ratio must be in (0, 1]"),
    ("topk-1", "a Top-k CR must be < 1"),
    ("topk-x", "is not a number"),
    ("topk-0.1-dense_ring", "not a Top-k collective"),
    ("moo:objective", "is not key=value"),
    ("powersgd:rank=4", "powersgd takes no options (its rank is written powersgd-RANK)"),
    ("powersgd-0", "the PowerSGD rank must be a whole number >= 1"),
    ("powersgd-x", "the PowerSGD rank must be a whole number >= 1"),
    ("bf16:x=1", "bf16 takes no options"),
    ("localsgd:period=8", "localsgd takes no options (its period is written localsgd-PERIOD)"),
    ("localsgd-1", "the averaging period must be a whole number >= 2"),
    ("moo:bogus=1", "moo:bogus=1: bogus: unknown MOO option"),
    ("static:cr=0.1,collective=ps", "static:cr=0.1,collective=ps: "),
    ("dense moo dense", "'dense' is listed twice"),
])
def test_bad_policy_specs_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^policies: ") as err:
        parse_policies(text)
    assert message in str(err.value)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("nodes", 1, "nodes: need at least 2"),
    ("steps", 0, "steps: must be >= 1"),
    ("target", 1.5, "target: a test accuracy must be in (0, 1]"),
    ("repeats", 0, "repeats: must be >= 1"),
    ("optimizer", "lbfgs", "optimizer: one of sgd, adam"),
    ("decisions", "remote", "decisions: one of agent, inprocess"),
    ("targets", ["0.9", "fast"], "targets: 'fast' is not a number or 'tight'"),
    ("targets", ["1.2"], "targets: a test accuracy must be in (0, 1], got 1.2"),
    ("targets", [], "targets: need at least one"),
    ("budget_s", 0.0, "budget_s: must be > 0 seconds"),
])
def test_bad_lab_settings_are_named(tmp_path: Path, field: str, value: object,
                                    message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        LabConfig(out=tmp_path, **{field: value})


def test_a_budget_needs_a_time_keyed_schedule(tmp_path: Path) -> None:
    epochs = (SCHEDULES_DIR / "up-and-down.toml").read_text()
    with pytest.raises(ValueError, match=r"^budget_s: the schedule is keyed by epoch"):
        LabConfig(out=tmp_path, budget_s=30.0, schedule_text=epochs)
    assert not LabConfig(out=tmp_path, schedule_text=epochs).equal_time  # equal steps
    timed = LabConfig(out=tmp_path, budget_s=30.0, policies=parse_policies("moo dense"))
    assert timed.equal_time and timed.pacesetter is None  # the budget is given
    paced = LabConfig(out=tmp_path, policies=parse_policies("moo dense"))
    assert paced.pacesetter == "dense" and paced.targets == ["0.95", "tight"]
    from flexcomm.lab.runner import run_order
    assert [spec.label for _, _, spec in run_order(paced)] == ["dense", "moo"]


def test_bad_schedule_is_refused_before_anything_runs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[step]]\nepoch = 0\nrate = "-5Mbit"\n')
    proc = subprocess.run([sys.executable, "-m", "flexcomm.cli", "lab", "run", "--out",
                           str(tmp_path / "run"), "--schedule", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "rate" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


# -- the report, from hand-written records --------------------------------------

LINKS = [  # two phases: fast from t=100, slow from t=200 (wall clock)
    {"step_index": 0, "round": 0, "epoch": 0, "rate_bps": 1e9, "applied_at": 100.0},
    {"step_index": 1, "round": 0, "epoch": 1, "rate_bps": 1e7, "applied_at": 200.0},
]


EPOCH_KEYED = '[[step]]\nepoch = 0\nrate = "1Gbit"\n\n[[step]]\nepoch = 1\nrate = "10Mbit"\n'


def write_run(out: Path, label: str, step_s: tuple[float, float], cr: tuple[float, float],
              accuracies: list[float], version: int = 1, *, repeat: int = 0,
              losses: list[float] | None = None, exploring: list[bool] | None = None,
              compute_s: float | None = None) -> None:
    """4 steps: 2 fast (wall 101, 102), 2 slow (201, 202); an eval after each step."""
    pdir = policy_dir(out, label, repeat)
    pdir.mkdir(parents=True)
    records: list[dict] = []
    if compute_s is not None:
        records.append({"kind": "start", "compute_s": compute_s})
    t = 0.0
    for i, wall in enumerate((101.0, 102.0, 201.0, 202.0)):
        phase = 0 if i < 2 else 1
        t += step_s[phase]
        collective = "dense_ring" if cr[phase] == 1.0 else "ag_topk"
        compression = "dense" if cr[phase] == 1.0 else f"topk:{cr[phase]!r}"
        records.append({"kind": "step", "step": i, "epoch": phase, "t": t, "wall": wall,
                        "step_s": step_s[phase], "cr": cr[phase], "compression": compression,
                        "collective": collective,
                        "bytes_sent": 1000, "t_sync_s": step_s[phase] / 2, "version": version,
                        "predicted_sync_s": step_s[phase] / 4, "reason": "chosen",
                        "exploring": bool(exploring and exploring[i])})
        held_out = {"accuracy": accuracies[i]} | ({"loss": losses[i]} if losses else {})
        records.append({"kind": "eval", "step": i + 1, "t": t, **held_out})
    (pdir / "records.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (pdir / "links.jsonl").write_text("\n".join(json.dumps(r) for r in LINKS) + "\n")


def test_summary_figures_and_hindsight(tmp_path: Path) -> None:
    out = tmp_path
    policies = ["dense", "topk-0.01", "moo", "powersgd"]
    cfg = LabConfig(out=out, policies=parse_policies(" ".join(policies)), target=0.9,
                    schedule_text=EPOCH_KEYED)  # the same steps: a hindsight sum of step times
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    (out / "cluster.json").write_text(json.dumps({"shaped": True, "reason_unshaped": ""}))
    write_run(out, "dense", (0.1, 2.0), (1.0, 1.0), [0.5, 0.8, 0.92, 0.95])
    write_run(out, "topk-0.01", (0.3, 0.2), (0.01, 0.01), [0.4, 0.7, 0.85, 0.91])
    write_run(out, "moo", (0.12, 0.25), (1.0, 0.01), [0.5, 0.8, 0.91, 0.945])
    write_run(out, "powersgd", (0.2, 0.15), (0.05, 0.05), [0.5, 0.7, 0.8, 0.85])

    summary = build_summary(out)
    dense, moo, psgd = (summary.policies[p] for p in ("dense", "moo", "powersgd"))
    assert dense.time_to_target_s == pytest.approx(0.1 + 0.1 + 2.0)
    assert moo.time_to_target_s == pytest.approx(0.12 + 0.12 + 0.25)
    assert psgd.time_to_target_s is None
    assert moo.final_accuracy == 0.945
    assert moo.bytes_sent == 4000
    assert moo.wall_s == pytest.approx(2 * 0.12 + 2 * 0.25)
    fast, slow = moo.phases
    assert (fast.rate_bps, fast.steps, fast.compression) == (1e9, 2, "dense")
    assert (slow.rate_bps, slow.steps, slow.compression) == (1e7, 2, "topk:0.01")
    assert slow.predicted_sync_s == pytest.approx(0.0625)
    assert slow.measured_sync_s == pytest.approx(0.125)
    # Best fixed per phase: dense when fast (0.1 s/step), PyTorch's PowerSGD when slow
    # (0.15 s/step: a user's fixed choice too); moo adapts, so it does not count.
    assert summary.hindsight_best_fixed_s == pytest.approx(2 * 0.1 + 2 * 0.15)
    assert [c["policy"] for c in summary.hindsight_choices] == ["dense", "powersgd"]
    # Among the fixed choices that reached every target (Top-k's 91% misses the
    # tight one, dense's 95% - 0.3 points; PowerSGD reaches neither), dense is the
    # best on both phases.
    assert summary.hindsight_reaching_s == pytest.approx(2 * 0.1 + 2 * 2.0)
    assert summary.moo_over_hindsight_reaching == pytest.approx(0.74 / 4.2)
    comparisons = summary.comparisons
    assert comparisons["dense"].rival_over_moo_time_to_target == pytest.approx(2.2 / 0.49)
    assert comparisons["dense"].moo_minus_rival_final_accuracy_points == pytest.approx(-0.5)
    assert summary.moo_over_hindsight_best_fixed == pytest.approx(0.74 / 0.5)
    assert comparisons["powersgd"].rival_over_moo_time_to_target is None

    assert all(summary.policies[p].warnings == () for p in policies)
    table = format_table(summary)
    assert "never" in table  # powersgd did not reach the target
    assert "1 Gbit/s: 2x120 ms dense@dense_ring" in table and "10 Mbit/s: 2x250 ms topk:0.01@ag_topk" in table


def test_the_agents_estimate_is_tracked_per_phase(tmp_path: Path) -> None:
    cfg = LabConfig(out=tmp_path, policies=parse_policies("moo"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    write_run(tmp_path, "moo", (0.1, 0.5), (1.0, 0.01), [0.5, 0.6, 0.7, 0.8])
    goodput = 1e7 * TCP_PAYLOAD_SHARE
    # the job's first step is at 101: the first phase's clock starts there, not at the link's 100
    estimates = [(101.5, 0.93e9, "probe"), (201.0, 0.93e9, "probe"), (206.0, 1.5 * goodput, "passive"),
                 (213.0, 1.05 * goodput, "passive+probe"), (214.0, 0.97 * goodput, "passive+probe")]
    (policy_dir(tmp_path, "moo") / "estimates.jsonl").write_text("".join(
        json.dumps({"wall": w, "bandwidth_bps": b, "evidence": e}) + "\n" for w, b, e in estimates))
    summary = build_summary(tmp_path)
    fast, slow = summary.policies["moo"].estimate_tracking
    assert (fast["shaped_bps"], fast["estimated_bps"], fast["seconds_to_within_10pct"]) == (1e9, 0.93e9, 0.5)
    assert (slow["shaped_bps"], slow["seconds_to_within_10pct"], slow["deadline_s"]) == (1e7, 13.0, 5.0)
    assert slow["estimated_bps"] == pytest.approx(1.275 * goodput) and not slow["reached"]
    assert slow["evidence"] == ["passive", "passive+probe", "probe"]
    assert summary.estimate_tracking == {"phases": 2, "reached": 1, "first_repeat_phases": 2,
                                         "first_repeat_reached": 1, "bandwidth_probe_share_of_wall": None}
    assert "10 Mbit/s: 12.19/9.564, 13.0 s" in format_table(summary)


def test_the_estimate_goal_counts_every_repeat(tmp_path: Path) -> None:
    """The table shows the first repeat's phases, the goal's count is over every repeat."""
    cfg = LabConfig(out=tmp_path, policies=parse_policies("moo"), repeats=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    goodput = 1e7 * TCP_PAYLOAD_SHARE
    for repeat, slow_bps in ((0, goodput), (1, 2 * goodput)):
        write_run(tmp_path, "moo", (0.1, 0.5), (1.0, 0.01), [0.5, 0.6, 0.7, 0.8], repeat=repeat)
        estimates = [(101.5, 0.95e9), (201.0, slow_bps)]
        (policy_dir(tmp_path, "moo", repeat) / "estimates.jsonl").write_text("".join(
            json.dumps({"wall": w, "bandwidth_bps": b, "evidence": "look"}) + "\n" for w, b in estimates))
    summary = build_summary(tmp_path)
    assert len(summary.policies["moo"].estimate_tracking) == 2
    track = summary.estimate_tracking
    assert (track["phases"], track["reached"], track["first_repeat_phases"], track["first_repeat_reached"]) \
        == (4, 3, 2, 2)
    assert "3 of 4 phases over every repeat (the first repeat, above: 2 of 2)" in format_table(summary)


def write_config(out: Path, policies: str, paced_budget_s: float | None = None,
                 **settings: object) -> None:
    """config.json as the runner leaves it (with the budget it took from the
    pacesetter, when given)."""
    cfg = LabConfig(out=out, policies=parse_policies(policies), **settings)
    paced = {} if paced_budget_s is None else {"paced_budget_s": paced_budget_s}
    (out / "config.json").write_text(json.dumps(cfg.to_dict() | paced))


def test_a_loss_target_counts_exploring_steps_and_the_free_communication_limit(
        tmp_path: Path) -> None:
    write_config(tmp_path, "dense topk-0.01 moo", workload=WorkloadSpec(name="lm"), target=2.5,
                 paced_budget_s=4.2)  # dense's time
    write_run(tmp_path, "dense", (0.1, 2.0), (1.0, 1.0), [0.2] * 4,
              losses=[3.0, 2.6, 2.5, 2.4], compute_s=0.05)
    write_run(tmp_path, "topk-0.01", (0.1, 0.2), (0.01, 0.01), [0.2] * 4,
              losses=[3.2, 2.9, 2.7, 2.6], compute_s=0.07)
    write_run(tmp_path, "moo", (0.1, 0.3), (1.0, 0.01), [0.2] * 4, losses=[3.0, 2.6, 2.45, 2.42],
              exploring=[False, True, True, False], compute_s=0.06)
    summary = build_summary(tmp_path)
    assert (summary.workload, summary.settings.target_metric) == ("lm", "loss")
    dense, topk, moo = (summary.policies[p] for p in ("dense", "topk-0.01", "moo"))
    assert dense.time_to_target_s == pytest.approx(0.1 + 0.1 + 2.0)  # loss 2.5 <= 2.5
    assert dense.steps_to_target == 3 and topk.time_to_target_s is None
    assert moo.time_to_target_s == pytest.approx(0.1 + 0.1 + 0.3)
    assert (moo.final_loss, moo.explore_steps, dense.explore_steps) == (2.42, 2, 0)
    # dense's 3 steps to the target at the median compute time of a step (0.06 s)
    assert summary.compute_only_s == pytest.approx(3 * 0.06)
    assert summary.comparisons["topk-0.01"].moo_minus_rival_final_loss == pytest.approx(-0.18)
    table = format_table(summary)
    assert "target validation loss 2.5 nats" in table
    # to 2.5, to the tight target (dense's 2.4 + 0.05), at equal time, final loss, vs dense
    assert re.search(r"topk-0\.01 +never +never +2\.600 +2\.600 +\+0\.200 ", table)
    assert re.search(r"moo .* 2/4 ", table)  # exploring steps


def test_exploring_is_the_decisions_flag_or_in_older_records_its_reason() -> None:
    assert is_exploring({"exploring": True, "reason": "measuring 1/3 (network moved)"})
    assert not is_exploring({"exploring": False, "reason": "measuring 2/3 (network moved)"})
    assert is_exploring({"reason": "exploring 1/2 (first exploration)"})
    assert not is_exploring({"reason": "warm-up"})


def test_repeats_give_medians_spreads_and_say_within_noise(tmp_path: Path) -> None:
    write_config(tmp_path, "dense topk-0.01 moo", target=0.9, repeats=3)
    for repeat, (slow_dense, slow_moo) in enumerate([(2.0, 0.3), (2.4, 0.25), (1.0, 0.2)]):
        write_run(tmp_path, "dense", (0.1, slow_dense), (1.0, 1.0), [0.5, 0.8, 0.92, 0.95],
                  repeat=repeat)
        write_run(tmp_path, "moo", (0.1, slow_moo), (1.0, 0.01), [0.5, 0.8, 0.91, 0.93],
                  repeat=repeat)
        reached = [0.4, 0.7, 0.91, 0.92] if repeat == 0 else [0.4, 0.7, 0.85, 0.88]
        write_run(tmp_path, "topk-0.01", (0.1, 0.2), (0.01, 0.01), reached, repeat=repeat)
    summary = build_summary(tmp_path)
    dense, moo, topk = (summary.policies[p] for p in ("dense", "moo", "topk-0.01"))
    assert dense.per_repeat["time_to_target_s"] == pytest.approx([2.2, 2.6, 1.2])
    assert dense.time_to_target_s == pytest.approx(2.2)
    assert dense.spread["time_to_target_s"] == pytest.approx([1.2, 2.6])
    assert moo.time_to_target_s == pytest.approx(0.45)
    # Reached once in three: the median and the upper bound are "never".
    assert topk.per_repeat["time_to_target_s"] == pytest.approx([0.4, None, None])
    assert topk.time_to_target_s is None and topk.spread["time_to_target_s"] == [
        pytest.approx(0.4), None]
    assert len(summary.hindsight_per_repeat) == 3
    # The tight target: dense's median final accuracy (0.95) - 0.3 points.
    assert summary.settings.targets == {"0.9": 0.9, "0.947": pytest.approx(0.947)}
    assert dense.time_to_targets_s["0.947"] == pytest.approx(0.2 + 2 * 2.0)  # median of 3
    assert moo.time_to_targets_s["0.947"] is None
    verdicts = summary.verdicts
    assert [v.split(":")[0] + v.split(":")[1] for v in verdicts] == [
        "moo vs dense time to target 0.9", "moo vs dense time to target 0.947",
        "moo vs topk-0.01 time to target 0.9", "moo vs topk-0.01 time to target 0.947"]
    assert "within noise" not in verdicts[0]  # dense [1.2, 2.6] against moo [0.4, 0.5]
    assert "4.89x (moo sooner)" in verdicts[0] and "[1.2-2.6 s]" in verdicts[0]
    assert verdicts[1].startswith("moo vs dense: time to target 0.947: moo never reached it")
    assert verdicts[2] == ("moo vs topk-0.01: time to target 0.9: topk-0.01 never reached it: "
                           "within noise (moo 0.5 s [0.4-0.5 s], topk-0.01 never [0.4-never])")
    assert verdicts[3].startswith("moo vs topk-0.01: time to target 0.947: neither reached it")
    assert "medians of 3 repeats" in format_table(summary)


def test_equal_time_is_the_budget_the_runner_gave_not_a_failed_pacesetters(tmp_path: Path) -> None:
    """The pacesetter failed part-way in repeat 0 (its steps are on file); the
    runner took the budget from repeat 1 and wrote it to config.json."""
    write_config(tmp_path, "dense moo", target=0.9, repeats=2, paced_budget_s=0.3)
    for repeat in range(2):
        dense_slow_s = 0.05 if repeat == 0 else 0.1  # repeat 0 ended at 0.2 s, repeat 1 at 0.3 s
        write_run(tmp_path, "dense", (0.05, dense_slow_s), (1.0, 1.0), [0.5, 0.8, 0.92, 0.95],
                  repeat=repeat)
        write_run(tmp_path, "moo", (0.1, 0.1), (1.0, 0.01), [0.5, 0.6, 0.7, 0.8], repeat=repeat)
    (policy_dir(tmp_path, "dense", 0) / FAILED).write_text("rank 1 exited with code -9")
    summary = build_summary(tmp_path)
    assert summary.settings.equal_time_s == 0.3  # not the failed repeat 0's 0.2 s
    assert summary.policies["moo"].at_equal_time["accuracy"] == 0.7  # its eval at t=0.3
    write_config(tmp_path, "dense moo", target=0.9, repeats=2)  # no pacesetter run finished
    assert build_summary(tmp_path).settings.equal_time_s is None


def test_the_summary_round_trips_through_json_and_keeps_policies_apart(tmp_path: Path) -> None:
    write_config(tmp_path, "dense topk-0.01 moo", target=0.9, repeats=2, schedule_text=(
        '[[step]]\nduration = "10s"\nrate = "1Gbit"\n\n[[step]]\nduration = "10s"\n'
        'rate = "10Mbit"\n'))  # the rates of LINKS, keyed by time: a headroom to model
    for repeat in range(2):
        write_run(tmp_path, "dense", (0.1, 2.0), (1.0, 1.0), [0.5, 0.8, 0.92, 0.95], repeat=repeat)
        write_run(tmp_path, "topk-0.01", (0.3, 0.2), (0.01, 0.01), [0.4, 0.7, 0.85, 0.91],
                  repeat=repeat)
        write_run(tmp_path, "moo", (0.12, 0.25), (1.0, 0.01), [0.5, 0.8, 0.91, 0.945],
                  repeat=repeat)
    summary = build_summary(tmp_path)
    assert summary.headroom["0.9"].ratio is not None and summary.headroom["0.9"].per_phase
    assert from_json(to_json(summary)) == summary
    # A policy named like every field of the lab stays under "policies" and
    # shadows none of them.
    lab_fields = [f.name for f in dataclasses.fields(LabSummary)]
    named_like_fields = {name: summary.policies["moo"] for name in lab_fields}
    clashing = dataclasses.replace(summary, policies=named_like_fields, compute_only_s=math.inf)
    data = json.loads(to_json(clashing))
    assert list(data) == lab_fields and list(data["policies"]) == lab_fields
    assert (data["workload"], data["verdicts"]) == (summary.workload, list(summary.verdicts))
    assert data["compute_only_s"] is None  # strict JSON: no Infinity
    assert from_json(to_json(clashing)).policies == named_like_fields


def test_a_policy_that_never_got_a_decision_is_flagged(tmp_path: Path) -> None:
    cfg = LabConfig(out=tmp_path, policies=parse_policies("moo"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    write_run(tmp_path, "moo", (0.1, 0.1), (1.0, 1.0), [0.5, 0.6, 0.7, 0.8], version=0)
    summary = build_summary(tmp_path)
    assert "never adopted a decision" in summary.policies["moo"].warnings[0]
    assert "WARNING: moo: rank 0 never adopted" in format_table(summary)


def assert_stopped_at_the_first_look_past(steps: list[dict], budget_s: float) -> None:
    """Training stopped at the first step that ended past `budget_s`, or, where
    that step ran more than fourfold slower than the ones before it, at the next
    look (the stop rule reads the clock every few steps, spaced by the recent step
    time: beside two CPU hogs one 5 ms step took 62 ms, and one more step ran)."""
    ends = [s["t"] for s in steps]
    assert ends[-1] >= budget_s
    first = next(i for i, t in enumerate(ends) if t >= budget_s)
    if first == len(ends) - 1:
        return
    took = [b - a for a, b in zip([0.0, *ends], ends, strict=False)]
    # Some run of steps up to that one, as a look spaces them, slowed more than
    # fourfold against the pace before it.
    assert any(statistics.mean(took[first + 1 - k:first + 1]) > 4 * statistics.median(took[:first + 1 - k])
               for k in range(1, min(STOP_LOOK_INTERVAL, first) + 1)), (budget_s, ends)
    assert len(ends) - 1 - first <= STOP_LOOK_INTERVAL


@pytest.mark.slow
def test_loopback_lab_says_unshaped_and_reports_at_equal_time(tmp_path: Path) -> None:
    """The default schedule is time-keyed: dense trains its 12 steps first and
    every other policy (here PyTorch's post-local SGD) trains for dense's time."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "flexcomm.cli", "lab", "run", "--out", str(out), "--loopback",
         "--nodes", "2", "--policies", "localsgd dense", "--steps", "12", "--eval-every", "4",
         "--decisions", "inprocess"],
        capture_output=True, text=True, timeout=scaled(200))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NOT shaped" in proc.stderr.splitlines()[0]  # said up front
    assert "every other policy trains" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    lab, dense, local = (summary["settings"], summary["policies"]["dense"],
                         summary["policies"]["localsgd"])
    assert lab["shaped"] is False and lab["equal_time"] and lab["pacesetter"] == "dense"
    # the time the runner gave the others: dense's end record, at or after its last step
    budget_s = json.loads((out / "config.json").read_text())["paced_budget_s"]
    assert dense["steps"] == 12 and lab["equal_time_s"] == budget_s >= dense["wall_s"]
    # localsgd stopped at the first step that ended past dense's time
    steps = [json.loads(line) for line in (policy_dir(out, "localsgd") / "records.jsonl")
             .read_text().splitlines() if '"kind": "step"' in line]
    assert_stopped_at_the_first_look_past(steps, lab["equal_time_s"])
    assert local["at_equal_time"]["accuracy"] is not None
    # post-local SGD: global AllReduce for 10 steps, then local steps and a
    # parameter average every 4th
    assert [s["collective"] for s in steps[9:15]] == [
        "dense_ring", "model_average", "local", "local", "local", "model_average"][:len(steps[9:15])]
    assert dense["phases"][0]["rate_bps"] is None
    assert set(dense["time_to_targets_s"]) == set(lab["targets"]) and len(lab["targets"]) == 2
    assert (out / "quality.png").stat().st_size > 0


def rank_pids(train_json: Path, rank: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(train_json).encode() in argv and argv[-2:] == [str(rank).encode(), b""]:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_a_rank_that_dies_fails_its_policy_and_the_others_still_run(tmp_path: Path) -> None:
    import os
    import signal

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexcomm.cli", "lab", "run", "--out", str(out), "--loopback",
         "--nodes", "2", "--policies", "dense topk-0.1", "--steps", "400",
         "--decisions", "inprocess"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = policy_dir(out, "dense") / "records.jsonl"
    try:
        def trained() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return records.exists() and '"kind": "step"' in records.read_text()

        wait_for(trained, 120, "a training step", interval_s=0.1)
        for pid in rank_pids(policy_dir(out, "dense") / "train.json", 1):
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=scaled(200))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert "rank 1 exited with code" in summary["failed"]["dense"]
    # The next policy ran to the end; without the pacesetter's time, its steps
    assert summary["policies"]["topk-0.1"]["steps"] == 400
    assert "FAILED: dense: rank 1 exited" in stdout
    assert "dense failed" in stderr
