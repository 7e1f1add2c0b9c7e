"""What one step ran and measured on this rank, and the timers that fill it.

Times are host `perf_counter` readings. `timed(stats, "t_comp_s")` adds a block's
duration to a field; `timed(stats, "t_sync_s")` and `sync_timer(stats)` (started
when a collective is launched, called when its data has arrived) record the
interval a collective was in flight. A step's t_sync_s is the union of those
intervals: the buckets of a DDP step queue behind each other on the backend,
so summing each one's launch-to-arrival would count the waits twice.
Collective callbacks run on the backend's threads, hence the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from flexcomm.policy.types import Compression


@dataclass
class StepStats:
    """What one step ran and measured on this rank (summed over its buckets).

    t_sync_s is the wall time some collective of the step was in flight;
    t_comp_s sums compression and decompression; t_probe_s is the time spent
    reading the probes' gains (rank 0, once per probe interval), not counted in
    t_comp_s; t_compute_s is the rest of the wall time from this step's start to
    the next one's (forward, backward, optimizer; known once the next step starts,
    on rank 0). bytes_sent is this rank's payload (values, indices or factors it
    contributes), the message size M of the cost model.
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
    probes: list[tuple[dict[str, float], float]] = field(default_factory=list)
    sync_intervals: list[tuple[float, float]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def compression(self) -> Compression:
        return Compression(self.family, self.param)

    @property
    def gain(self) -> float:
        """||g_c||^2 / ||g_e||^2 over the whole step (1 when nothing was compressed)."""
        if self.norm_e <= 0.0:
            return 1.0
        return min(1.0, self.norm_c / self.norm_e)

    @property
    def t_sync_s(self) -> float:
        """The union of the intervals a collective of this step was in flight."""
        with self._lock:
            intervals = sorted(self.sync_intervals)
        total, reach = 0.0, float("-inf")
        for start, end in intervals:
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total

    def add(self, **seconds: float) -> None:
        """Add to time fields (t_comp_s=..., t_sync_s=... as an interval ending
        now); safe from callbacks."""
        now = time.perf_counter()
        with self._lock:
            for name, value in seconds.items():
                if name == "t_sync_s":
                    self.sync_intervals.append((now - value, now))
                else:
                    setattr(self, name, getattr(self, name) + value)


@contextmanager
def timed(stats: StepStats, field_name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stats.add(**{field_name: time.perf_counter() - t0})


def sync_timer(stats: StepStats) -> Callable[[torch.Tensor], torch.Tensor]:
    """Start timing a collective now; the returned pass-through, called when its
    data arrived, records the interval in between."""
    t_launch = time.perf_counter()

    def arrived(t: torch.Tensor) -> torch.Tensor:
        stats.add(t_sync_s=time.perf_counter() - t_launch)
        return t

    return arrived
