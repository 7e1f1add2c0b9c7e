"""What a lab run compares and under which network: policy specs and the default
schedule.

A policy spec names one way to synchronise gradients:

    dense                     flexcomm hook, dense Ring AllReduce
    topk-0.01                 flexcomm hook, fixed Top-k at CR 0.01 over AG-Topk
    topk-0.01-art_ring        ... over another Top-k collective
    static:compression=bf16   flexcomm hook, any fixed compression (powersgd:2, bf16, ...)
    moo, gravac               flexcomm hook, the adaptive policies
    moo:objective=progress    a policy with options (k=v, comma separated)
    powersgd                  PyTorch's own powerSGD_hook (what a PyTorch user reaches for)
    allreduce                 PyTorch DDP's built-in AllReduce, no hook

The spec string itself is the policy's name in the report and summary.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flexcomm.policy import POLICY_NAMES, make_policy
from flexcomm.policy.types import AG_TOPK, SPARSE_COLLECTIVES, check_cr

# Methods that are PyTorch's own, not a flexcomm policy (flexcomm.lab.sync runs them).
TORCH_METHODS = ("powersgd", "allreduce")
DEFAULT_POLICIES = ("dense", "topk-0.1", "topk-0.01", "moo", "gravac", "powersgd")
# The default run, sized so that all six policies finish in about 5 minutes on a
# quiet 2-core machine (10 under load) and dense reaches the target late in it.
DEFAULTS = {"steps": 250, "batch": 32, "lr": 0.01, "eval_every": 5, "target_accuracy": 0.95,
            "control_interval": 2, "hidden": 400, "depth": 3}
FIXED_KINDS = ("dense", "static", "allreduce")

# Epoch-keyed, so every policy trains the same steps under the same link: a
# fast start, then slow, then very slow (a network that degrades under the job).
DEFAULT_SCHEDULE = """\
name = "flexcomm lab default"
description = "fast, then slow, then very slow links (every node, both directions)"

[[step]]
epoch = 0
rate = "1Gbit"

[[step]]
epoch = 2
rate = "100Mbit"

[[step]]
epoch = 5
rate = "20Mbit"
"""


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


def parse_policy(spec: str) -> PolicySpec:
    text = spec.strip()
    if not text:
        raise ValueError("policies: empty policy name")
    if text.startswith("topk-"):
        return _parse_topk(text)
    name, _, rest = text.partition(":")
    known = (*POLICY_NAMES, *TORCH_METHODS)
    if name not in known:
        raise ValueError(f"policies: unknown policy {name!r} (one of {', '.join(known)}, "
                         "topk-CR[-COLLECTIVE])")
    options: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"policies: option {item!r} of {name} is not key=value")
        options[key.strip()] = _plain(value.strip())
    if name in TORCH_METHODS and options:
        raise ValueError(f"policies: {name} takes no options")
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


def parse_policies(text: str) -> list[PolicySpec]:
    specs = [parse_policy(p) for p in _split_top(text)]
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
