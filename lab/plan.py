"""What a lab run compares and under which network: policy specs and the default
schedule.

A policy spec names one way to synchronise gradients:

    dense                     flexcomm hook, dense Ring AllReduce
    topk-0.01                 flexcomm hook, fixed Top-k at CR 0.01 over AG-Topk
    topk-0.01-art_ring        ... over another Top-k collective
    static:compression=bf16   flexcomm hook, any fixed compression (powersgd:2, bf16, ...)
    moo, gravac               flexcomm hook, the adaptive policies
    moo:objective=progress    a policy with options (k=v, comma separated)
    powersgd                  PyTorch's own powerSGD_hook at rank 2 (what a PyTorch user reaches for)
    powersgd-4                ... at another rank
    bf16                      PyTorch's own bf16_compress_hook (AllReduce in bfloat16)
    localsgd                  PyTorch's post_localSGD_hook with a PeriodicModelAverager
                              (parameters averaged every 4 steps)
    localsgd-8                ... averaged every 8 steps
    allreduce                 PyTorch DDP's built-in AllReduce, no hook
    all                       every baseline and policy of ALL_POLICIES

The spec string itself is the policy's name in the report and summary.json.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexcomm.policy import POLICY_NAMES, make_policy
from flexcomm.policy.types import AG_TOPK, SPARSE_COLLECTIVES, check_cr

# Methods that are PyTorch's own, not a flexcomm policy (flexcomm.lab.sync runs them).
TORCH_METHODS = ("powersgd", "bf16", "allreduce", "localsgd")
POWERSGD_RANK = 2  # powerSGD_hook's own default
LOCALSGD_PERIOD = 4  # the period of PyTorch's PeriodicModelAverager example
DEFAULT_POLICIES = ("dense", "topk-0.1", "topk-0.01", "moo", "gravac", "powersgd")
# What a user would pick instead of flexcomm, and flexcomm's adaptive policies.
ALL_POLICIES = ("dense", "bf16", "powersgd-1", "powersgd", "powersgd-4", "localsgd", "topk-0.1",
                "topk-0.01", "moo", "gravac")
CONTROL_INTERVAL = 2
# A choice made once for the whole run: flexcomm's fixed ones and PyTorch's own, what
# a user would pick instead of an adaptive policy (the envelope and the hindsight).
FIXED_KINDS = ("dense", "static", *TORCH_METHODS)
FAILED = "failed.txt"  # in a policy's directory: why its run failed
AGENTS = "agents"  # in a policy's directory: its agents' stores and logs

# Per workload: the model's size (see flexcomm.lab.workload) and how a run trains it.
# target is a test accuracy (a fraction) or, for lm, a validation loss in nats.
OPTIMIZERS = ("sgd", "adam")  # built by lab/trainer.py; named here, where the CLI reads them without torch

WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": {"hidden": 400, "depth": 3, "steps": 250, "batch": 32, "optimizer": "sgd",
               "lr": 0.01, "eval_every": 5, "target": 0.95},
    "synthetic": {"hidden": 400, "depth": 3, "samples": 4000, "steps": 250, "batch": 32,
                  "optimizer": "sgd", "lr": 0.01, "eval_every": 5, "target": 0.95},
    "lm": {"hidden": 128, "depth": 4, "samples": 1024, "steps": 384, "batch": 8,
           "optimizer": "adam", "lr": 3e-3, "eval_every": 10, "target": 2.6},
    "cnn": {"hidden": 32, "depth": 3, "steps": 250, "batch": 32, "optimizer": "sgd",
            "lr": 0.05, "eval_every": 5, "target": 0.95},
}
DEFAULT_WORKLOAD = "digits"
# The tight target, "tight" in --targets: dense's final held-out figure (the
# median over repeats) moved by this much (lm: + 0.05 nats; accuracy: - 0.3 points).
TIGHT = "tight"
TIGHT_MARGIN = {"loss": 0.05, "accuracy": -0.003}
RUN_SETTINGS = ("steps", "batch", "optimizer", "lr", "eval_every", "target")

# Time-keyed, so every policy trains the same seconds under the same network
# (dense's time for `steps` is everyone's budget): slow and fast links in turn,
# 15 s each. On the slow link compressing wins; on the fast one dense steps are
# nearly as quick and lose nothing, so no fixed choice is right throughout.
DEFAULT_SCHEDULE = """\
name = "flexcomm lab default"
description = "slow and fast in turn, 15 s each (every node, both directions)"

[[step]]
duration = "15s"
rate = "20Mbit"

[[step]]
duration = "15s"
rate = "1Gbit"

[[step]]
duration = "15s"
rate = "20Mbit"

[[step]]
duration = "15s"
rate = "1Gbit"
"""


# Schedules a lab run can name (`--schedule up-and-down`): examples/schedules/NAME.toml.
SCHEDULES_DIR = Path(__file__).resolve().parents[1] / "examples" / "schedules"


def named_schedules() -> list[str]:
    return sorted(p.stem for p in SCHEDULES_DIR.glob("*.toml"))


def schedule_file(name_or_path: str) -> Path:
    """The schedule file `name_or_path` means: that path when it exists, else the
    shipped schedule of that name."""
    path = Path(name_or_path)
    if path.exists() or path.suffix == ".toml" or "/" in name_or_path:
        return path
    named = SCHEDULES_DIR / f"{name_or_path}.toml"
    if not named.exists():
        raise ValueError(f"schedule: no file {name_or_path!r} and no shipped schedule of that name "
                         f"(one of {', '.join(named_schedules()) or 'none found in ' + str(SCHEDULES_DIR)})")
    return named


@dataclass(frozen=True)
class PolicySpec:
    """One entry of --policies: `label` (the spec as written), the policy `kind`
    run by the trainer, and its options."""

    label: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def fixed(self) -> bool:
        """A choice that never changes (a candidate for the best fixed in hindsight)."""
        return self.kind in FIXED_KINDS


def policy_dir(out: Path, label: str, repeat: int = 0) -> Path:
    """Where a run directory keeps one policy's files (of its `repeat`-th run);
    '@' never occurs in a cleaned label."""
    name = re.sub(r"[^A-Za-z0-9._=-]", "_", label)
    return Path(out) / "policies" / (name if repeat == 0 else f"{name}@{repeat}")


def agent_store(out: Path, label: str, repeat: int = 0, node: int = 0) -> Path:
    """The store of node `node`'s agent in a policy's run (absent when its
    decisions took no agent)."""
    return policy_dir(out, label, repeat) / AGENTS / f"node{node}.db"


def parse_policy(spec: str) -> PolicySpec:
    text = spec.strip()
    if not text:
        raise ValueError("policies: empty policy name")
    if text.startswith("topk-"):
        return _parse_topk(text)
    if text.startswith("powersgd-"):
        return _parse_powersgd(text)
    if text.startswith("localsgd-"):
        return _parse_localsgd(text)
    name, _, rest = text.partition(":")
    known = (*POLICY_NAMES, *TORCH_METHODS)
    if name not in known:
        raise ValueError(f"policies: unknown policy {name!r} (one of {', '.join(known)}, "
                         "topk-CR[-COLLECTIVE], powersgd-RANK, localsgd-PERIOD)")
    options: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"policies: option {item!r} of {name} is not key=value")
        options[key.strip()] = _plain(value.strip())
    if name in TORCH_METHODS and options:
        raise ValueError(f"policies: {name} takes no options" + {
            "powersgd": " (its rank is written powersgd-RANK)",
            "localsgd": " (its period is written localsgd-PERIOD)"}.get(name, ""))
    if name == "powersgd":
        options = {"rank": POWERSGD_RANK}
    if name == "localsgd":
        options = {"period": LOCALSGD_PERIOD}
    if name in POLICY_NAMES:  # bad options are refused now, not by rank 0 mid-run
        try:
            make_policy(name, grad_bytes=1e6, nodes=2, options=options)
        except ValueError as exc:
            raise ValueError(f"policies: {text}: {exc}") from None
    return PolicySpec(text, name, options)


def _parse_topk(text: str) -> PolicySpec:
    parts = text.split("-")
    if len(parts) not in (2, 3):
        raise ValueError(f"policies: {text!r} is not topk-CR or topk-CR-COLLECTIVE")
    try:
        cr = float(parts[1])
    except ValueError:
        raise ValueError(f"policies: {text!r}: CR {parts[1]!r} is not a number") from None
    check_cr(cr, "policies")
    if cr >= 1.0:
        raise ValueError(f"policies: {text!r}: a Top-k CR must be < 1 (use dense)")
    collective = parts[2] if len(parts) == 3 else AG_TOPK
    if collective not in SPARSE_COLLECTIVES:
        raise ValueError(f"policies: {text!r}: {collective!r} is not a Top-k collective "
                         f"(one of {', '.join(sorted(SPARSE_COLLECTIVES))})")
    return PolicySpec(text, "static", {"compression": f"topk:{cr!r}", "collective": collective})


def _parse_powersgd(text: str) -> PolicySpec:
    rank = text.removeprefix("powersgd-")
    if not rank.isdigit() or int(rank) < 1:
        raise ValueError(f"policies: {text!r}: the PowerSGD rank must be a whole number >= 1")
    return PolicySpec(text, "powersgd", {"rank": int(rank)})


def _parse_localsgd(text: str) -> PolicySpec:
    period = text.removeprefix("localsgd-")
    if not period.isdigit() or int(period) < 2:
        raise ValueError(f"policies: {text!r}: the averaging period must be a whole number >= 2")
    return PolicySpec(text, "localsgd", {"period": int(period)})


def parse_policies(text: str) -> list[PolicySpec]:
    """The specs of `text`; the word `all` stands for ALL_POLICIES."""
    names = [n for p in _split_top(text) for n in (ALL_POLICIES if p.strip() == "all" else (p,))]
    specs = [parse_policy(p) for p in names]
    labels = [s.label for s in specs]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ValueError(f"policies: {dupes[0]!r} is listed twice")
    if not specs:
        raise ValueError("policies: need at least one policy")
    return specs


def _split_top(text: str) -> list[str]:
    """Split on spaces or ';' between specs (commas belong to a spec's options),
    or on ',' when no spec has options."""
    if ":" not in text:
        return [p for p in text.replace(";", ",").replace(" ", ",").split(",") if p.strip()]
    return [p for p in text.replace(";", " ").split() if p.strip()]


def _plain(value: str) -> Any:
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def parse_targets(targets: list[str] | None, target: float, metric: str) -> list[str]:
    """The targets of a run as written (numbers and the word `tight`); None
    gives the workload's target and the tight one."""
    if targets is None:
        return [f"{target:g}", TIGHT]
    if not targets:
        raise ValueError("targets: need at least one")
    for text in targets:
        if text == TIGHT:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"targets: {text!r} is not a number or {TIGHT!r}") from None
        if metric == "accuracy" and not 0.0 < value <= 1.0:
            raise ValueError(f"targets: a test accuracy must be in (0, 1], got {text}")
        if metric == "loss" and not value > 0.0:
            raise ValueError(f"targets: a validation loss must be > 0, got {text}")
    if len(set(targets)) < len(targets):
        raise ValueError("targets: a target is listed twice")
    return list(targets)
