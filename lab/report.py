"""The lab's report, read back from a run directory alone (so it can be rebuilt).

`summary.json` holds, under each policy's name: time_to_target_s (training
seconds until the test accuracy first reached the target; null if never),
final_accuracy, bytes_sent (payload rank 0 contributed, summed over steps),
wall_s (training seconds in all), steps, and per phase of the schedule the
steps, seconds, mean step time, the CR and collective run most, and the mean
predicted vs measured sync time. At the top level: hindsight_best_fixed_s (for
each phase the fixed choice, among the fixed policies run, that was fastest
there, added up), and under "lab" the run's settings and the comparisons the
README quotes (MOO against dense, the best fixed choice, and PowerSGD).

Times are rank 0's training clock (evaluation and waits for the schedule
excluded), so runs compare step for step. `summary.txt` is the table printed
at the end of a run; the PNGs are network.png (link rate and the chosen CR and
collective over time), accuracy.png and step_time.png.
"""

from __future__ import annotations

import bisect
import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexcomm.lab.plan import parse_policy
from flexcomm.policy import POLICY_NAMES
from flexcomm.units import format_bytes, format_rate


@dataclass
class PolicyRun:
    label: str
    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    links: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    failed: str = ""  # why the run failed, when it did

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
    from flexcomm.lab.runner import FAILED, policy_dir

    config = json.loads((out / "config.json").read_text())
    runs = []
    for label in config["policies"]:
        pdir = policy_dir(out, label)
        records = read_jsonl(pdir / "records.jsonl")
        runs.append(PolicyRun(
            label,
            [r for r in records if r["kind"] == "step"],
            [r for r in records if r["kind"] == "eval"],
            read_jsonl(pdir / "links.jsonl"),
            [r["message"] for r in records if r["kind"] == "warning"],
            (pdir / FAILED).read_text() if (pdir / FAILED).exists() else "",
        ))
    return runs


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


def summarize_run(run: PolicyRun, target: float) -> dict[str, Any]:
    reached = next((e for e in run.evals if e["accuracy"] >= target), None)
    return {
        "time_to_target_s": reached["t"] if reached else None,
        "steps_to_target": reached["step"] if reached else None,
        "final_accuracy": run.evals[-1]["accuracy"] if run.evals else None,
        "bytes_sent": int(sum(s.get("bytes_sent", 0) for s in run.steps)),
        "wall_s": run.steps[-1]["t"] if run.steps else None,
        "steps": len(run.steps),
        "fixed": run.fixed,
        "phases": list(phases(run).values()),
        "warnings": check_run(run),
    }


def hindsight(runs: list[PolicyRun], per_policy: dict[str, dict[str, Any]]
              ) -> tuple[float | None, list[dict[str, Any]]]:
    """Per phase, the fixed policy with the lowest mean step time there, times the
    phase's steps (the median over all runs: the same for epoch-keyed schedules);
    added up over the phases."""
    fixed = [r.label for r in runs if r.fixed and per_policy[r.label]["steps"] and not r.failed]
    if not fixed:
        return None, []
    keys: dict[Any, list[int]] = {}
    for run in runs:
        for ph in per_policy[run.label]["phases"]:
            keys.setdefault(_key(ph), []).append(ph["steps"])
    total, choices = 0.0, []
    for key, counts in keys.items():
        options = []
        for label in fixed:
            ph = next((p for p in per_policy[label]["phases"] if _key(p) == key), None)
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


def comparisons(summary: dict[str, dict[str, Any]], best_fixed_s: float | None) -> dict[str, Any]:
    """The figures the README quotes: MOO against dense, hindsight and PowerSGD."""
    out: dict[str, Any] = {}
    moo, dense, psgd = summary.get("moo"), summary.get("dense"), summary.get("powersgd")
    if moo and dense:
        out["dense_over_moo_time_to_target"] = _ratio(dense["time_to_target_s"],
                                                      moo["time_to_target_s"])
        out["moo_minus_dense_final_accuracy_points"] = _diff_points(
            moo["final_accuracy"], dense["final_accuracy"])
    if moo and best_fixed_s:
        out["moo_over_hindsight_best_fixed"] = _ratio(moo["wall_s"], best_fixed_s)
    if moo and psgd:
        out["powersgd_over_moo_time_to_target"] = _ratio(psgd["time_to_target_s"],
                                                         moo["time_to_target_s"])
        out["moo_minus_powersgd_final_accuracy_points"] = _diff_points(
            moo["final_accuracy"], psgd["final_accuracy"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _diff_points(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else 100.0 * (a - b)


def build_summary(out: Path) -> dict[str, Any]:
    config = json.loads((out / "config.json").read_text())
    cluster = json.loads((out / "cluster.json").read_text()) if (out / "cluster.json").exists() else {}
    runs = load_runs(out)
    target = config["target_accuracy"]
    per_policy = {run.label: summarize_run(run, target) for run in runs}
    best_fixed_s, choices = hindsight(runs, per_policy)
    summary: dict[str, Any] = dict(per_policy)
    summary["hindsight_best_fixed_s"] = best_fixed_s
    summary["lab"] = {
        "target_accuracy": target,
        "nodes": config["nodes"],
        "steps": config["steps"],
        "schedule": config["schedule_name"],
        "shaped": cluster.get("shaped"),
        "reason_unshaped": cluster.get("reason_unshaped", ""),
        "decisions": config["decisions"],
        "hindsight_choices": choices,
        "failed": {run.label: run.failed for run in runs if run.failed},
        "comparisons": comparisons(per_policy, best_fixed_s),
    }
    return summary


def format_table(summary: dict[str, Any]) -> str:
    lab = summary["lab"]
    rows = [("policy", "to target", "final acc", "sent", "train time", "vs best fixed")]
    best = summary.get("hindsight_best_fixed_s")
    for label, s in _policies(summary):
        rows.append((
            label,
            "never" if s["time_to_target_s"] is None else f"{s['time_to_target_s']:.1f} s",
            "-" if s["final_accuracy"] is None else f"{100 * s['final_accuracy']:.1f}%",
            format_bytes(s["bytes_sent"]),
            "-" if s["wall_s"] is None else f"{s['wall_s']:.1f} s",
            "-" if not best or s["wall_s"] is None else f"{s['wall_s'] / best:.2f}x",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"target accuracy {100 * lab['target_accuracy']:.0f}%; "
                 + ("best fixed choice per phase in hindsight: "
                    + (f"{best:.1f} s" if best else "n/a")))
    lines.extend(_phase_lines(summary))
    for key, value in lab["comparisons"].items():
        lines.append(f"{key}: {'n/a' if value is None else f'{value:.2f}'}")
    for label, s in _policies(summary):
        lines.extend(f"WARNING: {label}: {w}" for w in s["warnings"])
    for label, why in lab.get("failed", {}).items():
        lines.append(f"FAILED: {label}: {why.strip().splitlines()[0]}")
    if not lab.get("shaped"):
        lines.append(f"NOTE: links were not shaped ({lab.get('reason_unshaped') or 'loopback'})")
    return "\n".join(lines)


def _phase_lines(summary: dict[str, Any]) -> list[str]:
    lines = ["", "per phase: steps, mean step time, CR @ collective run most, "
                 "predicted/measured sync"]
    for label, s in _policies(summary):
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


def _policies(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(k, v) for k, v in summary.items() if k not in ("lab", "hindsight_best_fixed_s")]


def write_report(out: Path) -> dict[str, Any]:
    """Write summary.json, summary.txt and the plots; return the summary."""
    out = Path(out)
    summary = build_summary(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.txt").write_text(format_table(summary) + "\n")
    from flexcomm.lab.plots import write_plots

    write_plots(out, load_runs(out), summary)
    return summary
