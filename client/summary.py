"""What the job chose, for people: a line per real change of decision, the
summary of a run (`state.summary()`), and scalars for a TensorBoard-like writer.

- The change line: rank 0 logs one line (logger `flexcomm.client.decisions`, at
  INFO) when the adopted decision runs something else than before, with the
  policy's reason; an agreement that keeps the choice says nothing. When the
  application has configured no logging at all, `show_decisions()` gives that
  logger a handler of its own on stderr, so the lines show by default.
- `JobSummary` counts each finished step under the choice it ran: steps, wall
  seconds (from its start to the next step's), bytes sent and the bytes a dense
  step would have sent; and the steps the policy ran to explore (rank 0).
- `ScalarWriter` writes each finished step's figures to anything with
  `add_scalar(tag, value, step)` (torch.utils.tensorboard's SummaryWriter, ...).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from flexcomm.client.stats import StepStats
from flexcomm.policy.types import Decision

log = logging.getLogger("flexcomm.client.decisions")


def show_decisions() -> None:
    """Make the change lines visible when nothing else would show them."""
    if log.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("flexcomm: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def log_change(step: int, before: Decision, after: Decision) -> bool:
    """One line when `after` runs something else than `before`, or is the source's
    first decision; True when it said one."""
    first = before.version == 0 and after.version > 0
    if after.same_choice(before) and not first:
        return False
    log.info("step %d: adopted decision v%d: %s over %s, root %s (was %s over %s): %s", step, after.version,
             after.compression.name, after.collective, after.root, before.compression.name, before.collective,
             after.reason or "no reason given")
    return True


@dataclass
class ChoiceTotals:
    steps: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0
    dense_bytes: int = 0


class JobSummary:
    """Per choice: steps, wall seconds, bytes sent and a dense step's bytes."""

    def __init__(self) -> None:
        self.choices: dict[str, ChoiceTotals] = {}
        self.exploring_steps = 0
        self.steps = 0
        self._open: tuple[StepStats, ChoiceTotals] | None = None  # its wall time waits for the next start

    def add(self, stats: StepStats, dense_bytes: int, exploring: bool) -> None:
        label = f"{stats.compression.name}@{stats.collective}"
        totals = self.choices.setdefault(label, ChoiceTotals())
        totals.steps += 1
        totals.bytes_sent += stats.bytes_sent
        totals.dense_bytes += dense_bytes
        self.steps += 1
        self.exploring_steps += bool(exploring)
        if self._open is not None:
            last, last_totals = self._open
            if last.began is not None and stats.began is not None:
                last_totals.seconds += max(0.0, stats.began - last.began)
        self._open = (stats, totals)

    def as_dict(self) -> dict[str, Any]:
        sent = sum(t.bytes_sent for t in self.choices.values())
        dense = sum(t.dense_bytes for t in self.choices.values())
        return {
            "steps": self.steps,
            "choices": {label: {"steps": t.steps, "seconds": t.seconds, "bytes_sent": t.bytes_sent,
                                "dense_bytes": t.dense_bytes} for label, t in self.choices.items()},
            "bytes_sent": sent,
            "dense_bytes": dense,
            "bytes_saved": dense - sent,
            "bytes_saved_share": (dense - sent) / dense if dense else 0.0,
            "exploring_share": self.exploring_steps / self.steps if self.steps else 0.0,
        }


class Scalars(Protocol):
    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> Any: ...


class ScalarWriter:
    """A finished step's figures as scalars under `flexcomm/` (rank 0 writes)."""

    def __init__(self, writer: Scalars) -> None:
        if not callable(getattr(writer, "add_scalar", None)):
            raise ValueError(f"writer: needs an add_scalar(tag, value, step) method, got {writer!r}")
        self.writer = writer

    def write(self, stats: StepStats, version: int) -> None:
        for tag, value in (("t_sync_s", stats.t_sync_s), ("t_comp_s", stats.t_comp_s), ("gain", stats.gain),
                           ("bytes_sent", stats.bytes_sent), ("decision_version", version)):
            self.writer.add_scalar(f"flexcomm/{tag}", float(value), stats.step)
