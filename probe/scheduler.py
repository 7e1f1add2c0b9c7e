"""When to probe whom: periodic latency and bandwidth probes of a node's peers.

One thread (`start`/`stop`) runs `tick()` in a loop; `tick()` does whatever is
due and returns how long until the next thing is, so the logic can be driven by
a test with a fake clock (`clock`) and no thread at all. A thread rather than
asyncio: the probes block (iperf3 is a subprocess that runs for seconds), and a
thread keeps them off the agent's event loop without changing how they are written.

Rules:
- Latency bursts are cheap and frequent (`latency_interval_s`, default 10 s).
- Bandwidth tests are rare while nothing moves (`bandwidth_interval_s`, default
  300 s, a new peer's first too), and asked for at once when the caller wants a
  figure (`request_bandwidth`: a job registered, or its own sync times moved).
  They are exclusive: this scheduler runs one at a time, a process-wide lock
  per target refuses a second one to the same target (an on-demand probe,
  say), and a target whose iperf3 server is busy with another node's test
  answers IperfBusy. Busy means
  back off (`backoff_s`, doubling up to `backoff_max_s`) and retry; no
  measurement is recorded for it. A failed test is recorded and retried on the
  same backoff.
- Duty cycle: bandwidth tests may use at most `duty_cycle` (default 1%) of wall
  time in any `budget_window_s` window (default 120 s, so 1.2 s of tests per two
  minutes: a few sized tests, and the share holds over any run of minutes); a
  test that would exceed it waits. The time charged is the test's
  real elapsed time, failed tests included (but for one that never connected:
  nothing crossed the path), and a measurement's duration_s says it.
- A test is sized by the path as it is now: a pilot of PILOT_BYTES (a few ms at
  1 Gbit/s, a fifth of a second at 10 Mbit/s), then a test sized to take about
  `sized_test_s` at the pilot's reading (iperf3 -n BYTES), unless the pilot took
  that long itself (a slow path: its reading is the figure); a test that ran
  much shorter than it was sized for is sized again by its own reading. Sized
  by the rate the job's estimate expected instead, a test of a path that had
  slowed ran to its cut-off (the cnn lab's 1-4 s tests, 5% of a run's wall
  time), and one sized for a path that had quickened was repeated at twice its
  size (0.6 s of the digits lab's 29 s runs). A test sized for a far faster path than it finds (a
  pilot that passed inside a policer's burst) overruns its timeout and is
  ended: past its first second, its sender's rate over the rest is the reading
  (0.91-1.13x the shaped rate of 10, 100 and 1000 Mbit/s links, ended at 1.5-4 s;
  the first second holds the socket buffer filling, 2x); ended before that, it
  is a failed test. With `sized_test_s` 0 every test runs `test_duration_s`.
- A look (`request_look`) is a few packet trains to the peer's look server
  (probe/train.py, `sized_look`): whether a path moved, for a job whose syncs
  cannot show it (too small, or mostly the host's work), run while the ask is
  fresh (LOOK_FRESH_S, counted from when the looks' pace allows one, at most
  LOOK_PACE_WAIT_MAX_S after the ask). Its
  first train is small; a train that crossed in under
  LOOK_HELD_S is followed by one sized to twice that at its reading, up to
  LOOK_MAX_BYTES. Looks share the duty budget, charged the time their trains
  held the link (the receiver's stamps say), and after each the next waits
  1 / `look_duty_cycle` times as long (a look held a lab link 2-5 ms at 20 Mbit/s
  to 1 Gbit/s: with the default 0.5%, one every 0.4-2 s at most). A look that read nothing (no answer) is charged
  LOOK_RECKONED_S. A look that follows up a reading (`follow_up`: another
  path's look read a move, or the job's syncs asked), at a peer other than
  the one looked at last, may run before that pace allows, on a second share
  of its own: follow-ups of LOOK_AHEAD_S of the pace at once, refilled at
  `look_duty_cycle`. They do not hold the paced looks off: borrowed from
  them, a round after one move left none for the next (the cnn lab's looks
  came 2.6 s apart after one).
- This host's own addresses are never probed (`set_peers` leaves them out).
- Every interval is jittered by +-`jitter` (a fraction) so nodes do not probe in
  lockstep.
- A probe that fails (peer down, iperf3 error, timeout) is recorded as a failed
  measurement and the schedule goes on.

Measurements go to the store (if given), then `on_measurement` (if given);
`on_bandwidth_start` (if given) hears of each bandwidth test as it starts (peer,
unix time), so what shares the link meanwhile is known before the measurement
comes, and (peer, None) when the peer's server turned it away. The peer set can
change while it runs (`set_peers`, e.g. as jobs come and go), and
`measure_bandwidth(peer)` is an on-demand test under the same exclusivity and
budget.

    sched = ProbeScheduler(peers, ProbeConfig(), store=store, on_measurement=callback).start()
    ...
    sched.stop()
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from flexcomm.probe.addresses import is_local
from flexcomm.probe.iperf import (
    DEFAULT_PORT,
    ClientAuth,
    IperfBusy,
    IperfTimeout,
    IperfUnconnected,
    bandwidth_measurement,
    run_test,
)
from flexcomm.probe.latency import latency_measurement, rtt_burst
from flexcomm.probe.train import DATAGRAM_BYTES, DEFAULT_LOOK_PORT, MIN_DATAGRAMS, TrainLookError, train_look
from flexcomm.store import BANDWIDTH, LATENCY, LOOK, Measurement, Store

log = logging.getLogger(__name__)

Probe = Callable[[str], Measurement]
# The pilot that sizes a test, and the least a test sends. On the lab's HTB links it
# took 8 ms at 1 Gbit/s and read 1.37x the shaped rate (the shaper's burst), 26 ms
# at 100 Mbit/s (1.16x), 115 ms at 20 Mbit/s (1.04x) and 223 ms at 10 (1.00x).
PILOT_BYTES = 256 << 10
SIZED_TIMEOUT_FACTOR = 4
# A test that took this share of `sized_test_s` is the reading. One that took less
# was sized by a reading too low (a pilot on the lab's busy host read a fifth of
# 1 Gbit/s, and the test it sized, 30 ms, read the shaper's burst, 1.11x) and is
# sized again by its own reading, at most SIZED_TESTS times after the pilot.
LONG_ENOUGH = 2 / 3
SIZED_TESTS = 2
# What the budget reckons a look at before it runs (charged what it took).
LOOK_RECKONED_S = 0.05
# A look's answer later than this is none (its first train takes 7 ms at 20 Mbit/s).
LOOK_TIMEOUT_S = 1.0
# A look's trains: the first of MIN_DATAGRAMS; one that held the link less than
# LOOK_HELD_S is read again by one of twice that at its reading, at most
# LOOK_TRAINS in all and LOOK_MAX_BYTES each. Through the lab's HTB links beside a
# CI run with two hogs, 256 KB trains read 0.93-0.97x the rate at 20-980 Mbit/s
# and 64 KB ones 0.97x at 20-410 but 1.5-1.9x at 980 (the shaper passes 0.5 ms
# of it in clumps); a look of one 256 KB train held a 20 Mbit/s link 108 ms, and
# the 0.25% duty cycle then allowed none for 43 s. A train is at most LOOK_GROWTH
# times the one before: a first train inside the shaper's burst reads the line, and
# sized by it a 256 KB train held a 160 Mbit/s link 13 ms (none for 5 s after).
LOOK_HELD_S = 0.002
LOOK_TRAINS = 3
LOOK_MAX_BYTES = 256 << 10
LOOK_GROWTH = 4
# A look asked for longer ago than this (counted from when the looks' pace first
# allows one) is no longer wanted: a job's estimate asks at every report message
# while its syncs show nothing of the path (run later, a dense job's look asked on
# an 820 Mbit/s link, where its syncs were mostly the host's work, shared the link
# with its syncs on the 160 Mbit/s phase that followed). Counted from the ask, one
# made while a 6 ms look held the next off 1.2 s lapsed before it could run.
LOOK_FRESH_S = 1.0
# The pace extends an ask's freshness by at most this: a look that held a slow link
# long holds the next off for seconds, and by then the path may be another's.
LOOK_PACE_WAIT_MAX_S = 2.0
DUTY_CYCLE = 0.01  # the share of wall time bandwidth tests may take
# Of it, looks may take this much. With what the syncs ask put to a look first,
# tests took 0-0.2% of the cnn lab's wall time; at 0.25% looks took 0.24% and came
# once per 2.7 s, so three paths were each looked at once per 4-6 s phase; at 0.5%
# the estimate followed 15 of 24 phases against 10 of 24 (3 repeats each).
LOOK_DUTY_CYCLE = 0.005
# The follow-ups' own share at once, in seconds of the looks' pace: the rest of a
# round of a job's paths once one read a move. Paced alone, the cnn lab's three
# paths were looked at over 1.2-2.4 s after a move, and the MOO's figure came 2.4 s
# into a 2.7 s phase (160 Mbit/s) and never within 10% in two of eight phases.
LOOK_AHEAD_S = 2.0


@dataclass(frozen=True)
class ProbeConfig:
    """How and how often to probe. Times in seconds, duty_cycle and jitter fractions."""

    iperf_port: int = DEFAULT_PORT
    latency_port: int = DEFAULT_PORT
    look_port: int = DEFAULT_LOOK_PORT  # UDP, the peers' look servers
    test_duration_s: float = 1.0
    # 0: every test runs test_duration_s. A 0.15 s test read 0.98-1.03x the shaped
    # rate of the lab's 100 and 1000 Mbit/s links (TCP's goodput is 0.956x).
    sized_test_s: float = 0.15
    streams: int = 1
    reverse: bool = False
    latency_count: int = 10
    latency_timeout_s: float = 1.0
    connect_timeout_s: float = 3.0
    latency_interval_s: float = 10.0
    bandwidth_interval_s: float = 300.0
    jitter: float = 0.1
    duty_cycle: float = DUTY_CYCLE
    look_duty_cycle: float = LOOK_DUTY_CYCLE  # the share of wall time looks may take (charged to the budget too)
    budget_window_s: float = 120.0
    backoff_s: float = 2.0
    backoff_max_s: float = 60.0
    netns: str | None = None  # probe from inside this namespace (lab, tests)
    auth: ClientAuth | None = None  # iperf3's own authentication, when the peers' servers ask for it

    def __post_init__(self) -> None:
        for name in ("test_duration_s", "latency_timeout_s", "connect_timeout_s", "latency_interval_s",
                     "bandwidth_interval_s", "budget_window_s", "backoff_s", "backoff_max_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if self.test_duration_s != int(self.test_duration_s):
            raise ValueError(f"test_duration_s: iperf3 runs whole seconds, got {self.test_duration_s!r}")
        if not (math.isfinite(self.sized_test_s) and 0 <= self.sized_test_s <= self.test_duration_s):
            raise ValueError(f"sized_test_s: must be in [0, test_duration_s], got {self.sized_test_s!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter: must be in [0, 1), got {self.jitter!r}")
        if not 0 < self.duty_cycle <= 1:
            raise ValueError(f"duty_cycle: must be in (0, 1], got {self.duty_cycle!r}")
        if not 0 <= self.look_duty_cycle <= 1:
            raise ValueError(f"look_duty_cycle: must be in [0, 1], got {self.look_duty_cycle!r}")
        if self.budget_s < self.test_duration_s:
            raise ValueError(
                f"duty_cycle: {self.duty_cycle:g} of a {self.budget_window_s:g} s window is "
                f"{self.budget_s:g} s, less than one {self.test_duration_s:g} s bandwidth test"
            )

    @property
    def budget_s(self) -> float:
        """Seconds of bandwidth testing allowed per window."""
        return self.duty_cycle * self.budget_window_s


def iperf_test(config: ProbeConfig) -> Callable[[str, int | None], Measurement]:
    """One iperf3 test to a peer: sending so many bytes (then cut off at a few
    times `sized_test_s`), or None: `test_duration_s` long. Raises IperfError."""
    def test(peer: str, size: int | None) -> Measurement:
        # A sized test that cannot finish in a few times its length is a failed one: on
        # the loaded lab machine one ran 7 s, a minute of the duty budget.
        timeout = SIZED_TIMEOUT_FACTOR * config.sized_test_s + config.connect_timeout_s if size else None
        return bandwidth_measurement(run_test(
            peer, port=config.iperf_port, duration_s=config.test_duration_s, bytes_=size,
            streams=config.streams, reverse=config.reverse, timeout_s=timeout,
            connect_timeout_s=config.connect_timeout_s, netns=config.netns, auth=config.auth))
    return test


def iperf_probe(config: ProbeConfig) -> Probe:
    """The real bandwidth probe: iperf3, sized by a pilot (see the module
    docstring) unless `sized_test_s` is 0; raises IperfError on failure."""
    test = iperf_test(config)
    if not config.sized_test_s:
        return lambda peer: test(peer, None)
    return sized_probe(test, config.sized_test_s)


def packet_train_look(config: ProbeConfig) -> Probe:
    """The real look (`sized_look` of packet trains); raises TrainLookError when it read nothing."""
    def train(peer: str, size: int) -> Measurement:
        return train_look(peer, config.look_port, size, timeout_s=LOOK_TIMEOUT_S, netns=config.netns)
    return lambda peer: sized_look(train, peer)


def sized_look(train: Callable[[str, int], Measurement], peer: str) -> Measurement:
    """Trains to `peer` until one held the link LOOK_HELD_S at its reading (see
    LOOK_HELD_S; a gap a stalled host left in it does not count): the last one
    read, with duration_s the time all of them held the link (the first train's
    TrainLookError where it read nothing)."""
    size, held = MIN_DATAGRAMS * DATAGRAM_BYTES, 0.0
    m = None
    for _ in range(LOOK_TRAINS):
        try:
            m = train(peer, size)
        except TrainLookError:
            if m is None:
                raise
            break  # a later train lost: the last one read stands
        held += m.duration_s or 0.0
        if not m.bandwidth_bps or size >= LOOK_MAX_BYTES or 8 * m.bytes_sent / m.bandwidth_bps >= LOOK_HELD_S:
            break
        size = min(LOOK_MAX_BYTES, LOOK_GROWTH * size, int(m.bandwidth_bps / 8 * 2 * LOOK_HELD_S))
    return dataclasses.replace(m, duration_s=held)


def sized_probe(test: Callable[[str, int | None], Measurement], sized_test_s: float) -> Probe:
    """A probe that runs `test(peer, PILOT_BYTES)`, then `test(peer, bytes)` sized to
    last `sized_test_s` at the last reading, until a test took LONG_ENOUGH of
    `sized_test_s` (at most SIZED_TESTS after the pilot)."""
    def probe(peer: str) -> Measurement:
        size = PILOT_BYTES
        m = test(peer, size)
        for _ in range(SIZED_TESTS):
            rate = m.bandwidth_bps if m.ok else None
            if not rate or 8 * size / rate >= LONG_ENOUGH * sized_test_s:
                break
            size = sized_bytes(rate, sized_test_s)
            m = test(peer, size)
        return m
    return probe


def failed(peer: str, kind: str, exc: Exception) -> Measurement:
    """The record of a probe that raised `exc`."""
    return Measurement(peer=peer, kind=kind, ok=False, error=str(exc) or type(exc).__name__)


def cut_off_measurement(peer: str, cut: IperfTimeout) -> Measurement:
    """A bandwidth test ended at its timeout: its sender's rate past the first
    second, or a failed test where it has none (see the module docstring)."""
    if not cut.sent_bps:
        return failed(peer, BANDWIDTH, cut)
    log.info("%s: its sender's rate is the reading", cut)
    return Measurement(peer=peer, kind=BANDWIDTH, bandwidth_bps=cut.sent_bps, beta_s_per_byte=8.0 / cut.sent_bps)


def sized_bytes(rate_bps: float, seconds: float) -> int:
    """What a test of `seconds` at `rate_bps` sends, at least PILOT_BYTES."""
    return max(PILOT_BYTES, int(rate_bps / 8 * seconds))


def tcp_latency_probe(config: ProbeConfig) -> Probe:
    """The real latency probe: a burst of TCP connects."""
    def probe(peer: str) -> Measurement:
        return latency_measurement(rtt_burst(peer, config.latency_port, count=config.latency_count,
                                             timeout_s=config.latency_timeout_s, netns=config.netns))
    return probe


class TargetLocks:
    """One lock per bandwidth target, shared by everything in the process."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._busy: set[str] = set()

    @contextmanager
    def hold(self, target: str) -> Iterator[None]:
        """Hold `target` for one test; IperfBusy if someone in this process already does."""
        with self._guard:
            if target in self._busy:
                raise IperfBusy(f"bandwidth test to {target} already running in this process")
            self._busy.add(target)
        try:
            yield
        finally:
            with self._guard:
                self._busy.discard(target)


TARGET_LOCKS = TargetLocks()


@dataclass
class DutyBudget:
    """Bandwidth-test time used per sliding window: (start, seconds) of each test."""

    budget_s: float
    window_s: float
    used: deque[tuple[float, float]] = field(default_factory=deque)

    def _trim(self, now: float) -> None:
        while self.used and self.used[0][0] <= now - self.window_s:
            self.used.popleft()

    def used_s(self, now: float) -> float:
        self._trim(now)
        return sum(s for _, s in self.used)

    def wait_for(self, cost_s: float, now: float) -> float:
        """Seconds from `now` until a test costing `cost_s` fits the budget."""
        self._trim(now)
        total = sum(s for _, s in self.used) + cost_s
        if total <= self.budget_s:
            return 0.0
        for start, seconds in self.used:  # oldest first, as each leaves the window
            total -= seconds
            if total <= self.budget_s:
                return max(start + self.window_s - now, 0.0)
        return self.window_s  # cost_s alone exceeds the budget (ProbeConfig refuses that)

    def charge(self, start: float, seconds: float) -> None:
        self.used.append((start, seconds))


@dataclass
class PeerSchedule:
    next_latency: float
    next_bandwidth: float
    failed_tries: int = 0  # busy or failed bandwidth tries in a row
    last_bandwidth: float = -math.inf  # when its last test (or busy attempt) started
    look_asked: float = -math.inf  # when a look was last asked for
    look_follow_up: bool = False  # that ask follows up a reading: it may run on the follow-ups' share


class ProbeScheduler:
    """Probes a set of peers on a schedule (see the module docstring).

    `peers` may start empty; `set_peers` changes the set at any time (from any
    thread) and wakes the loop, and `request_bandwidth` asks for tests now.
    Budget, locks and schedule are thread-safe, so `measure_bandwidth` may also be
    called on demand from another thread. `own_address(address)` says whether an
    address is this host's.
    """

    def __init__(self, peers: Iterable[str] = (), config: ProbeConfig | None = None, *,
                 store: Store | None = None,
                 on_measurement: Callable[[Measurement], None] | None = None,
                 on_bandwidth_start: Callable[[str, float | None], None] | None = None,
                 bandwidth_probe: Probe | None = None, latency_probe: Probe | None = None,
                 look_probe: Probe | None = None,
                 own_address: Callable[[str], bool] = is_local,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 locks: TargetLocks = TARGET_LOCKS) -> None:
        self.config = config or ProbeConfig()
        self.store = store
        self.on_measurement = on_measurement
        # (peer, unix time) just before each bandwidth test; (peer, None) if it did not run after all
        self.on_bandwidth_start = on_bandwidth_start
        self.own_address = own_address
        self.skipped: tuple[str, ...] = ()  # this host's own addresses among the peers asked for
        self.bandwidth_probe = bandwidth_probe or iperf_probe(self.config)
        self.latency_probe = latency_probe or tcp_latency_probe(self.config)
        self.look_probe = look_probe or packet_train_look(self.config)
        self.clock = clock
        self.rng = rng or random.Random()
        self.locks = locks
        self.budget = DutyBudget(self.config.budget_s, self.config.budget_window_s)
        self.next_look = -math.inf  # when the paced looks so far have had their share of the time
        self.next_follow_up = -math.inf  # as much, for the follow-ups' own share (LOOK_AHEAD_S ahead)
        self.last_looked: str | None = None  # the peer of the latest look
        self.busy_count = 0
        self._lock = threading.Lock()  # guards schedule, budget and rng
        self.schedule: dict[str, PeerSchedule] = {}
        self._stopping = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.set_peers(peers)

    def set_peers(self, peers: Iterable[str]) -> None:
        """Probe exactly `peers` from now on, but for this host's own addresses;
        new ones get their first latency probe within a second or so and their
        first bandwidth test when asked or on the schedule; peers kept keep
        their schedule."""
        peers = list(dict.fromkeys(peers))
        for p in peers:
            if not isinstance(p, str) or not p:
                raise ValueError(f"peers: each peer must be a non-empty address, got {p!r}")
        self.skipped = tuple(p for p in peers if self.own_address(p))
        peers = [p for p in peers if p not in self.skipped]
        with self._lock:
            now = self.clock()
            # A new peer's latency is probed within a second or so; its bandwidth
            # when a job's estimate asks (`request_bandwidth`) or on the schedule:
            # tested at once, a 4-node lab job's three new peers spent the whole
            # 120 s budget at its registration, and the test its syncs asked for
            # when the link recovered 15 s later waited 119 s.
            self.schedule = {p: self.schedule.get(p) or PeerSchedule(
                now + self._jittered(0.5), now + self._jittered(self.config.bandwidth_interval_s)) for p in peers}
        self._wake.set()

    def request_bandwidth(self, peers: Iterable[str]) -> float:
        """Test these peers (those probed) as soon as the duty budget allows.
        Returns the seconds until the budget has room for the first (inf: none probed)."""
        asked = []
        with self._lock:
            now = self.clock()
            for p in peers:
                sched = self.schedule.get(p)
                if sched is not None:
                    sched.next_bandwidth = min(sched.next_bandwidth, now)
                    asked.append(p)
        self._wake.set()
        return self._budget_wait() if asked else math.inf

    def request_look(self, peers: Iterable[str], follow_up: bool = False) -> None:
        """Look at these peers (those probed) when the looks' share and the duty
        budget allow, if still within LOOK_FRESH_S of this ask (or of when the
        looks' pace first allows one, at most LOOK_PACE_WAIT_MAX_S later).
        `follow_up`: the ask follows up a reading, and a peer other than the one
        looked at last may be looked at before the pace allows, on the
        follow-ups' own share."""
        if not self.config.look_duty_cycle:
            return
        with self._lock:
            now = self.clock()
            for p in peers:
                if (s := self.schedule.get(p)) is not None:
                    s.look_follow_up = follow_up or (s.look_follow_up and self._fresh_ask(p, s, now))
                    s.look_asked = now
        self._wake.set()

    def _looks_wanted(self) -> list[tuple[str, PeerSchedule]]:
        now = self.clock()
        return [(p, s) for p, s in self._peers() if self._fresh_ask(p, s, now)]

    def _look_paced(self, peer: str, sched: PeerSchedule) -> float:
        """When the looks' pace, or for a follow-up its own share, allows a look at `peer`."""
        if sched.look_follow_up and peer != self.last_looked:
            return min(self.next_look, self.next_follow_up - LOOK_AHEAD_S)
        return self.next_look

    def _fresh_ask(self, peer: str, sched: PeerSchedule, now: float) -> bool:
        """Whether the look asked of `peer` is still wanted at `now`: within
        LOOK_FRESH_S of when the looks' pace first allows it (at most
        LOOK_PACE_WAIT_MAX_S after the ask); none asked: no."""
        asked = sched.look_asked
        runnable = max(asked, min(self._look_paced(peer, sched), asked + LOOK_PACE_WAIT_MAX_S))
        return math.isfinite(asked) and now - runnable <= LOOK_FRESH_S

    # -- the logic -----------------------------------------------------------
    def _jittered(self, interval: float) -> float:
        j = self.config.jitter
        return interval * (1 + self.rng.uniform(-j, j))

    def _peers(self) -> list[tuple[str, PeerSchedule]]:
        with self._lock:
            return list(self.schedule.items())

    def tick(self) -> float:
        """Run every latency probe that is due and at most one bandwidth test;
        return seconds until something is next due."""
        for peer, sched in self._peers():
            if sched.next_latency <= self.clock():
                self._record(self._run(self.latency_probe, peer, LATENCY))
                with self._lock:
                    sched.next_latency = self.clock() + self._jittered(self.config.latency_interval_s)
        due = [(p, s) for p, s in self._peers() if s.next_bandwidth <= self.clock()]
        if due and self._budget_wait() == 0:
            # the peer tested longest ago goes first, so a tight budget starves no one
            self._bandwidth_turn(*min(due, key=lambda item: item[1].last_bandwidth))
        # A test waiting for the budget does not hold a look off: in the cnn lab one
        # asked with 0.26 s of the budget left waited 70 s, and no look ran meanwhile.
        elif self._budget_wait(LOOK_RECKONED_S) == 0:
            now = self.clock()
            paced = [(p, s) for p, s in self._looks_wanted() if self._look_paced(p, s) <= now]
            if paced:
                self._look_turn(*min(paced, key=lambda item: item[1].look_asked))
        now = self.clock()
        peers = self._peers()
        if not peers:
            return self.config.latency_interval_s
        budget_free = now + self._budget_wait()
        next_due = min(min(s.next_latency, max(s.next_bandwidth, budget_free)) for _, s in peers)
        if wanted := self._looks_wanted():
            paced = min(self._look_paced(p, s) for p, s in wanted)
            next_due = min(next_due, max(paced, now + self._budget_wait(LOOK_RECKONED_S)))
        return max(0.0, next_due - now)

    def _budget_wait(self, cost_s: float | None = None) -> float:
        """Seconds until a test reckoned at `cost_s` fits the budget. A sized test is
        reckoned at twice its length (its pilot, the shaper's burst it may read,
        up to 1.4x, and start-up); the budget is charged what it really took."""
        cost = cost_s or 2 * self.config.sized_test_s or self.config.test_duration_s
        with self._lock:
            return self.budget.wait_for(cost, self.clock())

    def _look_turn(self, peer: str, sched: PeerSchedule) -> None:
        with self._lock:
            sched.look_asked, sched.look_follow_up = -math.inf, False
        first = self.clock()
        try:
            m = self.measure_bandwidth(peer, look=True)
        except IperfBusy as exc:  # another test holds the peer: nothing ran
            log.info("%s; the look waits for the next ask", exc)
            return
        pace = (m.duration_s or 0.0) / self.config.look_duty_cycle
        if self.next_look <= first:
            self.next_look = first + pace
        else:  # before the pace allowed: a follow-up, on its own share
            self.next_follow_up = max(self.next_follow_up, first) + pace
        self.last_looked = peer
        self._record(m)

    def _bandwidth_turn(self, peer: str, sched: PeerSchedule) -> None:
        sched.last_bandwidth = self.clock()
        try:
            m = self.measure_bandwidth(peer)
        except IperfBusy as exc:
            self.busy_count += 1
            log.info("%s; retrying in about %.1f s", exc, self._back_off(sched))
            return
        if m.ok:
            with self._lock:
                sched.failed_tries = 0
                sched.next_bandwidth = self.clock() + self._jittered(self.config.bandwidth_interval_s)
        else:
            # Tried again soon, not on the schedule: a job's first test that failed
            # (nothing received, on a busy host) left it without a figure for minutes.
            log.info("bandwidth test to %s failed; retrying in about %.1f s", peer, self._back_off(sched))
        self._record(m)

    def _back_off(self, sched: PeerSchedule) -> float:
        """Put the peer's next test `backoff_s` off, doubling with each failed or
        busy try in a row up to `backoff_max_s`; returns the wait."""
        backoff = min(self.config.backoff_s * 2 ** sched.failed_tries, self.config.backoff_max_s,
                      self.config.bandwidth_interval_s)
        with self._lock:
            sched.failed_tries += 1
            sched.next_bandwidth = self.clock() + self._jittered(backoff)
        return backoff

    def measure_bandwidth(self, peer: str, look: bool = False) -> Measurement:
        """One bandwidth test to `peer` now (or a look), holding its target
        lock and charged to the duty budget. Raises IperfBusy when the target is
        busy; any other failure comes back as a failed measurement."""
        if self.own_address(peer):
            raise ValueError(f"peer: {peer} is an address of this host; a test to it measures nothing")
        with self.locks.hold(peer):
            self._announce(peer, time.time())
            start, moved = self.clock(), True
            try:
                m = self.look_probe(peer) if look else self.bandwidth_probe(peer)
            except IperfBusy:
                self._charge(start, self.clock() - start)
                self._announce(peer, None)  # the peer's server turned it away: no test ran
                raise
            except IperfTimeout as cut:
                m = cut_off_measurement(peer, cut)
            except IperfUnconnected as exc:
                m, moved = failed(peer, BANDWIDTH, exc), False
            except Exception as exc:  # a failed probe is data, and the schedule goes on
                m = failed(peer, BANDWIDTH, exc)
            elapsed = self.clock() - start
        # What the budget charges: a look's trains, the time they held the link (one
        # unanswered, LOOK_RECKONED_S: its first train held a 10 Mbit/s link 13 ms, and
        # charged the 1 s wait one lost answer would hold every look off for 400 s); a
        # test, the whole call (iperf3's own figure leaves out its start-up), and a
        # failed one (killed at its timeout, say) held the link all the same; one that
        # never connected, nothing: charged its 3.6 s wait, a job's one dead peer held
        # every test of its live ones off for two minutes.
        if not moved:
            held = 0.0
        elif look:
            held = m.duration_s if m.ok and m.duration_s is not None else min(elapsed, LOOK_RECKONED_S)
        else:
            held = elapsed
        self._charge(start, held)
        return dataclasses.replace(m, duration_s=held, kind=LOOK if look else m.kind)

    def _charge(self, start: float, seconds: float) -> None:
        with self._lock:
            self.budget.charge(start, seconds)

    def _announce(self, peer: str, start: float | None) -> None:
        if self.on_bandwidth_start is not None:
            self.on_bandwidth_start(peer, start)

    @staticmethod
    def _run(probe: Probe, peer: str, kind: str) -> Measurement:
        try:
            return probe(peer)
        except Exception as exc:  # a failed probe is data, and the schedule goes on
            return failed(peer, kind, exc)

    def _record(self, m: Measurement) -> None:
        if self.store is not None:
            m = self.store.add_measurement(m)
        if self.on_measurement is not None:
            self.on_measurement(m)

    # -- the thread ------------------------------------------------------------
    def start(self) -> ProbeScheduler:
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="flexcomm-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to stop and wait for it (a running probe finishes first)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping:
            try:
                delay = self.tick()
            except Exception:  # a bug in a sink must not end probing
                log.exception("probe scheduler tick failed")
                delay = self.config.latency_interval_s
            self._wake.wait(delay)
            self._wake.clear()
