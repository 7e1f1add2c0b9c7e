"""The lab's report, read back from a run directory alone (so it can be rebuilt).

`build_summary` gives a `LabSummary` (flexcomm.lab.summary), which
`write_report` writes to summary.json. Its keys:

- `workload`, `schedule`, and `settings`: the target and its metric, every
  target of the run by name (a number given, or the tight target's value),
  equal_time and equal_time_s (the seconds every policy is read at: the budget,
  or the pacesetter's time the runner gave the others (config.json's
  paced_budget_s), or for an equal-steps run dense's median),
  budget_s, pacesetter, nodes, steps, repeats, shaped and reason_unshaped,
  decisions.
- `policies`: policy name -> its figures: time_to_target_s (training seconds
  until the held-out figure first reached the workload's target: a test
  accuracy, or for lm a validation loss; null if never), steps_to_target,
  time_to_targets_s (target -> seconds or null), at_equal_time (held-out loss
  and accuracy of the last evaluation by the equal time), final_accuracy (for
  lm next-byte accuracy), final_loss (held-out, nats), bytes_sent (payload rank
  0 contributed, summed over steps), wall_s (training seconds in all), steps, explore_steps (steps
  run under a decision that was exploring), compute_s (the median compute time
  of a step, measured without communication), fixed, warnings. Each figure is
  the median over the repeats; `per_repeat` lists every repeat's and `spread`
  its [min, max] (a time that never reached the target counts as slower than
  any; a median or bound that is such a time is null). `phases` is the first
  repeat's, per phase of the schedule: the steps, seconds, mean step time, the
  CR and collective run most, and the mean predicted vs measured sync time;
  `estimate_tracking` the agent's estimate per phase (lab.estimate_tracking).
- `headroom`: per target, the modelled time of the best fixed choice over that
  of the best choice per phase, with its spread over repeats and the choice per
  phase (see flexcomm.lab.envelope); `envelope_distance`: MOO's distance from
  the envelope of the fixed choices, worst and median after the first 10% of
  its run, per repeat and as medians.
- `hindsight_best_fixed_s`: for each phase the fixed choice, among the fixed
  policies run, that was fastest there, added up (the median over repeats, each
  in `hindsight_per_repeat`, the choices of the first in `hindsight_choices`;
  null in an equal-time run, where the headroom says it);
  `moo_over_hindsight_best_fixed`: MOO's wall time over it.
  `hindsight_reaching_s` and `moo_over_hindsight_reaching`: the same among the
  fixed choices that reached every target in their repeat (a phase's fastest
  choice may be one no user would keep: in the cnn lab Top-k 0.01 reached
  neither target and was the fastest on most phases).
- `compute_only_s`: dense's steps to the target times the median compute time
  of a step: the time to the target if communication were free, which no
  policy can beat.
- `comparisons`: per rival of MOO, its time to target over MOO's, and MOO's
  final accuracy (points) and loss (nats) minus its; `verdicts`: one line per
  rival and target; `estimate_tracking`: how many phases' estimates came
  within 10% in time, and the share of wall time spent probing; `failed`: run
  name -> why.

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
from flexcomm.lab.summary import (
    Comparison,
    EnvelopeDistance,
    Headroom,
    LabSummary,
    Phase,
    PolicySummary,
    Repeat,
    Settings,
    to_json,
)
from flexcomm.lab.table import format_table, target_time
from flexcomm.policy import POLICY_NAMES

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


def phases(run: PolicyRun) -> list[Phase]:
    grouped: dict[Any, list[dict[str, Any]]] = {}
    rates: dict[Any, float | None] = {}
    for step in run.steps:
        index = run.phase_of(step)
        key = phase_key(run, index)
        grouped.setdefault(key, []).append(step)
        rates[key] = run.links[index]["rate_bps"] if key is not None else None
    out = []
    for key, steps in grouped.items():
        seconds = sum(s["step_s"] for s in steps)
        choice = Counter((s.get("compression"), s.get("collective")) for s in steps).most_common(1)[0][0]
        predicted = [s["predicted_sync_s"] for s in steps if s.get("predicted_sync_s")]
        measured = [s["t_sync_s"] for s in steps if "t_sync_s" in s]
        out.append(Phase(
            phase=key, rate_bps=rates[key], steps=len(steps), seconds=seconds,
            mean_step_s=seconds / len(steps), compression=choice[0], collective=choice[1],
            predicted_sync_s=statistics.fmean(predicted) if predicted else None,
            measured_sync_s=statistics.fmean(measured) if measured else None))
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
                  equal_time_s: float | None = None) -> Repeat:
    """One run's figures: to `target` (the workload's), to each of `targets`
    (by name), and the quality at `equal_time_s`."""
    hit = first_hit(run, target, metric)
    last = run.evals[-1] if run.evals else {}
    return Repeat(
        time_to_target_s=hit.get("t"),
        steps_to_target=hit.get("step"),
        time_to_targets_s={name: first_hit(run, value, metric).get("t")
                           for name, value in (targets or {}).items()},
        steps_to_targets={name: first_hit(run, value, metric).get("step")
                          for name, value in (targets or {}).items()},
        at_equal_time=at_time(run, equal_time_s),
        final_accuracy=last.get("accuracy"),
        final_loss=last.get("loss"),
        bytes_sent=int(sum(s.get("bytes_sent", 0) for s in run.steps)),
        wall_s=run.steps[-1]["t"] if run.steps else None,
        steps=len(run.steps),
        explore_steps=sum(is_exploring(s) for s in run.steps),
        compute_s=run.start.get("compute_s"),
        fixed=run.fixed,
        phases=tuple(phases(run)),
        warnings=tuple(check_run(run)),
    )


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


def summarize_policy(repeats: list[Repeat], estimates: list[dict[str, Any]] | None = None
                     ) -> PolicySummary:
    """One policy's figures over its repeats; `estimates`: its first repeat's
    estimate tracking."""
    medians: dict[str, Any] = {}
    spread: dict[str, Any] = {}
    per_repeat: dict[str, Any] = {}
    for name in FIGURES:
        values = [getattr(r, name) for r in repeats]
        medians[name], spread[name] = median_and_spread(values, name in SLOWER_WHEN_MISSING)
        per_repeat[name] = values
    for name in ("time_to_targets_s", "at_equal_time"):
        medians[name], spread[name], per_repeat[name] = {}, {}, {}
        for key in getattr(repeats[0], name):
            values = [getattr(r, name)[key] for r in repeats]
            medians[name][key], spread[name][key] = median_and_spread(
                values, name == "time_to_targets_s")
            per_repeat[name][key] = values
    many = len(repeats) > 1
    return PolicySummary(
        **medians, spread=spread, per_repeat=per_repeat, fixed=repeats[0].fixed,
        phases=repeats[0].phases,
        warnings=tuple(f"repeat {i}: {w}" if many else w
                       for i, r in enumerate(repeats) for w in r.warnings),
        estimate_tracking=tuple(estimates or ()))


def hindsight(runs: list[PolicyRun], per_run: dict[str, Repeat]
              ) -> tuple[float | None, list[dict[str, Any]]]:
    """Per phase, the fixed policy with the lowest mean step time there, times the
    phase's steps (the median over all runs: the same for epoch-keyed schedules);
    added up over the phases. `runs` are one repeat's, `per_run` their summaries
    by label."""
    fixed = [r.label for r in runs if r.fixed and per_run[r.label].steps and not r.failed]
    if not fixed:
        return None, []
    keys: dict[Any, list[int]] = {}
    for run in runs:
        for ph in per_run[run.label].phases:
            keys.setdefault(ph.phase, []).append(ph.steps)
    total, choices = 0.0, []
    for key, counts in keys.items():
        options = []
        for label in fixed:
            ph = next((p for p in per_run[label].phases if p.phase == key), None)
            if ph is not None:
                options.append((ph.mean_step_s, label))
        if not options:
            return None, []
        best_s, best = min(options)
        steps = statistics.median(counts)
        total += best_s * steps
        choices.append({"phase": None if key is None else list(key), "policy": best,
                        "steps": steps, "seconds": best_s * steps})
    return total, choices


def compute_only(per_policy: dict[str, PolicySummary]) -> float | None:
    """Dense's steps to the target times the median compute time of a step over
    every run: the time to the target with free communication."""
    dense = per_policy.get("dense")
    times = [t for s in per_policy.values() for t in s.per_repeat["compute_s"] if t is not None]
    if not dense or dense.steps_to_target is None or not times:
        return None
    return dense.steps_to_target * statistics.median(times)


def comparisons(per_policy: dict[str, PolicySummary]) -> dict[str, Comparison]:
    """MOO against every other policy: time to target as rival over MOO; final
    accuracy in points and final loss in nats as MOO minus rival."""
    moo = per_policy.get(ADAPTIVE)
    if not moo:
        return {}
    return {label: Comparison(
        rival_over_moo_time_to_target=_ratio(rival.time_to_target_s, moo.time_to_target_s),
        moo_minus_rival_final_accuracy_points=_diff(moo.final_accuracy, rival.final_accuracy,
                                                    100.0),
        moo_minus_rival_final_loss=_diff(moo.final_loss, rival.final_loss))
        for label, rival in per_policy.items() if label != ADAPTIVE}


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


def verdicts(per_policy: dict[str, PolicySummary], repeats: int) -> list[str]:
    """One line per rival and target: MOO's time to the target against it,
    "within noise" where the spreads over the repeats overlap."""
    moo = per_policy.get(ADAPTIVE)
    if not moo:
        return []
    lines = []
    for label, rival in per_policy.items():
        if label == ADAPTIVE:
            continue
        for target in moo.time_to_targets_s:
            mine, theirs = moo.time_to_targets_s[target], rival.time_to_targets_s[target]
            ratio = _ratio(theirs, mine)
            if ratio is None:
                figure = ("neither reached it" if mine is None and theirs is None
                          else "moo never reached it" if mine is None
                          else f"{label} never reached it")
            else:
                figure = f"{ratio:.2f}x ({'moo sooner' if ratio > 1 else 'moo later'})"
            noise = ""
            if repeats > 1 and overlap(moo.spread["time_to_targets_s"][target],
                                       rival.spread["time_to_targets_s"][target]):
                noise = ": within noise"
            lines.append(f"moo vs {label}: time to target {target}: {figure}{noise} "
                         f"(moo {target_time(moo, target, repeats)}, "
                         f"{label} {target_time(rival, target, repeats)})")
    return lines


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
    """The seconds every policy is read at: the budget given, else the one the
    runner took from the pacesetter (config's paced_budget_s; None when no
    pacesetter run finished), else (an equal-steps run) dense's median."""
    if config.get("budget_s"):
        return float(config["budget_s"])
    if config.get("pacesetter"):
        paced = config.get("paced_budget_s")
        return float(paced) if paced is not None else None
    times = [r.steps[-1]["t"] for r in runs if r.label == "dense" and r.steps]
    return statistics.median(times) if times else None


def build_summary(out: Path) -> LabSummary:
    config = json.loads((out / "config.json").read_text())
    cluster = json.loads((out / "cluster.json").read_text()) if (out / "cluster.json").exists() else {}
    runs = load_runs(out)
    repeats = config.get("repeats", 1)
    target = config.get("target", config.get("target_accuracy"))  # the latter: older runs
    metric = config.get("target_metric", "accuracy")
    targets = resolve_targets(config, runs)
    equal_s = equal_time(config, runs)
    per_run = [summarize_run(run, target, metric, targets, equal_s) for run in runs]
    every_tracked = [estimate_tracking.summarize(out, run) for run in runs]
    tracked = {run.label: phases  # as the plots: the first repeat
               for run, phases in zip(runs, every_tracked, strict=True) if run.repeat == 0}
    per_policy = {label: summarize_policy([s for run, s in zip(runs, per_run, strict=True)
                                           if run.label == label], tracked.get(label))
                  for label in config["policies"]}
    totals, choices, rooms, gaps, reaching_totals = [], [], [], [], []
    schedule = parse_schedule(config["schedule_text"], config["schedule_name"])
    for repeat in range(repeats):
        these = [(run, s) for run, s in zip(runs, per_run, strict=True) if run.repeat == repeat]
        by_label = {r.label: s for r, s in these}
        total, chosen = hindsight([r for r, _ in these], by_label)
        totals.append(total)
        reached = [r for r, s in these if all(t is not None for t in s.time_to_targets_s.values())]
        reaching_totals.append(hindsight(reached, by_label)[0])
        choices = choices or chosen
        fixed = {r.label: s for r, s in these if r.fixed and not r.failed}
        rooms.append({t: envelope.headroom(schedule, _progress_rates(fixed, t)) for t in targets})
        gaps.append(_moo_gap([r for r, _ in these], metric))
    best_fixed_s, _ = median_and_spread(totals, slower_when_missing=False)
    reaching_s, _ = median_and_spread(reaching_totals, slower_when_missing=False)
    if config.get("equal_time"):  # a sum of step times over the same steps: the headroom instead
        best_fixed_s = reaching_s = None
    moo = per_policy.get(ADAPTIVE)
    return LabSummary(
        workload=config["workload"]["name"],
        schedule=config["schedule_name"],
        settings=Settings(
            target=target, target_metric=metric, targets=targets,
            equal_time=config.get("equal_time", False), equal_time_s=equal_s,
            budget_s=config.get("budget_s"), pacesetter=config.get("pacesetter"),
            nodes=config["nodes"], steps=config["steps"], repeats=repeats,
            shaped=cluster.get("shaped"), reason_unshaped=cluster.get("reason_unshaped", ""),
            decisions=config["decisions"]),
        policies=per_policy,
        headroom=_headroom(rooms, targets),
        envelope_distance=EnvelopeDistance(
            unit="nats" if metric == "loss" else "accuracy points",
            per_repeat=tuple(gaps),
            worst=median_and_spread([g["worst"] for g in gaps], False)[0],
            median=median_and_spread([g["median"] for g in gaps], False)[0]),
        hindsight_best_fixed_s=best_fixed_s,
        hindsight_per_repeat=tuple(totals),
        hindsight_choices=tuple(choices),
        compute_only_s=compute_only(per_policy),
        comparisons=comparisons(per_policy),
        moo_over_hindsight_best_fixed=(_ratio(moo.wall_s, best_fixed_s)
                                       if moo and best_fixed_s else None),
        hindsight_reaching_s=reaching_s,
        moo_over_hindsight_reaching=_ratio(moo.wall_s, reaching_s) if moo and reaching_s else None,
        estimate_tracking=estimate_tracking.summary_of(
            every_tracked, [list(s.estimate_tracking) for s in per_policy.values()],
            estimate_tracking.probe_share(out, runs)),
        verdicts=tuple(verdicts(per_policy, repeats)),
        failed={_run_name(run, repeats): run.failed for run in runs if run.failed},
    )


def _progress_rates(fixed: dict[str, Repeat], target: str
                    ) -> dict[str, tuple[int, dict[float, float]]]:
    """What the headroom's walk needs of each fixed run that reached `target`:
    its steps to it and its mean step time at each link rate."""
    return {label: (s.steps_to_targets[target],
                    {ph.rate_bps: ph.mean_step_s for ph in s.phases if ph.rate_bps is not None})
            for label, s in fixed.items() if s.steps_to_targets.get(target)}


def _moo_gap(runs: list[PolicyRun], metric: str) -> dict[str, float | None]:
    """MOO's distance from the envelope of one repeat's fixed runs."""
    moo = next((r for r in runs if r.label == ADAPTIVE and not r.failed), None)
    env = envelope.envelope([r.evals for r in runs if r.fixed and not r.failed], metric)
    return envelope.distance(moo.evals if moo else [], env, metric)


def _headroom(rooms: list[dict[str, dict[str, Any]]], targets: dict[str, float]
              ) -> dict[str, Headroom]:
    """Per target: the median headroom ratio over repeats, its [min, max], and
    the first repeat's details."""
    out = {}
    for t in targets:
        ratio, spread = median_and_spread([r[t]["ratio"] for r in rooms], False)
        first = rooms[0][t]
        out[t] = Headroom(ratio=ratio, spread=(spread[0], spread[1]),
                          best_fixed=first.get("best_fixed"),
                          best_fixed_s=first.get("best_fixed_s"),
                          hindsight_per_phase_s=first.get("hindsight_per_phase_s"),
                          per_phase=tuple(first.get("per_phase", ())),
                          why=first.get("why", ""))
    return out


def _run_name(run: PolicyRun, repeats: int) -> str:
    return run.label if repeats == 1 else f"{run.label}@{run.repeat}"


def write_report(out: Path) -> LabSummary:
    """Write summary.json, summary.txt and the plots; return the summary."""
    out = Path(out)
    summary = build_summary(out)
    (out / "summary.json").write_text(to_json(summary))
    (out / "summary.txt").write_text(format_table(summary) + "\n")
    from flexcomm.lab.plots import write_plots

    write_plots(out, load_runs(out), summary.settings)
    return summary
