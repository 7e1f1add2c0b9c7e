"""The rows the store keeps, as typed records.

Each record is what one row holds; `ts` (seconds since the epoch) is None until
the store stamps it (callers may pass their own), and `id` is None until stored.
`aggregate_steps` turns a batch of per-step reports into the aggregated rows the
store keeps (one per epoch, compression and collective): a step report is far
too frequent to keep one row per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flexcomm.policy.types import Choice, Decision, StepReport

BANDWIDTH = "bandwidth"
LATENCY = "latency"
PASSIVE = "passive"  # an alpha/beta fit from measured sync times, not an active probe
# A packet train (probe/train.py): whether the path moved, read through the link's
# bucket by the job's estimate (`bytes_sent` is the train it was read from). Its
# duration_s, the time its trains held the link, is charged like any test's.
LOOK = "look"
MEASUREMENT_KINDS: tuple[str, ...] = (BANDWIDTH, LATENCY, PASSIVE, LOOK)
# The kinds that load the link: each held it for its duration_s.
TEST_KINDS: tuple[str, ...] = (BANDWIDTH, LOOK)


def _optional_nonnegative(name: str, value: float | None) -> None:
    if value is not None and (math.isnan(value) or value < 0):
        raise ValueError(f"{name}: must be >= 0 or absent, got {value!r}")


@dataclass(frozen=True)
class Measurement:
    """One probe of one peer. A failed probe has ok=False, an `error` saying why,
    and no figures but how long it ran (`duration_s`, a bandwidth test's hold on the
    link). Rates are bits/s, times seconds, loss a fraction in [0, 1]; `bytes_sent`
    what the reading was taken over (a look's last train); a look's rtt_min_s
    is its last train's answer time less its crossing (`probe.train`)."""

    peer: str
    kind: str
    ok: bool = True
    error: str = ""
    bandwidth_bps: float | None = None
    rtt_min_s: float | None = None
    rtt_p50_s: float | None = None
    rtt_p99_s: float | None = None
    loss: float | None = None
    alpha_s: float | None = None
    beta_s_per_byte: float | None = None
    streams: int | None = None
    reverse: bool | None = None
    duration_s: float | None = None
    bytes_sent: int | None = None
    ts: float | None = None
    id: int | None = None

    def __post_init__(self) -> None:
        if not self.peer:
            raise ValueError("peer: must not be empty")
        if self.kind not in MEASUREMENT_KINDS:
            raise ValueError(f"kind: must be one of {', '.join(MEASUREMENT_KINDS)}, got {self.kind!r}")
        if not self.ok and not self.error:
            raise ValueError("error: a failed measurement must say why")
        for name in ("bandwidth_bps", "rtt_min_s", "rtt_p50_s", "rtt_p99_s", "alpha_s",
                     "beta_s_per_byte", "duration_s", "bytes_sent"):
            _optional_nonnegative(name, getattr(self, name))
        if self.loss is not None and not 0.0 <= self.loss <= 1.0:
            raise ValueError(f"loss: must be in [0, 1], got {self.loss!r}")


@dataclass(frozen=True)
class DecisionRecord:
    """A decision the agent gave a job, and when."""

    job_id: str
    decision: Decision
    ts: float | None = None
    id: int | None = None


@dataclass(frozen=True)
class StepAggregate:
    """Steps step_first..step_last (count of them reported) of one epoch that ran
    the same compression (family, param) and collective: means of their times
    and gains, total bytes."""

    job_id: str
    step_first: int
    step_last: int
    epoch: int
    family: str
    param: float
    collective: str
    count: int
    mean_t_comp_s: float
    mean_t_sync_s: float
    mean_gain: float
    mean_t_compute_s: float = 0.0
    bytes_sent: int = 0
    ts: float | None = None
    id: int | None = None

    @property
    def choice(self) -> Choice:
        return Choice.of(self.family, self.param, self.collective)


@dataclass(frozen=True)
class EmulationStep:
    """One step of a traffic-emulation schedule applied to an interface.
    netns is "" for the root namespace; absent figures were not shaped."""

    interface: str
    step_index: int
    netns: str = ""
    rate_bps: float | None = None
    delay_s: float | None = None
    jitter_s: float | None = None
    loss: float | None = None
    ts: float | None = None
    id: int | None = None

    def __post_init__(self) -> None:
        if not self.interface:
            raise ValueError("interface: must not be empty")
        if self.step_index < 0:
            raise ValueError(f"step_index: must be >= 0, got {self.step_index!r}")
        for name in ("rate_bps", "delay_s", "jitter_s"):
            _optional_nonnegative(name, getattr(self, name))
        if self.loss is not None and not 0.0 <= self.loss <= 1.0:
            raise ValueError(f"loss: must be in [0, 1], got {self.loss!r}")


@dataclass(frozen=True)
class JobRecord:
    """A registered job; `ended` (Unix seconds) and `end_reason` once it ended."""

    job_id: str
    spec: dict[str, Any]
    created: float
    ended: float | None = None
    end_reason: str = ""

    @property
    def running(self) -> bool:
        return self.ended is None


def aggregate_steps(job_id: str, reports: Iterable[StepReport]) -> list[StepAggregate]:
    """Group `reports` by (epoch, compression, collective), in order of first appearance."""
    groups: dict[tuple[int, Choice], list[StepReport]] = {}
    for r in reports:
        groups.setdefault((r.epoch, r.choice), []).append(r)
    out = []
    for (epoch, choice), rs in groups.items():
        n = len(rs)
        out.append(StepAggregate(
            job_id=job_id, step_first=min(r.step for r in rs), step_last=max(r.step for r in rs),
            epoch=epoch, family=choice.compression.family, param=choice.compression.param,
            collective=choice.collective, count=n,
            mean_t_comp_s=sum(r.t_comp_s for r in rs) / n,
            mean_t_sync_s=sum(r.t_sync_s for r in rs) / n,
            mean_gain=sum(r.gain for r in rs) / n,
            mean_t_compute_s=sum(r.t_compute_s for r in rs) / n,
            bytes_sent=sum(r.bytes_sent for r in rs),
        ))
    return out
