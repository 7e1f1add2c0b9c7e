"""What one step ran and measured on this rank, and the timers that fill it.

A step records spans and readings as its work is launched and folds them into
numbers once the device has done that work (`resolve`, which never waits):

- `timed(stats, "t_comp_s", like)` times a block; `sync_timer(stats, like)`
  (started when a collective is launched, called when its data has arrived)
  times the interval a collective was in flight. On CPU tensors the clock is
  the host's; on CUDA tensors it is CUDA events on the current stream, since on
  a GPU the host only launches the work (client/device.py).
- `add_norms(e=..., c=...)` takes ||g_e||^2 and ||g_c||^2 of a bucket as device
  scalars, `add_probe(...)` the gains of the probed compressions; they reach the
  host by one copy per step that no one waits for (`seal`, at the step's end).

A step's t_sync_s is the union of its collectives' intervals: the buckets of a
DDP step queue behind each other on the backend, so summing each one's
launch-to-arrival would count the waits twice. Collective callbacks run on the
backend's threads, hence the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from flexcomm.client.device import HostClock, Later, clock_for
from flexcomm.policy.types import Choice, Compression


class Pending(Protocol):
    """Device results a step folds in once they reached the host."""

    def ready(self) -> bool: ...

    def fold(self, stats: StepStats) -> None: ...


@dataclass
class StepStats:
    """What one step ran and measured on this rank (summed over its buckets).

    t_sync_s is the time some collective of the step was in flight; t_comp_s sums
    compression and decompression; t_probe_s is the time spent reading the
    probes' gains (rank 0, once per probe interval), not counted in t_comp_s;
    t_compute_s is the rest of the wall time from this step's start to the next
    one's (forward, backward, optimizer; known once the next step starts, on rank
    0; `compute_s`). bytes_sent is this rank's payload (values, indices or factors it
    contributes), the message size M of the cost model. The times, norms and
    probes are final once `resolve()` returned True.
    """

    step: int
    family: str
    param: float
    collective: str
    version: int
    roots: list[int] = field(default_factory=list)
    t_comp_s: float = 0.0
    t_probe_s: float = 0.0
    t_compute_s: float = 0.0
    bytes_sent: int = 0
    norm_e: float = 0.0
    norm_c: float = 0.0
    norm_g: float = 0.0  # ||g||^2 before any residual joined it, on steps that read gains (rank 0)
    probes: list[tuple[dict[str, float], float]] = field(default_factory=list)
    sync_intervals: list[tuple[float, float]] = field(default_factory=list, repr=False)
    host_spans: list[tuple[float, float]] = field(default_factory=list, repr=False)  # every span, host clock
    device_spans: list[tuple[float, float]] = field(default_factory=list, repr=False)  # device clock, from origin
    began: float | None = field(default=None, repr=False)  # host clock at the step's start
    _spans: list[tuple[str, Any, Any, Any]] = field(default_factory=list, repr=False)
    _norms: tuple[list[torch.Tensor], ...] = field(default_factory=lambda: ([], [], []), repr=False)
    _pending: list[Pending] = field(default_factory=list, repr=False)
    _origin: tuple[Any, Any] | None = field(default=None, repr=False)
    resolved: bool = field(default=False, repr=False)  # resolve() has folded everything recorded
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def compression(self) -> Compression:
        return Compression(self.family, self.param)

    @property
    def choice(self) -> Choice:
        return Choice(self.compression, self.collective)

    @property
    def gain(self) -> float:
        """||g_c||^2 / ||g_e||^2 over the whole step (1 when nothing was compressed)."""
        self.resolve()
        if self.norm_e <= 0.0:
            return 1.0
        return min(1.0, self.norm_c / self.norm_e)

    @property
    def t_sync_s(self) -> float:
        """The union of the intervals a collective of this step was in flight."""
        self.resolve()
        with self._lock:
            intervals = list(self.sync_intervals)
        return covered(intervals)

    def compute_s(self, next_began: float) -> float:
        """t_compute_s, once the next step began at `next_began` (host clock): the
        part of the time between the two starts that no span of this step covers.
        Overlapping spans count once (a bucket compressed while the one before is in
        flight, a callback preempted by a busy host), and host spans only inside
        that period (a completion stamped after the next step began), so on the
        host it is always > 0: the step's first span starts after it began. A
        device clock's spans cannot be placed on the host's timeline: there it is
        the period less their union, 0 (unknown) when that is not positive."""
        if self.began is None:
            return 0.0
        busy = covered(self.host_spans, self.began, next_began) + covered(self.device_spans)
        return max(0.0, next_began - self.began - busy)

    # -- recording (hook thread and collective callbacks) ----------------------
    def span(self, field_name: str, clock: Any, start: Any, end: Any) -> None:
        """A span of `clock` (client/device.py) to add to t_comp_s / t_probe_s, or
        to t_sync_s's intervals."""
        with self._lock:
            self._spans.append((field_name, clock, start, end))

    def add_norms(self, e: torch.Tensor | None = None, c: torch.Tensor | None = None,
                  g: torch.Tensor | None = None) -> None:
        """Squared norms of one bucket (0-dim tensors on its device)."""
        with self._lock:
            for kept, norm in zip(self._norms, (e, c, g), strict=True):
                if norm is not None:
                    kept.append(norm)

    def add_probe(self, pending: Pending) -> None:
        with self._lock:
            self._pending.append(pending)

    # -- reading (once the device has done the work) ---------------------------
    def seal(self) -> None:
        """Start copying the norms recorded so far to the host (the step's end)."""
        with self._lock:
            norms, self._norms = self._norms, ([], [], [])
        if any(norms):
            self.add_probe(_Norms(*norms))

    def ready(self) -> bool:
        with self._lock:
            spans, pending = list(self._spans), list(self._pending)
        return all(clock.done(start) and clock.done(end) for _, clock, start, end in spans) and all(
            p.ready() for p in pending)

    def resolve(self, wait: bool = False) -> bool:
        """Fold every span and reading into the fields if the device has done them
        all: False (and nothing folded) while something is pending, unless `wait`
        (then it waits for the device: at close, never in a step)."""
        self.seal()
        if not wait and not self.ready():
            return False
        with self._lock:
            spans, self._spans = self._spans, []
            pending, self._pending = self._pending, []
        for field_name, clock, start, end in spans:
            clock.wait(end)
            interval = (self._since_origin(clock, start), self._since_origin(clock, end))
            if isinstance(clock, HostClock):
                self.host_spans.append((start, end))
            else:
                self.device_spans.append(interval)
            if field_name == "t_sync_s":
                self.sync_intervals.append(interval)
            else:
                setattr(self, field_name, getattr(self, field_name) + clock.seconds(start, end))
        for p in pending:
            p.fold(self)
        self.resolved = True
        return True

    def _since_origin(self, clock: Any, mark: Any) -> float:
        if self._origin is None:
            self._origin = (clock, mark)
        return clock.seconds(self._origin[1], mark)


def covered(intervals: list[tuple[float, float]], low: float = float("-inf"), high: float = float("inf")) -> float:
    """The length of the union of `intervals` (start, end) within [low, high]."""
    total, reach = 0.0, low
    for start, end in sorted(intervals):
        end = min(end, high)
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class _Norms:
    """A step's bucket norms on their way to the host."""

    def __init__(self, e: list[torch.Tensor], c: list[torch.Tensor], g: list[torch.Tensor]) -> None:
        self.ends = (len(e), len(e) + len(c))
        self.later = Later(e + c + g)

    def ready(self) -> bool:
        return self.later.ready()

    def fold(self, stats: StepStats) -> None:
        values = self.later.numbers()
        e, c = self.ends
        stats.norm_e += sum(values[:e])
        stats.norm_c += sum(values[e:c])
        stats.norm_g += sum(values[c:])


@contextmanager
def timed(stats: StepStats, field_name: str, like: torch.Tensor) -> Iterator[None]:
    """Time a block of work on `like`'s device into `field_name`."""
    clock = clock_for(like)
    start = clock.mark()
    try:
        yield
    finally:
        stats.span(field_name, clock, start, clock.mark())


def sync_timer(stats: StepStats, like: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Start timing a collective on `like`'s device now; the returned
    pass-through, called when its data arrived, records the interval in between."""
    clock = clock_for(like)
    start = clock.mark()

    def arrived(t: torch.Tensor) -> torch.Tensor:
        stats.span("t_sync_s", clock, start, clock.mark())
        return t

    return arrived
