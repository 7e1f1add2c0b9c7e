"""summary.txt: the lab's summary as the table printed at the end of a run.

Its first line is the scenario's headroom (with a note when adapting has little
to win), then MOO's distance from the envelope of the fixed choices, one row
per policy, the run's settings, each policy's phases, the agent's estimate per
phase, the verdicts, and any warning, failure or unshaped link.
"""

from __future__ import annotations

from flexcomm.lab import estimate_tracking
from flexcomm.lab.summary import LabSummary, Phase, PolicySummary, Settings
from flexcomm.units import format_bytes, format_rate

HEADROOM_WORTH = 1.1  # below this on every target, the first line says there is little to win


def headroom_line(summary: LabSummary) -> str:
    """The summary's first line: what adapting per phase could win here."""
    parts = []
    for target, room in summary.headroom.items():
        if room.ratio is None:
            parts.append(f"to {target}: n/a ({room.why or 'no ratio'})")
        else:
            parts.append(f"to {target}: {room.ratio:.2f}x (best fixed {room.best_fixed} "
                         f"{room.best_fixed_s:.1f} s, best per phase "
                         f"{room.hindsight_per_phase_s:.1f} s)")
    words = "; ".join(parts) or "n/a"
    small = [t for t, r in summary.headroom.items()
             if r.ratio is not None and r.ratio < HEADROOM_WORTH]
    note = (" -- little for adaptation to win here" if small
            and len(small) == len(summary.headroom) else "")
    return f"headroom (best fixed choice / best choice per phase, modelled): {words}{note}"


def format_table(summary: LabSummary) -> str:
    settings = summary.settings
    repeats = settings.repeats
    dense = summary.policies.get("dense")
    targets = list(settings.targets)
    equal_s = settings.equal_time_s
    metric = settings.target_metric
    rows = [("policy", *(f"to {t}" for t in targets),
             "at " + ("-" if equal_s is None else f"{equal_s:.0f} s"), "final loss", "vs dense",
             "final acc", "sent", "train time", "steps", "exploring", "vs best fixed")]
    best = summary.hindsight_best_fixed_s
    for label, s in summary.policies.items():
        rows.append((
            label,
            *(target_time(s, t, repeats) for t in targets),
            _figure(s.at_equal_time.get(metric), metric),
            "-" if s.final_loss is None else f"{s.final_loss:.3f}",
            "-" if not dense or dense.final_loss is None or s.final_loss is None
            else f"{s.final_loss - dense.final_loss:+.3f}",
            "-" if s.final_accuracy is None else f"{100 * s.final_accuracy:.1f}%",
            format_bytes(s.bytes_sent or 0),
            "-" if s.wall_s is None else f"{s.wall_s:.1f} s",
            f"{s.steps:g}",
            f"{s.explore_steps:g}/{s.steps:g}" if s.steps else "-",
            "-" if not best or s.wall_s is None else f"{s.wall_s / best:.2f}x",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = [headroom_line(summary)]
    gap = summary.envelope_distance
    if gap.worst is not None and gap.median is not None:
        head.append(f"moo's distance from the envelope of the fixed choices (after the first "
                    f"10%): worst {gap.worst:+.3f}, median {gap.median:+.3f} "
                    f"{gap.unit} (positive: worse)")
    lines = [*head, "", *lines]
    lines.append("")
    lines.append(f"{summary.workload} under schedule {summary.schedule}; "
                 f"{_target_text(settings)}; "
                 + (f"medians of {repeats} repeats [min-max]; " if repeats > 1 else "")
                 + "best fixed choice per phase in hindsight: "
                 + (f"{best:.1f} s" if best else "n/a")
                 + "; dense's steps to the target with free communication: "
                 + ("n/a" if summary.compute_only_s is None
                    else f"{summary.compute_only_s:.1f} s"))
    lines.extend(_phase_lines(summary))
    lines.extend(estimate_tracking.table_lines(
        {label: list(s.estimate_tracking) for label, s in summary.policies.items()},
        summary.estimate_tracking))
    lines.append("")
    lines.extend(summary.verdicts)
    if summary.moo_over_hindsight_best_fixed is not None:
        lines.append("moo's train time over the best fixed choice per phase: "
                     f"{summary.moo_over_hindsight_best_fixed:.2f}x"
                     + ("" if summary.moo_over_hindsight_reaching is None else
                        f"; over the best per phase among those that reached every target: "
                        f"{summary.moo_over_hindsight_reaching:.2f}x"))
    for label, s in summary.policies.items():
        lines.extend(f"WARNING: {label}: {w}" for w in s.warnings)
    for label, why in summary.failed.items():
        lines.append(f"FAILED: {label}: {why.strip().splitlines()[0]}")
    if not settings.shaped:
        lines.append(f"NOTE: links were not shaped ({settings.reason_unshaped or 'loopback'})")
    return "\n".join(lines)


def _figure(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if metric == "loss" else f"{100 * value:.1f}%"


def _target_text(settings: Settings) -> str:
    names = ", ".join(settings.targets or [f"{settings.target:g}"])
    time = ("equal time: " + ("-" if settings.equal_time_s is None
                              else f"{settings.equal_time_s:.1f} s")
            + (" (the budget)" if settings.budget_s else
               f" ({settings.pacesetter}'s time for {settings.steps} steps)")
            if settings.equal_time else f"equal steps ({settings.steps})")
    if settings.target_metric == "loss":
        return f"target validation loss {settings.target:g} nats (targets {names}); {time}"
    return f"target accuracy {100 * settings.target:.0f}% (targets {names}); {time}"


def _phase_lines(summary: LabSummary) -> list[str]:
    lines = ["", "per phase: steps, mean step time, CR @ collective run most, "
                 "predicted/measured sync"]
    for label, s in summary.policies.items():
        parts = []
        for ph in s.phases:
            rate = "unshaped" if ph.rate_bps is None else format_rate(ph.rate_bps)
            sync = ""
            if ph.predicted_sync_s and ph.measured_sync_s is not None:
                sync = f" {1000 * ph.predicted_sync_s:.0f}/{1000 * ph.measured_sync_s:.0f} ms"
            parts.append(f"{rate}: {ph.steps}x{1000 * ph.mean_step_s:.0f} ms "
                         f"{_choice(ph)}{sync}")
        lines.append(f"  {label}: " + " | ".join(parts))
    return lines


def _choice(phase: Phase) -> str:
    if phase.compression is None:
        return str(phase.collective)
    return f"{phase.compression}@{phase.collective}"


def target_time(s: PolicySummary, target: str, repeats: int) -> str:
    text = _seconds(s.time_to_targets_s[target])
    if repeats > 1:
        lo, hi = s.spread["time_to_targets_s"][target]
        text += f" [{_seconds(lo).removesuffix(' s')}-{_seconds(hi)}]"
    return text


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"
