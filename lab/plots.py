"""The lab's PNG plots (matplotlib, Agg backend: no display needed).

- network.png: per policy, the link rate in force (grey, left axis) with the
  agent's bandwidth estimate (black line), and the CR each step ran (right axis,
  log scale), coloured by collective, against the policy's training time.
- quality.png: the held-out figure (accuracy, or loss when the target is a
  loss) against training time, one line per policy (every repeat, in the
  policy's colour), the envelope of the fixed choices of the first repeat (the
  best any of them had by then) thick and black, the targets dashed.
- step_time.png: step time against step (a running median), one line per policy.

network.png and step_time.png show each policy's first repeat.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from flexcomm.lab import estimate_tracking
from flexcomm.lab.envelope import envelope

COLLECTIVE_COLOURS = {
    "dense_ring": "tab:red", "dense_tree": "tab:pink", "ag_topk": "tab:blue",
    "art_ring": "tab:green", "art_tree": "tab:olive", "powersgd": "tab:purple",
    "torch_allreduce": "tab:brown", "bf16_allreduce": "tab:orange",
}
SMOOTH_STEPS = 9


def write_plots(out: Path, runs: list[Any], summary: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = [run for run in runs if run.repeat == 0]
    paths = [_network(out, first, plt), _quality(out, runs, summary, plt),
             _step_time(out, first, plt)]
    plt.close("all")
    return paths


def _network(out: Path, runs: list[Any], plt: Any) -> Path:
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.2 * len(runs) + 0.6), sharey=False,
                             squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        ts = [s["t"] for s in run.steps]
        rates = [_rate_at(run, s) for s in run.steps]
        known = [r / 1e6 for r in rates if r is not None]
        if known:
            floor = min(known) / 3
            ax.fill_between(ts, [floor if r is None else r / 1e6 for r in rates], floor,
                            step="pre", color="0.85")
            ax.set_yscale("log")
            ax.set_ylim(floor, max(known) * 2)
        ax.set_ylabel("link Mbit/s")
        if known:
            estimate_tracking.plot(ax, out, run)
        ax.set_title(run.label, fontsize=9, loc="left")
        cr_ax = ax.twinx()
        cr_ax.set_yscale("log")
        cr_ax.set_ylim(5e-4, 2)
        cr_ax.set_ylabel("share of dense bytes")
        for collective in sorted({s.get("collective") for s in run.steps} - {None}):
            chosen = [s for s in run.steps if s.get("collective") == collective]
            cr_ax.scatter([s["t"] for s in chosen], [s["cr"] for s in chosen], s=6,
                          color=COLLECTIVE_COLOURS.get(collective, "black"), label=collective)
        cr_ax.legend(loc="lower right", fontsize=7, markerscale=2)
    axes[-1, 0].set_xlabel("training time (s)")
    fig.tight_layout()
    path = out / "network.png"
    fig.savefig(path, dpi=90)
    return path


def _rate_at(run: Any, step: dict[str, Any]) -> float | None:
    index = run.phase_of(step)
    return run.links[index]["rate_bps"] if index >= 0 else None


def _quality(out: Path, runs: list[Any], summary: dict[str, Any], plt: Any) -> Path:
    """The target's figure against training time: percent accuracy, or loss in nats."""
    lab = summary["lab"]
    metric = lab["target_metric"]
    scale = 1.0 if metric == "loss" else 100.0
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours: dict[str, Any] = {}
    for run in runs:
        line, = ax.plot([e["t"] for e in run.evals], [scale * e[metric] for e in run.evals],
                        label=None if run.label in colours else run.label,
                        color=colours.get(run.label), linewidth=1.4 if run.repeat == 0 else 0.7)
        colours.setdefault(run.label, line.get_color())
    env = envelope([r.evals for r in runs if r.repeat == 0 and r.fixed and not r.failed], metric)
    if env:
        ax.step([t for t, _ in env], [scale * v for _, v in env], where="post", color="black",
                linewidth=2.4, alpha=0.5, label="envelope of the fixed choices")
    for name, value in lab.get("targets", {"target": lab["target"]}).items():
        ax.axhline(scale * value, color="0.4", linestyle="--", linewidth=1)
        ax.annotate(f"target {name}", (0, scale * value), xycoords=("axes fraction", "data"),
                    xytext=(3, 2), textcoords="offset points", fontsize=7, color="0.4")
    times = [e["t"] for run in runs for e in run.evals if e["t"] > 0]
    if times:
        ax.set_xscale("log")
        ax.set_xlim(min(times) * 0.8, max(times) * 1.2)
    ax.set_xlabel("training time (s)")
    if metric == "loss":
        ax.set_ylabel("validation loss (nats)")
        ax.set_ylim(top=2 * lab["target"])
    else:
        ax.set_ylabel("test accuracy (%)")
        ax.set_ylim(bottom=max(0, 100 * lab["target"] - 40))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "quality.png"
    fig.savefig(path, dpi=90)
    return path


def _phase_starts(run: Any) -> list[tuple[int, float]]:
    """(first step, link rate) of each phase of `run` (the same steps for every
    policy under an epoch-keyed schedule)."""
    starts, last = [], None
    for step in run.steps:
        index = run.phase_of(step)
        if index >= 0 and index != last:
            starts.append((step["step"], run.links[index]["rate_bps"]))
        last = index
    return starts


def rolling_median(values: list[float], window: int) -> list[float]:
    """Each value replaced by the median of the `window` values centred on it."""
    half = window // 2
    return [statistics.median(values[max(0, i - half):i + half + 1]) for i in range(len(values))]


def _step_time(out: Path, runs: list[Any], plt: Any) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in runs:
        ax.plot([s["step"] for s in run.steps],
                rolling_median([1000 * s["step_s"] for s in run.steps], SMOOTH_STEPS),
                label=run.label, linewidth=1.2)
    for step, rate in _phase_starts(runs[0]) if runs else ():
        ax.axvline(step, color="0.6", linestyle=":", linewidth=1)
        ax.annotate(f"{rate / 1e6:g} Mbit/s", (step, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", fontsize=7, color="0.4")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(f"step time (ms, median of {SMOOTH_STEPS} steps)")
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "step_time.png"
    fig.savefig(path, dpi=90)
    return path
