"""Running a schedule on a shaper.

    emulator = Emulator(schedule, Shaper("eth0", netns="n1"), on_step=record)
    emulator.run(stop_event, on_progress=print)   # time-keyed: blocks until done
    emulator.advance_epoch(3)                      # epoch-keyed: the job's epoch

Time-keyed steps start at fixed offsets from the start (offsets are summed
durations, so lateness of one step does not delay the next). Epoch-keyed steps
change only when `advance_epoch` is called: the step in force at epoch e is the
last one whose epoch is <= e (within the round); after the last round the last
step stays. Each step applied is passed to `on_step` as an `AppliedStep` (the
CLI and the agent record it in the store). Restoring the link afterwards is the
caller's business (`revert.session`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from flexcomm.emulation.schedule import Schedule, Step
from flexcomm.emulation.shaping import LinkState, Shaper

PROGRESS_EVERY_S = 0.5
KEEP_APPLIED = 10_000  # steps `run` returns at most (the latest)


@dataclass(frozen=True)
class AppliedStep:
    """A step put on the link: `step_index` counts from 0 in the file, `round`
    from 0; `applied_at` is wall-clock time (s since the epoch)."""

    step_index: int
    round: int
    state: LinkState
    applied_at: float
    epoch: int | None = None


@dataclass(frozen=True)
class Progress:
    step_number: int  # from 1
    steps: int
    round: int  # from 0
    rounds: int | None  # None: forever
    state: LinkState
    step_left_s: float
    total_left_s: float | None  # None: forever

    def line(self) -> str:
        rounds = "" if self.rounds == 1 else (
            f" round {self.round + 1}/{self.rounds or '∞'}")
        total = "" if self.total_left_s is None else f", {self.total_left_s:.1f} s in all"
        return (f"step {self.step_number}/{self.steps}{rounds}: {self.state.describe()}"
                f" | {self.step_left_s:.1f} s left in step{total}")


class Emulator:
    def __init__(self, schedule: Schedule, shaper: Shaper,
                 on_step: Callable[[AppliedStep], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.schedule = schedule
        self.shaper = shaper
        self.on_step = on_step
        self.clock = clock
        self.current: AppliedStep | None = None

    def _apply(self, step: Step, round_: int, epoch: int | None = None) -> AppliedStep:
        self.shaper.apply(step.state)
        applied = AppliedStep(step.number - 1, round_, step.state, time.time(), epoch)
        self.current = applied
        if self.on_step is not None:
            self.on_step(applied)
        return applied

    def run(self, stop: threading.Event | None = None,
            on_progress: Callable[[Progress], None] | None = None,
            start: float | None = None) -> list[AppliedStep]:
        """Apply a time-keyed schedule, each step at its offset from `start` (on
        the emulator's clock; default now), and return the steps applied (the
        latest KEEP_APPLIED); returns early when `stop` is set."""
        if self.schedule.by_epoch:
            raise ValueError(f"schedule: {self.schedule.path} is keyed by epoch; "
                             "drive it with advance_epoch()")
        stop = stop or threading.Event()
        start = self.clock() if start is None else start
        total = (None if self.schedule.repeat is None
                 else self.schedule.round_seconds * self.schedule.repeat)
        applied: deque[AppliedStep] = deque(maxlen=KEEP_APPLIED)  # "forever" runs forever
        for offset, round_, step in self.schedule.timeline():
            if self._wait_until(start + offset, stop):
                return list(applied)
            applied.append(self._apply(step, round_))
            end = start + offset + (step.duration_s or 0.0)
            while not stop.is_set() and (left := end - self.clock()) > 0:
                if on_progress is not None:
                    elapsed = self.clock() - start
                    on_progress(Progress(
                        step.number, len(self.schedule.steps), round_, self.schedule.repeat,
                        step.state, left, None if total is None else max(total - elapsed, 0.0)))
                stop.wait(min(PROGRESS_EVERY_S, left))
        return list(applied)

    def _wait_until(self, deadline: float, stop: threading.Event) -> bool:
        """Sleep until `deadline` (monotonic); True if `stop` was set meanwhile."""
        while (left := deadline - self.clock()) > 0:
            if stop.wait(left):
                return True
        return stop.is_set()

    def step_for_epoch(self, epoch: int) -> tuple[Step, int] | None:
        """The (step, round) in force at `epoch` of an epoch-keyed schedule."""
        if epoch < 0:
            raise ValueError(f"epoch: must be >= 0, got {epoch}")
        period, steps, repeat = self.schedule.epoch_period, self.schedule.steps, self.schedule.repeat
        round_, position = divmod(epoch, period)
        if repeat is not None and round_ >= repeat:
            return steps[-1], repeat - 1
        started = [s for s in steps if (s.epoch or 0) <= position]
        if started:
            return started[-1], round_
        return (steps[-1], round_ - 1) if round_ > 0 else None

    def advance_epoch(self, epoch: int) -> AppliedStep | None:
        """The job reached `epoch`: apply the step in force then, if it is not
        the one already applied. Returns the step applied, or None."""
        if not self.schedule.by_epoch:
            raise ValueError(f"schedule: {self.schedule.path} is keyed by time, not by epoch")
        found = self.step_for_epoch(epoch)
        if found is None:
            return None
        step, round_ = found
        current = self.current
        if current is not None and (current.step_index, current.round) == (step.number - 1, round_):
            return None
        return self._apply(step, round_, epoch)
