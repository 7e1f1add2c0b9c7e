"""The lab's report, read back from a run directory alone (so it can be rebuilt).

`summary.json` holds, under each policy's name: time_to_target_s (training
seconds until the held-out figure first reached the target: a test accuracy, or
for lm a validation loss; null if never), steps_to_target, final_accuracy (for
lm next-byte accuracy), final_loss (held-out, nats), bytes_sent (payload rank 0
contributed, summed over steps), wall_s (training seconds in all), steps,
explore_steps (steps run under a decision that was exploring) and compute_s (the
median compute time of a step, measured without communication). With repeats
each figure is the median over the repeats; `per_repeat` lists every repeat's
and `spread` its [min, max] (a time that never reached the target counts as
slower than any; a median or bound that is such a time is null). `phases` is
the first repeat's, per phase of the schedule: the steps, seconds, mean step
time, the CR and collective run most, and the mean predicted vs measured sync
time.

Per policy also: time_to_targets_s (target -> training seconds, or null; one
entry per target of the run: a number given, or the tight target's value),
steps_to_targets, and at_equal_time (held-out loss and accuracy of the last
evaluation by the equal time, lab.equal_time_s: the budget, or the
pacesetter's time, or for an equal-steps run dense's median), each with
per_repeat and spread like the figures above.

At the top level also: headroom (per target, the modelled time of the best
fixed choice over that of the best choice per phase, with its spread over
repeats and the choice per phase; see flexcomm.lab.envelope) and
envelope_distance (MOO's distance from the envelope of the fixed choices,
worst and median after the first 10% of its run, per repeat and as medians).

At the top level: workload, schedule, hindsight_best_fixed_s (for each phase the
fixed choice, among the fixed policies run, that was fastest there, added up;
the median over repeats; null in an equal-time run, where the headroom says
it), compute_only_s (dense's steps to the target times the
median compute time of a step: the time to the target if communication were
free, which no policy can beat), and under "lab" the run's settings, the
comparisons of MOO with every other policy, and the verdict lines.

Times are rank 0's training clock (evaluation and waits for the schedule
excluded), so runs compare step for step. `summary.txt` is the table printed
at the end of a run, its first line the headroom; the PNGs are network.png
(link rate and the chosen CR and collective over time), quality.png (the
held-out figure against training time, with the envelope of the fixed choices
and the targets), and step_time.png.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexcomm.emulation.schedule import parse_schedule
from flexcomm.lab import envelope, estimate_tracking
from flexcomm.lab.plan import FAILED, TIGHT, TIGHT_MARGIN, parse_policy, policy_dir
from flexcomm.policy import POLICY_NAMES
from flexcomm.units import format_bytes, format_rate

ADAPTIVE = "moo"  # the policy every other is compared with
# Figures given per repeat and as a median; for those in SLOWER_WHEN_MISSING a
# missing value (never reached the target) is worse than any.
FIGURES = ("time_to_target_s", "steps_to_target", "final_accuracy", "final_loss", "wall_s",
           "bytes_sent", "steps", "explore_steps", "compute_s")
SLOWER_WHEN_MISSING = ("time_to_target_s", "steps_to_target")
EQUAL_TIME_SLACK = 0.05  # a budgeted run overshoots its budget by its last step


@dataclass
class PolicyRun:
    label: str
    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    links: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    failed: str = ""  # why the run failed, when it did
    repeat: int = 0
    start: dict[str, Any] = field(default_factory=dict)  # rank 0's start record

    @property
    def fixed(self) -> bool:
        return parse_policy(self.label).fixed

    def phase_of(self, step: dict[str, Any]) -> int:
        """Index into `links` of the link state in force when `step` began (-1: none)."""
        starts = [link["applied_at"] for link in self.links]
        return bisect.bisect_right(starts, step.get("wall", 0.0) + 1e-3) - 1


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_runs(out: Path) -> list[PolicyRun]:
    """Every run of the lab in `out`, in the order they ran."""
    config = json.loads((out / "config.json").read_text())
    runs = []
    for repeat in range(config.get("repeats", 1)):
        for label in config["policies"]:
            pdir = policy_dir(out, label, repeat)
            records = read_jsonl(pdir / "records.jsonl")
            runs.append(PolicyRun(
                label,
                [r for r in records if r["kind"] == "step"],
                [r for r in records if r["kind"] == "eval"],
                read_jsonl(pdir / "links.jsonl"),
                [r["message"] for r in records if r["kind"] == "warning"],
                (pdir / FAILED).read_text() if (pdir / FAILED).exists() else "",
                repeat,
                next((r for r in records if r["kind"] == "start"), {}),
            ))
    return runs


def is_exploring(step: dict[str, Any]) -> bool:
    """Whether `step` ran under a decision that was exploring (the decision's
    flag; records written before it existed said so in the reason)."""
    if "exploring" in step:
        return bool(step["exploring"])
    return str(step.get("reason", "")).startswith("exploring")


def phase_key(run: PolicyRun, index: int) -> tuple[int, int] | None:
    """A phase is one applied schedule step (step index, round)."""
    if index < 0 or not run.links:
        return None
    link = run.links[index]
    return (link["step_index"], link["round"])


def phases(run: PolicyRun) -> dict[Any, dict[str, Any]]:
    grouped: dict[Any, list[dict[str, Any]]] = {}
    rates: dict[Any, float | None] = {}
    for step in run.steps:
        index = run.phase_of(step)
        key = phase_key(run, index)
        grouped.setdefault(key, []).append(step)
        rates[key] = run.links[index]["rate_bps"] if key is not None else None
    out = {}
    for key, steps in grouped.items():
        seconds = sum(s["step_s"] for s in steps)
        choice = Counter((s.get("compression"), s.get("collective")) for s in steps).most_common(1)[0][0]
        predicted = [s["predicted_sync_s"] for s in steps if s.get("predicted_sync_s")]
        measured = [s["t_sync_s"] for s in steps if "t_sync_s" in s]
        out[key] = {
            "phase": None if key is None else list(key),
            "rate_bps": rates[key],
            "steps": len(steps),
            "seconds": seconds,
            "mean_step_s": seconds / len(steps),
            "compression": choice[0],
            "collective": choice[1],
            "predicted_sync_s": statistics.fmean(predicted) if predicted else None,
            "measured_sync_s": statistics.fmean(measured) if measured else None,
        }
    return out


def check_run(run: PolicyRun) -> list[str]:
    """Problems the numbers alone would hide."""
    problems = list(run.warnings)
    uses_hook = parse_policy(run.label).kind in POLICY_NAMES
    if uses_hook and run.steps and max(s.get("version", 0) for s in run.steps) == 0:
        problems.append("rank 0 never adopted a decision from its source (agent refused or "
                        "silent?): every step ran the hook's dense default")
    return problems


def reached(value: float, target: float, metric: str) -> bool:
    """Whether a held-out `metric` value meets the target (a loss from above)."""
    return value <= target if metric == "loss" else value >= target


def first_hit(run: PolicyRun, target: float, metric: str) -> dict[str, Any]:
    """The first evaluation whose held-out `metric` reached `target` ({}: none)."""
    return next((e for e in run.evals if reached(e[metric], target, metric)), {})


def at_time(run: PolicyRun, seconds: float | None) -> dict[str, float | None]:
    """The held-out loss and accuracy of the last evaluation by `seconds` of
    training (with EQUAL_TIME_SLACK, as a budgeted run ends after the step that
    crosses it)."""
    if seconds is None:
        return {"loss": None, "accuracy": None}
    by = [e for e in run.evals if e["t"] <= seconds * (1 + EQUAL_TIME_SLACK)]
    last = by[-1] if by else {}
    return {"loss": last.get("loss"), "accuracy": last.get("accuracy")}


def summarize_run(run: PolicyRun, target: float, metric: str = "accuracy",
                  targets: dict[str, float] | None = None,
                  equal_time_s: float | None = None) -> dict[str, Any]:
    """One run's figures: to `target` (the workload's), to each of `targets`
    (by name), and the quality at `equal_time_s`."""
    hit = next((e for e in run.evals if reached(e[metric], target, metric)), None)
    last = run.evals[-1] if run.evals else {}
    return {
        "time_to_target_s": hit["t"] if hit else None,
        "time_to_targets_s": {name: first_hit(run, value, metric).get("t")
                              for name, value in (targets or {}).items()},
        "steps_to_targets": {name: first_hit(run, value, metric).get("step")
                             for name, value in (targets or {}).items()},
        "at_equal_time": at_time(run, equal_time_s),
        "steps_to_target": hit["step"] if hit else None,
        "final_accuracy": last.get("accuracy"),
        "final_loss": last.get("loss"),
        "bytes_sent": int(sum(s.get("bytes_sent", 0) for s in run.steps)),
        "wall_s": run.steps[-1]["t"] if run.steps else None,
        "steps": len(run.steps),
        "explore_steps": sum(is_exploring(s) for s in run.steps),
        "compute_s": run.start.get("compute_s"),
        "fixed": run.fixed,
        "phases": list(phases(run).values()),
        "warnings": check_run(run),
    }


def median_and_spread(values: list[Any], slower_when_missing: bool
                      ) -> tuple[Any, list[Any]]:
    """(median, [min, max]) of `values`; a missing value is skipped, or with
    `slower_when_missing` counts as +infinity (a median or bound that is
    infinite comes back None)."""
    if slower_when_missing:
        known = sorted(math.inf if v is None else v for v in values)
    else:
        known = sorted(v for v in values if v is not None)
    if not known:
        return None, [None, None]
    finite = [None if math.isinf(v) else v for v in (statistics.median(known), known[0], known[-1])]
    return finite[0], finite[1:]


def summarize_policy(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One policy's figures over its repeats (each a summarize_run dict)."""
    summary: dict[str, Any] = {"per_repeat": {}, "spread": {}}
    for name in FIGURES:
        values = [r[name] for r in repeats]
        summary[name], summary["spread"][name] = median_and_spread(
            values, name in SLOWER_WHEN_MISSING)
        summary["per_repeat"][name] = values
    for name in ("time_to_targets_s", "at_equal_time"):
        summary[name], summary["spread"][name], summary["per_repeat"][name] = {}, {}, {}
        for key in repeats[0][name]:
            values = [r[name][key] for r in repeats]
            summary[name][key], summary["spread"][name][key] = median_and_spread(
                values, name == "time_to_targets_s")
            summary["per_repeat"][name][key] = values
    summary["fixed"] = repeats[0]["fixed"]
    summary["phases"] = repeats[0]["phases"]
    many = len(repeats) > 1
    summary["warnings"] = [f"repeat {i}: {w}" if many else w
                           for i, r in enumerate(repeats) for w in r["warnings"]]
    return summary


def hindsight(runs: list[PolicyRun], per_run: dict[str, dict[str, Any]]
              ) -> tuple[float | None, list[dict[str, Any]]]:
    """Per phase, the fixed policy with the lowest mean step time there, times the
    phase's steps (the median over all runs: the same for epoch-keyed schedules);
    added up over the phases. `runs` are one repeat's, `per_run` their summaries
    by label."""
    fixed = [r.label for r in runs if r.fixed and per_run[r.label]["steps"] and not r.failed]
    if not fixed:
        return None, []
    keys: dict[Any, list[int]] = {}
    for run in runs:
        for ph in per_run[run.label]["phases"]:
            keys.setdefault(_key(ph), []).append(ph["steps"])
    total, choices = 0.0, []
    for key, counts in keys.items():
        options = []
        for label in fixed:
            ph = next((p for p in per_run[label]["phases"] if _key(p) == key), None)
            if ph is not None:
                options.append((ph["mean_step_s"], label))
        if not options:
            return None, []
        best_s, best = min(options)
        steps = statistics.median(counts)
        total += best_s * steps
        choices.append({"phase": None if key is None else list(key), "policy": best,
                        "steps": steps, "seconds": best_s * steps})
    return total, choices


def _key(phase: dict[str, Any]) -> tuple[int, int] | None:
    return None if phase["phase"] is None else tuple(phase["phase"])


def compute_only(per_policy: dict[str, dict[str, Any]]) -> float | None:
    """Dense's steps to the target times the median compute time of a step over
    every run: the time to the target with free communication."""
    dense = per_policy.get("dense")
    times = [t for s in per_policy.values() for t in s["per_repeat"]["compute_s"] if t is not None]
    if not dense or dense["steps_to_target"] is None or not times:
        return None
    return dense["steps_to_target"] * statistics.median(times)


def comparisons(summary: dict[str, dict[str, Any]], best_fixed_s: float | None) -> dict[str, Any]:
    """MOO against every other policy (time to target as rival over MOO; final
    accuracy in points and final loss in nats as MOO minus rival), and MOO's
    wall time over the hindsight best fixed choice. Medians over repeats."""
    out: dict[str, Any] = {}
    moo = summary.get(ADAPTIVE)
    if not moo:
        return out
    for label, rival in summary.items():
        if label == ADAPTIVE:
            continue
        out[f"{label}_over_moo_time_to_target"] = _ratio(rival["time_to_target_s"],
                                                         moo["time_to_target_s"])
        out[f"moo_minus_{label}_final_accuracy_points"] = _diff(
            moo["final_accuracy"], rival["final_accuracy"], 100.0)
        out[f"moo_minus_{label}_final_loss"] = _diff(moo["final_loss"], rival["final_loss"])
    if best_fixed_s:
        out["moo_over_hindsight_best_fixed"] = _ratio(moo["wall_s"], best_fixed_s)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _diff(a: float | None, b: float | None, scale: float = 1.0) -> float | None:
    return None if a is None or b is None else scale * (a - b)


def overlap(a: list[Any], b: list[Any]) -> bool:
    """Whether two [min, max] spreads overlap (a None bound is +infinity)."""
    lo_a, hi_a = a[0], math.inf if a[1] is None else a[1]
    lo_b, hi_b = b[0], math.inf if b[1] is None else b[1]
    if lo_a is None or lo_b is None:
        return lo_a is None and lo_b is None  # both never reached it
    return lo_a <= hi_b and lo_b <= hi_a


def verdicts(summary: dict[str, dict[str, Any]], repeats: int) -> list[str]:
    """One line per rival and target: MOO's time to the target against it,
    "within noise" where the spreads over the repeats overlap."""
    moo = summary.get(ADAPTIVE)
    if not moo:
        return []
    lines = []
    for label, rival in summary.items():
        if label == ADAPTIVE:
            continue
        for target in moo["time_to_targets_s"]:
            mine, theirs = moo["time_to_targets_s"][target], rival["time_to_targets_s"][target]
            ratio = _ratio(theirs, mine)
            if ratio is None:
                figure = ("neither reached it" if mine is None and theirs is None
                          else "moo never reached it" if mine is None
                          else f"{label} never reached it")
            else:
                figure = f"{ratio:.2f}x ({'moo sooner' if ratio > 1 else 'moo later'})"
            noise = ""
            if repeats > 1 and overlap(moo["spread"]["time_to_targets_s"][target],
                                       rival["spread"]["time_to_targets_s"][target]):
                noise = ": within noise"
            lines.append(f"moo vs {label}: time to target {target}: {figure}{noise} "
                         f"(moo {_target_time(moo, target, repeats)}, "
                         f"{label} {_target_time(rival, target, repeats)})")
    return lines


def _target_time(s: dict[str, Any], target: str, repeats: int) -> str:
    text = _seconds(s["time_to_targets_s"][target])
    if repeats > 1:
        lo, hi = s["spread"]["time_to_targets_s"][target]
        text += f" [{_seconds(lo).removesuffix(' s')}-{_seconds(hi)}]"
    return text


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _with_spread(s: dict[str, Any], name: str, repeats: int) -> str:
    text = _seconds(s[name])
    if repeats > 1:
        lo, hi = s["spread"][name]
        text += f" [{_seconds(lo).removesuffix(' s')}-{_seconds(hi)}]"
    return text


def resolve_targets(config: dict[str, Any], runs: list[PolicyRun]) -> dict[str, float]:
    """Each target of the run by name ("0.95", or for `tight` the value it
    stands for, e.g. "2.318") -> its value; `tight` is left out when dense has
    no evaluation to measure it from."""
    metric = config.get("target_metric", "accuracy")
    target = config.get("target", config.get("target_accuracy"))  # the latter: older runs
    out: dict[str, float] = {}
    for text in config.get("targets") or [f"{target:g}"]:
        if text != TIGHT:
            out[text] = float(text)
            continue
        finals = [r.evals[-1][metric] for r in runs if r.label == "dense" and r.evals]
        if finals:
            value = statistics.median(finals) + TIGHT_MARGIN[metric]
            out[f"{value:.4g}"] = value
    return out


def equal_time(config: dict[str, Any], runs: list[PolicyRun]) -> float | None:
    """The seconds every policy is read at: the budget, else the pacesetter's
    first run's training time, else (an equal-steps run) dense's median."""
    if config.get("budget_s"):
        return float(config["budget_s"])
    pacer = config.get("pacesetter") or "dense"
    times = [r.steps[-1]["t"] for r in runs if r.label == pacer and r.steps]
    if not times:
        return None
    return times[0] if config.get("pacesetter") else statistics.median(times)


def build_summary(out: Path) -> dict[str, Any]:
    config = json.loads((out / "config.json").read_text())
    cluster = json.loads((out / "cluster.json").read_text()) if (out / "cluster.json").exists() else {}
    runs = load_runs(out)
    repeats = config.get("repeats", 1)
    target = config.get("target", config.get("target_accuracy"))  # the latter: older runs
    metric = config.get("target_metric", "accuracy")
    targets = resolve_targets(config, runs)
    equal_s = equal_time(config, runs)
    per_run = [summarize_run(run, target, metric, targets, equal_s) for run in runs]
    per_policy = {label: summarize_policy([s for run, s in zip(runs, per_run, strict=True)
                                           if run.label == label])
                  for label in config["policies"]}
    totals, choices, rooms, gaps = [], [], [], []
    schedule = parse_schedule(config["schedule_text"], config["schedule_name"])
    for repeat in range(repeats):
        these = [(run, s) for run, s in zip(runs, per_run, strict=True) if run.repeat == repeat]
        total, chosen = hindsight([r for r, _ in these], {r.label: s for r, s in these})
        totals.append(total)
        choices = choices or chosen
        fixed = {r.label: s for r, s in these if r.fixed and not r.failed}
        rooms.append({t: envelope.headroom(schedule, fixed, t) for t in targets})
        gaps.append(_moo_gap([r for r, _ in these], metric))
    best_fixed_s, _ = median_and_spread(totals, slower_when_missing=False)
    if config.get("equal_time"):  # a sum of step times over the same steps: the headroom instead
        best_fixed_s = None
    for run in runs:
        if run.repeat == 0:  # as the plots: the estimate of each policy's first repeat
            per_policy[run.label]["estimate_tracking"] = estimate_tracking.summarize(out, run)
    summary: dict[str, Any] = dict(per_policy)
    summary["workload"] = config["workload"]["name"]
    summary["schedule"] = config["schedule_name"]
    summary["hindsight_best_fixed_s"] = best_fixed_s
    summary["compute_only_s"] = compute_only(per_policy)
    summary["headroom"] = _headroom(rooms, targets)
    summary["envelope_distance"] = {
        "unit": "nats" if metric == "loss" else "accuracy points",
        "per_repeat": gaps,
        "worst": median_and_spread([g["worst"] for g in gaps], False)[0],
        "median": median_and_spread([g["median"] for g in gaps], False)[0]}
    summary["lab"] = {
        "target": target,
        "target_metric": metric,
        "targets": targets,
        "equal_time": config.get("equal_time", False),
        "equal_time_s": equal_s,
        "budget_s": config.get("budget_s"),
        "pacesetter": config.get("pacesetter"),
        "nodes": config["nodes"],
        "steps": config["steps"],
        "repeats": repeats,
        "shaped": cluster.get("shaped"),
        "reason_unshaped": cluster.get("reason_unshaped", ""),
        "decisions": config["decisions"],
        "hindsight_per_repeat": totals,
        "hindsight_choices": choices,
        "failed": {_run_name(run, repeats): run.failed for run in runs if run.failed},
        "comparisons": comparisons(per_policy, best_fixed_s),
        "estimate_tracking": estimate_tracking.summary_of(
            {label: s["estimate_tracking"] for label, s in per_policy.items()},
            estimate_tracking.probe_share(out, runs)),
        "verdicts": verdicts(per_policy, repeats),
    }
    return summary


def _moo_gap(runs: list[PolicyRun], metric: str) -> dict[str, float | None]:
    """MOO's distance from the envelope of one repeat's fixed runs."""
    moo = next((r for r in runs if r.label == ADAPTIVE and not r.failed), None)
    env = envelope.envelope([r.evals for r in runs if r.fixed and not r.failed], metric)
    return envelope.distance(moo.evals if moo else [], env, metric)


def _headroom(rooms: list[dict[str, dict[str, Any]]], targets: dict[str, float]
              ) -> dict[str, Any]:
    """Per target: the median headroom ratio over repeats, its [min, max], and
    the first repeat's details."""
    out = {}
    for t in targets:
        ratio, spread = median_and_spread([r[t]["ratio"] for r in rooms], False)
        out[t] = {**rooms[0][t], "ratio": ratio, "spread": spread}
    return out


def headroom_line(summary: dict[str, Any]) -> str:
    """The summary's first line: what adapting per phase could win here."""
    parts = []
    for target, room in summary.get("headroom", {}).items():
        if room["ratio"] is None:
            parts.append(f"to {target}: n/a ({room.get('why', 'no ratio')})")
        else:
            parts.append(f"to {target}: {room['ratio']:.2f}x (best fixed {room['best_fixed']} "
                         f"{room['best_fixed_s']:.1f} s, best per phase "
                         f"{room['hindsight_per_phase_s']:.1f} s)")
    words = "; ".join(parts) or "n/a"
    small = [t for t, r in summary.get("headroom", {}).items()
             if r["ratio"] is not None and r["ratio"] < HEADROOM_WORTH]
    note = (" -- little for adaptation to win here" if small
            and len(small) == len(summary["headroom"]) else "")
    return f"headroom (best fixed choice / best choice per phase, modelled): {words}{note}"


def _run_name(run: PolicyRun, repeats: int) -> str:
    return run.label if repeats == 1 else f"{run.label}@{run.repeat}"


TOP_LEVEL = ("lab", "workload", "schedule", "hindsight_best_fixed_s", "compute_only_s",
             "headroom", "envelope_distance")
HEADROOM_WORTH = 1.1  # below this on every target, the first line says there is little to win


def policies(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(k, v) for k, v in summary.items() if k not in TOP_LEVEL]


def format_table(summary: dict[str, Any]) -> str:
    lab = summary["lab"]
    repeats = lab.get("repeats", 1)
    dense = summary.get("dense")
    targets = list(lab.get("targets", {}))
    equal_s = lab.get("equal_time_s")
    metric = lab.get("target_metric", "accuracy")
    rows = [("policy", *(f"to {t}" for t in targets),
             "at " + ("-" if equal_s is None else f"{equal_s:.0f} s"), "final loss", "vs dense",
             "final acc", "sent", "train time", "steps", "exploring", "vs best fixed")]
    best = summary.get("hindsight_best_fixed_s")
    for label, s in policies(summary):
        rows.append((
            label,
            *(_target_time(s, t, repeats) for t in targets),
            _figure(s.get("at_equal_time", {}).get(metric), metric),
            "-" if s["final_loss"] is None else f"{s['final_loss']:.3f}",
            "-" if not dense or dense["final_loss"] is None or s["final_loss"] is None
            else f"{s['final_loss'] - dense['final_loss']:+.3f}",
            "-" if s["final_accuracy"] is None else f"{100 * s['final_accuracy']:.1f}%",
            format_bytes(s["bytes_sent"]),
            "-" if s["wall_s"] is None else f"{s['wall_s']:.1f} s",
            str(s["steps"]),
            f"{s['explore_steps']}/{s['steps']}" if s["steps"] else "-",
            "-" if not best or s["wall_s"] is None else f"{s['wall_s'] / best:.2f}x",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = [headroom_line(summary)]
    gap = summary.get("envelope_distance", {})
    if gap.get("worst") is not None:
        head.append(f"moo's distance from the envelope of the fixed choices (after the first "
                    f"10%): worst {gap['worst']:+.3f}, median {gap['median']:+.3f} "
                    f"{gap['unit']} (positive: worse)")
    lines = [*head, "", *lines]
    lines.append("")
    lines.append(f"{summary.get('workload', '')} under schedule {summary.get('schedule', '')}; "
                 f"{_target_text(lab)}; "
                 + (f"medians of {repeats} repeats [min-max]; " if repeats > 1 else "")
                 + "best fixed choice per phase in hindsight: "
                 + (f"{best:.1f} s" if best else "n/a")
                 + "; dense's steps to the target with free communication: "
                 + ("n/a" if summary.get("compute_only_s") is None
                    else f"{summary['compute_only_s']:.1f} s"))
    lines.extend(_phase_lines(summary))
    lines.extend(estimate_tracking.table_lines(summary))
    lines.append("")
    lines.extend(lab.get("verdicts", []))
    hindsight_ratio = lab["comparisons"].get("moo_over_hindsight_best_fixed")
    if hindsight_ratio is not None:
        lines.append(f"moo's train time over the best fixed choice per phase: {hindsight_ratio:.2f}x")
    for label, s in policies(summary):
        lines.extend(f"WARNING: {label}: {w}" for w in s["warnings"])
    for label, why in lab.get("failed", {}).items():
        lines.append(f"FAILED: {label}: {why.strip().splitlines()[0]}")
    if not lab.get("shaped"):
        lines.append(f"NOTE: links were not shaped ({lab.get('reason_unshaped') or 'loopback'})")
    return "\n".join(lines)


def _figure(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if metric == "loss" else f"{100 * value:.1f}%"


def _target_text(lab: dict[str, Any]) -> str:
    names = ", ".join(lab.get("targets") or [f"{lab['target']:g}"])
    time = ("equal time: " + ("-" if lab.get("equal_time_s") is None
                              else f"{lab['equal_time_s']:.1f} s")
            + (" (the budget)" if lab.get("budget_s") else
               f" ({lab.get('pacesetter')}'s time for {lab['steps']} steps)")
            if lab.get("equal_time") else f"equal steps ({lab['steps']})")
    if lab["target_metric"] == "loss":
        return f"target validation loss {lab['target']:g} nats (targets {names}); {time}"
    return f"target accuracy {100 * lab['target']:.0f}% (targets {names}); {time}"


def _phase_lines(summary: dict[str, Any]) -> list[str]:
    lines = ["", "per phase: steps, mean step time, CR @ collective run most, "
                 "predicted/measured sync"]
    for label, s in policies(summary):
        parts = []
        for ph in s["phases"]:
            rate = "unshaped" if ph["rate_bps"] is None else format_rate(ph["rate_bps"])
            sync = ""
            if ph["predicted_sync_s"] and ph["measured_sync_s"] is not None:
                sync = f" {1000 * ph['predicted_sync_s']:.0f}/{1000 * ph['measured_sync_s']:.0f} ms"
            parts.append(f"{rate}: {ph['steps']}x{1000 * ph['mean_step_s']:.0f} ms "
                         f"{_choice(ph)}{sync}")
        lines.append(f"  {label}: " + " | ".join(parts))
    return lines


def _choice(phase: dict[str, Any]) -> str:
    compression, collective = phase["compression"], phase["collective"]
    return str(collective) if compression is None else f"{compression}@{collective}"


def write_report(out: Path) -> dict[str, Any]:
    """Write summary.json, summary.txt and the plots; return the summary."""
    out = Path(out)
    summary = build_summary(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.txt").write_text(format_table(summary) + "\n")
    from flexcomm.lab.plots import write_plots

    write_plots(out, load_runs(out), summary)
    return summary
