"""One job path's bandwidth, read off every sync of every option the job runs and
the probes of its peers: the one detector of a moved network.

A sync of an option of sync form c (`costmodel.sync_form`: its collective, or
PowerSGD's two AllReduces over it) takes t = o_c + B beta: B the bytes the
option moves per unit of beta (the cost model's `option_terms`), o_c the form's
overhead per sync (its latency terms and the host's and gloo's own work per
collective, which the model leaves out: in the lab 1.8 ms for AllGather Top-k,
5.3 ms for the AR tree), beta the path's seconds per byte, one for every
option. Both are fitted together, with forgetting:

- A form's overhead is learned from its syncs while beta is confirmed (by a
  probe, the job's own report, or syncs whose overheads are known): its first
  sync since then sets o_k = t - B_k beta, later ones refine it, each weighted by
  the share of its time its bytes do not explain (squared), with the spread of
  their residuals. Until then it may be anything up to `overhead_max_s` (a loaded
  host's gloo spends tens of milliseconds a collective). Beside the wire the
  host's work overlaps it: a sync the figure's wire explains most of
  (`alone_share`) hides up to its wire of host work. Until recent host-bound
  syncs back a fit (`CollectiveFit.host_backed`), it holds as fitted only for
  such syncs; a sync with less wire may carry up to the shortest wire its
  wire-bound syncs took more (`CollectiveFit.hides`).
- So each sync reads beta within (t - o_hi) / B_k <= beta <= (t - o_lo) / B_k,
  the wire time read through the link's token bucket where one is configured (a
  message after idle runs at the peak while its credit lasts, as the cost model
  prices it). When the interval is narrow (the bytes explain most of the time)
  the sync reads the path and moves the estimate, weighted by that share; when
  it is wide the sync is a lower bound on the bandwidth, never ignored: beta <=
  t / B_k, which always holds (the path carried at least B_k bytes in t), and
  an estimate slower than what crossed is raised to it, flagged `lower_bound`.
- A sync no larger than the link's burst (`burst_bytes`) is neither: a shaped
  or policed link may pass it at line rate after idle, so its time cannot be
  read as a rate. Its level can still move (every option's is watched): when
  the median of an option's last 8 messages is `level_shift` below the median
  of the 24 before, or each of the 8 is `level_shift` above it, the path
  (or the host) moved; where the wire could have made the shift, a probe is
  asked for (`suspect_beta`: the rate it would mean), and readings of other
  peers made before it no longer stand for the path. (The lab's Top-k 0.01 syncs of 45 KB took 17-32 ms a
  message at 20 Mbit/s and 5-19 ms at 1 Gbit/s; ignored, the recovery never
  reached the estimate.)
- While the figure is only a lower bound it is the fastest bound of the last
  `bound_window_s` (a windowed maximum, as BBR keeps), so a link that slowed
  shows as soon as the faster bounds age out. A sync that reads the path
  replaces it at once where it agrees or reads faster; one slower moves it only
  as it would a confirmed figure, below. A test the job shared the link with
  is a bound that stands longer (the `floor`): until an option's syncs slow by
  `level_shift` as above, a move taken at once to the window's fastest bound
  (no probe: a slower link's syncs show it, and the duty budget is kept for a
  recovery, which they cannot), syncs slower than the host explains end it as
  they would a confirmed figure (below), or `max_age_s` passes. (Left to the window,
  the lm lab's shared test read 956 Mbit/s and PowerSGD's syncs, mostly
  gloo's own work, bound the estimate back to 38-157 within a second; each
  fall asked for a test, and the duty budget they spent left the next
  recovery unseen.)
- The estimate counts the moves it detects (`moves`; the observation carries the
  count, and a policy takes a changed count as the move): a figure 12.5% or more
  from where the last move was counted, except a bound that fell (syncs that
  said less look the same), which counts once a probe confirms it, at once
  where no probe will come, and at once where the syncs' slowing ended a
  shared test's bound.
- A change is `persist` reports in a row outside the interval (by more than
  `change` of the bytes' time; `persist_sure` slower ones where each reads the
  path alone and no host work explains it); a reading `level_shift` slower than the
  streak's fastest begins it again where what crossed since it began
  contradicts it (still falling, as with looks). Faster: taken (at least that fast; only bounded,
  a probe is asked for where it is `level_shift` beyond the figure) where some
  reading beats the figure; where none does, the host was quicker and nothing moves. Slower: taken
  from the syncs alone only when their bytes would explain `alone_share` of their
  time at the new figure (a loaded host slows the overhead, not the path), or when
  even `overhead_max_s` of their time left the host's would not explain them (a
  lower bound then, and a probe asked for); else a probe must confirm it
  (`wants_probe`), and where no probe will come (`probes`
  off: an in-process policy, an agent that does not probe) the slower figure is
  taken as a lower bound; where none comes within `probe_wait_s` (the duty
  budget is spent: `probe_late`) it is, once the syncs have shown it that long.
  A slower streak contradicted by what crossed since it began (a sync whose B/t
  beats the streak's figure by `change`) moves nothing and asks for a probe.
  Readings in the streak before a change are not blended into the old figure.
- A figure nothing confirmed for `max_age_s` (Top-k syncs on a busy host can
  hide a 50x move of the link) asks for a probe, once per `max_age_s`; a test
  the job shared the link with looked at the path too, and so did a fall of
  its bound that the syncs showed (in the lm lab the aged ask came 8 s after
  the one and 2 s after the other, and its test left no duty budget for the
  next recovery).
- What the syncs ask below of "a probe" is asked of a look first
  (`find_out`), where the owner runs looks: a look holds the link 2-5 ms, a
  test hundreds. While the figure is a bound, the slowest path's look is the
  figure unless it reads under the bound by `change` (it shared the link with
  the job's syncs); that twice, or no look within `probe_wait_s`, asks for
  the probe. A look slower than a confirmed figure by `level_shift` while the
  syncs' slower streak stands (`persist` readings) is the fall, read by two
  kinds of evidence at once (`_fell_with_syncs`): even one under what the
  syncs carried, which alone says nothing.
- Where no look, test or report read the path for `look_after_s`, the syncs
  want a look (`wants_look`), whatever they read (one option's overhead and
  the wire are one figure to them): packet trains timed by the receiving
  kernel, a few ms of the link.
  One that reads faster than the figure by `level_shift` (allowing for a burst
  it may read, `look_overread`) is the figure (the slowest of the paths looked
  at: all of them, or while a question is out those looked at since); two in
  a row that read slower, within `probe_wait_s`, are the figure; one that
  agrees counts as a look at the path for the aged ask, and ends a slower
  streak where every path agrees. Where every path has a recent look and the
  slowest of them reads less than `change` slower than the figure, or faster
  short of a move (on a link configured plain only slower: a faster one may
  be a bucket's peak), the figure moves to it where it is faster (a move the
  policy hears of where that is `change` from the last one) and toward it by
  `look_weight` where it is slower, and until
  `look_after_s` after a look set or moved the figure the syncs that agree
  teach their overhead, not the rate: a look is the wire alone, a sync the
  wire and the host's work as one figure (the lm lab's PowerSGD rank 4 syncs
  read a 30 Mbit/s link at 24 for a whole phase beside looks at 29; an
  overread first look at 1 Gbit/s, 1.21x, stood beside agreeing ones at
  1.01x). Two looks in a row that themselves read slower by `change`, short
  of `level_shift`, drift the figure toward the faster of them. A drift down
  counts no move, as the syncs' does not.
  (The cnn lab's MOO ran PowerSGD rank 2, 38 KB syncs, from a 33 Mbit/s phase
  on: its estimate stayed at 23 Mbit/s through 160, 470 and 980 for 15 s.)
- A test or look that reads slower, by `change`, than what the job's syncs
  surely carried in the last `bound_window_s` (their bytes over their whole
  time; since a slower streak began, while one is in progress) read what they
  left of the link, not the path: it says nothing (`crossing`).
- A probe that reads faster, or agrees, confirms; one that reads slower while
  the job's syncs say the path is as it was is the job sharing the link with the
  test, and a slower probe alone must read it twice. A test the owner knows the
  job synced through (`shared`) had what the job left of the link: a first or a
  faster figure from it is a lower bound (the default lab's registration test
  read 8.7 Mbit/s of a 20 Mbit/s link so), and it confirms no figure only
  bounded; a slower one is read twice like any other.

Pure: no I/O and no clock (timestamps are whatever the caller passes).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from flexcomm.policy.costmodel import ModelForms, option_terms, sync_form
from flexcomm.policy.types import (
    PLAIN_LINK,
    GradientLayout,
    LinkBucket,
    NetworkObservation,
    StepReport,
    check_count,
    check_range,
)

# A sync reported faster than this measured nothing (a clock's resolution).
MIN_SYNC_S = 1e-6
SYNC, SYNC_BOUND, PROBE, REPORT, LOOK = "sync", "sync (lower bound)", "probe", "report", "look"
PROBE_SHARED = "probe (shared with the job)"
STATE_FORMAT = 2
# A policy is shown the estimate's age in whole steps of this: an age that moved
# by a fraction of a second is no news to decide on.
AGE_STEP_S = 5.0
# An overhead read off one sync is known to about this share of itself.
FIRST_SPREAD = 0.25
# Messages of an option whose median is compared (the recent ones) with that of
# those before them (the reference), and the reference's length.
LEVEL_RECENT, LEVEL_REFERENCE = 8, 24
# What a shift of an option's syncs is taken to mean is kept within this factor of
# the figure: it sizes a probe (which repeats a test sized too small), nothing more.
SHIFT_RANGE = 20.0


# A bandwidth that moved by less than this is no news to a policy: the estimate
# refines itself with every report message, and each new observation costs the
# policy a fresh evaluation of every candidate.
NETWORK_NEWS = 0.01


def network_news(old: NetworkObservation | None, new: NetworkObservation) -> bool:
    """Whether a policy that saw `old` should be shown `new`: its bandwidth moved by
    NETWORK_NEWS or more, or anything else changed."""
    if old is None:
        return True
    if dataclasses.replace(old, beta_s_per_byte=new.beta_s_per_byte) != new:
        return True
    return abs(new.beta_s_per_byte - old.beta_s_per_byte) >= NETWORK_NEWS * old.beta_s_per_byte


def ewma(old: float | None, new: float, weight: float) -> float:
    """Exponentially weighted mean: `new` when there is no `old`."""
    return new if old is None else (1 - weight) * old + weight * new


def toward(old: float, new: float, weight: float) -> float:
    """`old` moved toward `new` by `weight` as a ratio (a geometric mean): a rate
    and its inverse move alike."""
    return old * (new / old) ** weight


def relative_change(old: float, new: float) -> float:
    """|new - old| / old; infinite when old is 0 and new is not."""
    if old == 0:
        return 0.0 if new == 0 else math.inf
    return abs(new - old) / abs(old)


# What a link passes at line rate after idle: TCP hands the NIC up to 64 KB at
# once (GSO/TSO), and shapers and policers let a burst of that through; the lab's
# HTB links passed 16 KB segments so, and Top-k syncs of a few KB read 67 Mbit/s
# "at least" on a 10 Mbit/s link. A sync of no more says nothing of the link.
BURST_BYTES = 65536.0
# A look reads up to this times the path's rate where the path has a token bucket
# the estimate was not told of (a plain link configured): the lab's trains read
# its 1.2x peak (1.167 of UDP payload), and 45-datagram trains beside the test
# suite read up to 1.24x (sevenths of 0.5 ms timed short).
LOOK_OVERREAD = 1.25
# A look that waited this much longer for its answer than the path's quickest
# looks did sat behind traffic: through the tests' 100 Mbit/s HTB link trains
# waited 0.6 ms idle and 3.5-3.8 ms behind a TCP flow filling it (TCP's small
# queues keep the backlog short, so a wait does not say how long it lasted).
QUEUED_S = 0.001
# A look that waited behind a sync crossed after the bucket's credit was spent
# unless it came in the sync's first `LinkBucket.peak_s`: it is read at the rate
# where that chance is at least this (syncs of peak_s / (1 - SPENT_SHARE) or
# longer, 250 ms in the lab). A path's reading is the fastest of its looks, so
# one read 1.2x fast would stand for it.
SPENT_SHARE = 0.9


@dataclass(frozen=True)
class LinkEstimateConfig:
    """How syncs and probes are weighed (see the module docstring)."""

    overhead_max_s: float = 0.1
    informative: float = 0.3
    alone_share: float = 0.7
    change: float = 0.25
    noise: float = 0.05
    sigmas: float = 3.0
    persist: int = 3
    persist_sure: int = 2  # a slower streak whose every reading no host work explains, read alone
    beta_weight: float = 0.2
    overhead_weight: float = 0.05
    max_age_s: float = 30.0
    bound_window_s: float = 1.0
    probes: bool = True  # whether a probe comes when one is wanted
    looks: bool = True  # whether a look comes too (the agent's prober with a share for looks)
    probe_wait_s: float = 5.0  # a probe further off than this counts as none coming
    burst_bytes: float = BURST_BYTES
    level_shift: float = 0.5  # an option's syncs moved: their median 1.5x either way
    look_after_s: float = 2.0  # syncs that showed nothing of the path this long want a look
    look_overread: float = LOOK_OVERREAD
    look_weight: float = 0.5  # how far looks that agree, reading slower, draw the figure toward them
    # A look read what the job's syncs left of the link only beside a sync reported
    # this long before it or less: its trains hold the link milliseconds. Judged by
    # `bound_window_s`, the cnn lab's looks after a fall were dropped for a sync that
    # crossed before it; replayed over 534 stored lab runs, 0.25 s reached 24 more of
    # cnn's 1,296 phases (873 -> 897) and moved none of digits' or lm's by more than 2.
    look_shared_s: float = 0.25

    def __post_init__(self) -> None:
        for name in ("overhead_max_s", "max_age_s", "bound_window_s", "change", "noise", "sigmas", "probe_wait_s",
                     "level_shift", "look_after_s", "look_shared_s"):
            check_range(name, getattr(self, name), 0.0, math.inf, open_low=True)
        for name in ("informative", "alone_share", "beta_weight", "overhead_weight", "look_weight"):
            check_range(name, getattr(self, name), 0.0, 1.0, open_low=True)
        check_range("burst_bytes", self.burst_bytes, 0.0, math.inf)
        check_range("look_overread", self.look_overread, 1.0, math.inf)
        for name in ("persist", "persist_sure"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        for name in ("probes", "looks"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be true or false, got {getattr(self, name)!r}")


@dataclass
class CollectiveFit:
    """One collective's overhead per sync (s) and the mean deviation of its residuals,
    learned against a confirmed beta; `weight` how many overhead-bound syncs
    (each weighted by the share of its time its bytes do not explain, squared)
    stand behind them, capped by the forgetting; `seen` whether any sync was read;
    `host` the same weights forgotten at the fit's rate (what recent syncs said
    of the host's own work); `hidden_s` the shortest wire a wire-bound sync that
    taught it took (None while none did)."""

    overhead_s: float = 0.0
    spread_s: float = 0.0
    weight: float = 0.0
    seen: bool = False
    host: float = 0.0
    hidden_s: float | None = None

    @property
    def known(self) -> bool:
        """Syncs like those it was read off can be read through it."""
        return self.seen

    @property
    def host_backed(self) -> bool:
        """Lately, syncs the host's work is a good share of stood behind it (at the
        fit's forgetting, weights of 0.05 a sync or more: a fifth of their time)."""
        return self.host >= 1.0

    def hides(self, seconds: float) -> float:
        """How much of a sync of `seconds` the host's work may take beyond the fit,
        where no host-bound syncs back it: a wire-bound sync hid the host's work
        behind its wire, up to that wire's length, so a sync with less wire may
        show that much more. The default lab's 20 Mbit/s phase put AllGather
        Top-k's overhead at 0.5 ms (its syncs 99% wire); on the 1 Gbit/s phase
        its 8-11 ms syncs, four ranks' work on two cores, read the path at 150
        Mbit/s beside looks at 1,169."""
        return seconds if self.hidden_s is None else min(seconds, self.hidden_s)

    def read_first(self, residual: float) -> None:
        """A first sync (already learned) read whatever its weight: its residual is
        the overhead, known to about FIRST_SPREAD of itself."""
        self.overhead_s, self.spread_s, self.seen = residual, FIRST_SPREAD * residual, True

    def learn(self, residual: float, weight: float, memory: float, wire: float, wire_bound: bool) -> None:
        if wire_bound:
            self.hidden_s = wire if self.hidden_s is None else min(self.hidden_s, wire)
        self.host = self.host * (1 - 1 / memory) + weight
        if weight <= 0:
            return
        self.seen = True
        share = weight / (min(self.weight, memory) + weight)
        self.spread_s = self.spread_s + share * (abs(residual - self.overhead_s) - self.spread_s) \
            if self.weight else 0.0
        self.overhead_s += share * (residual - self.overhead_s)
        self.weight = min(self.weight, memory) + weight


@dataclass
class Streak:
    """Reports in a row that disagree with the estimate the same way (+1 slower,
    -1 faster): how many, the slowest beta each of the last `persist` could be,
    and the slowest of them all."""

    direction: int
    began: float = 0.0  # when its first reading came
    reports: int = 0
    betas: list[float] = field(default_factory=list)
    slowest: float = 0.0
    informative: bool = True  # every reading was narrow enough to stand for the path
    alone: bool = True  # every reading's bytes would explain `alone_share` of its time
    # every reading took longer than `overhead_max_s` plus its bytes' time at the
    # estimate (by `change`): no host work explains it
    beyond_host: bool = True
    probe_asked: bool = False
    probe_late: bool = False  # the probe asked for runs later than `probe_wait_s`
    # the fastest beta any sync since it began surely showed (its bytes over its whole time)
    crossed: float | None = None

    def again(self, began: float) -> Streak:
        """This streak begun again at `began`: its readings dropped, what was
        asked of a probe kept."""
        return Streak(self.direction, began, probe_asked=self.probe_asked, probe_late=self.probe_late)

    def saw(self, bound: float | None) -> None:
        if bound is not None:
            self.crossed = bound if self.crossed is None else min(self.crossed, bound)


@dataclass
class LinkEstimate:
    """The estimate of one job's path (see the module docstring). The owner reads
    `beta_s_per_byte`, `lower_bound`, `confirmed` (when the figure was last
    confirmed) and `wants_probe` (cleared once it has asked)."""

    config: LinkEstimateConfig = field(default_factory=LinkEstimateConfig)
    bucket: LinkBucket = PLAIN_LINK  # the link's token bucket (configured, as the cost model's)
    beta_s_per_byte: float | None = None
    lower_bound: bool = False
    evidence: str = ""
    moved_at: float | None = None
    moves: int = 0  # how many moves this estimate has detected (its figure's generation)
    moved_beta: float | None = None  # the figure the last move was counted at
    confirmed: float | None = None
    wants_probe: bool = False
    probe_reason: str = ""  # why a probe was last wanted
    overheads: dict[str, CollectiveFit] = field(default_factory=dict)
    streak: Streak | None = None
    probe_pending: float | None = None  # a slower probe read once, to be read again
    syncs_agree: bool = False  # the last sync that read the path agreed with the estimate
    aged_ask: float | None = None  # when a probe was last asked for because the figure aged
    bounds: list[tuple[float, float]] = field(default_factory=list)  # (when, beta) while only bounded
    trained_s: float = 0.0  # the job's training time its reports added up to (`advance`)
    # per option: its last messages' sync times (each a median), oldest first
    levels: dict[str, list[float]] = field(default_factory=dict)
    floor: tuple[float, float] | None = None  # (when, beta) a test the job shared read: at least this fast
    fell_at: float | None = None  # when the syncs' slowing last ended such a bound
    suspect_beta: float | None = None  # the rate a shift of burst-sized syncs means, until a probe answers
    looked: float | None = None  # when a look last found the path as the figure says
    sync_wire_s: float | None = None  # the latest sync's time on the wire at the figure
    look_figure: float | None = None  # when a look last set or refined the figure (syncs then only agree)
    wants_look: bool = False  # cleared by the owner once it has asked
    # the look wanted follows up a reading (a look's, or the syncs' question): the
    # owner may run it before the looks' pace allows; cleared with `wants_look`
    look_follows: bool = False
    look_pending: tuple[float, float] | None = None  # (when, what) a look read slower, to be read again
    look_drift: tuple[float, float] | None = None  # (when, what) a look read slower short of a move
    looking_since: float | None = None  # a look read faster on one path: the others' looks wanted since
    look_asked: float | None = None  # when a look was wanted to answer `look_reason` (`find_out`)
    look_reason: str = ""
    # when a look, test or the job's report last read the path (or the first figure came)
    seen_at: float | None = None
    # (when, beta) each sync's bytes surely crossed at (over its whole time), the last `bound_window_s`
    crossing: list[tuple[float, float]] = field(default_factory=list)
    # Readings of the job's paths (looks, tests) taken before this, on the owner's
    # clock, are of the network before the last move (`note_moves`); None: none was noted.
    paths_fresh_since: float | None = None
    moves_noted: int = 0  # the moves `note_moves` has seen
    # on the owner's clock: when looks began to answer the question out (`look_asked`)
    answer_looks_since: float | None = None

    @property
    def bandwidth_bps(self) -> float | None:
        return None if not self.beta_s_per_byte else 8.0 / self.beta_s_per_byte

    def advance(self, reports: Iterable[StepReport]) -> float:
        """The job trained `reports`' steps more; the time it has trained. The agent
        runs the estimate on this clock, so that its windows and ages, and the
        decisions they lead to, follow the job's reports alone: on the agent's
        own clock a restarted agent fed the same reports as a never-killed twin
        saw a bound leave the window one message apart from it, and decided
        otherwise."""
        self.trained_s += sum(r.step_s for r in reports)
        return self.trained_s

    def note_moves(self, ts: float) -> None:
        """The owner's clock reads `ts` (the time its path readings are stamped
        with): a move made since the last call means every reading taken before
        now is of the old network. Called before and after each reading is
        taken in, so that the reading that made a move counts and those before
        it do not (in the default lab a look at 20 Mbit/s, 2 s before a look
        moved the figure to 1 Gbit/s, was the slowest path's latest and made
        an underread look at 295 Mbit/s two slower looks in a row: the figure
        fell to 246 for 10 s of a 1 Gbit/s phase)."""
        if self.moves != self.moves_noted:
            self.paths_fresh_since, self.moves_noted = ts, self.moves

    @property
    def suspects_move(self) -> bool:
        """Whether the syncs say the path may no longer be what the probes last
        read: a shift of burst-sized syncs, a streak of readings one way, or a
        figure they only bound from below."""
        return self.suspect_beta is not None or self.streak is not None or self.lower_bound

    def age_s(self, now: float) -> float:
        """Seconds since the figure was last confirmed, in whole `AGE_STEP_S`."""
        if self.confirmed is None:
            return 0.0
        return AGE_STEP_S * math.floor(max(0.0, now - self.confirmed) / AGE_STEP_S)

    def observation(self, net: NetworkObservation, now: float) -> NetworkObservation:
        """`net` (its alpha, nodes and bucket) with this estimate's bandwidth, as of `now`."""
        assert self.beta_s_per_byte is not None
        return dataclasses.replace(net, beta_s_per_byte=self.beta_s_per_byte, evidence=self.evidence,
                                   lower_bound=self.lower_bound, age_s=self.age_s(now), moves=self.moves)

    # -- syncs -------------------------------------------------------------------
    def observe_sync(self, form: str, beta_bytes: float, seconds: float, ts: float,
                     reports: int = 1) -> None:
        """`reports` syncs of one sync form (`costmodel.sync_form`: the collective,
        whose overhead they share) that took `seconds` each (their median), moving
        `beta_bytes` bytes per unit of beta."""
        if seconds <= 0 or beta_bytes <= 0 or not math.isfinite(seconds):
            return
        self._read_sync(form, beta_bytes, seconds, ts, reports)
        if self.beta_s_per_byte is not None:
            self.sync_wire_s = self._wire_s(self.beta_s_per_byte, beta_bytes)
        if self._blind_s(ts) >= self.config.look_after_s:
            self.wants_look = True

    def _blind_s(self, ts: float) -> float:
        """How long no look, test or report has read the path (0 while there is
        no figure). Syncs cannot end it: where one option runs, its overhead and
        the wire are one figure, fitted at one rate and read at any other. In
        the cnn lab PowerSGD rank 4's syncs, mostly gloo's own work, read a
        160-980 Mbit/s path at 14-54 Mbit/s for 30 s, each reading taken as
        the path and most of them a move, and no look came."""
        if self.beta_s_per_byte is None or self.seen_at is None:
            return 0.0
        return ts - max(self.seen_at, self.looked or -math.inf)

    def _read_sync(self, form: str, beta_bytes: float, seconds: float, ts: float, reports: int) -> None:
        looked = self._looked_at()
        if looked is not None and ts - looked >= self.config.max_age_s and \
                ts - (self.aged_ask or -math.inf) >= self.config.max_age_s:
            self.aged_ask = ts
            self.find_out("aged", ts)  # nothing confirmed it for a while: look again
        if self.look_asked is not None and ts - self.look_asked >= self.config.probe_wait_s:
            self.ask(self.look_reason)  # no look answered: a peer without a look server, or none came
        if self._watch_level(f"{form}:{beta_bytes:.0f}", beta_bytes, seconds, ts):
            # A shaped or policed link may pass a burst after idle at line rate: the
            # sync's time says nothing of the rate, neither as a reading nor as a
            # bound (the lab's Top-k syncs of 3-25 KB on a 20 Mbit/s link read
            # anything from 4.8 to 472 Mbit/s, and every such move sent the MOO
            # exploring again); only a shift of its level is news.
            return
        self._crossed(self._bound_beta(seconds, beta_bytes), ts)
        fit = self.overheads.setdefault(form, CollectiveFit())
        beta = self.beta_s_per_byte
        wire = None if beta is None else self._wire_s(beta, beta_bytes)
        if not fit.known and wire is not None and not self.lower_bound and \
                -self.config.change * wire <= seconds - wire <= self.config.overhead_max_s:
            # a collective new since the figure was confirmed: its overhead is what the figure leaves
            self._teach_overhead(fit, seconds, wire, reports)
            fit.read_first(max(0.0, seconds - wire))
            return
        lo, hi = self._overhead_range(fit, seconds, wire)
        fastest, slowest = self._beta(max(seconds - hi, 0.0), beta_bytes), self._beta(seconds - lo, beta_bytes)
        narrow = fastest > 0 and fastest >= (1 - self.config.informative) * slowest
        # A wide reading bounds the path by its bytes over its whole time: with the
        # fit's overhead taken off, a noisy host's quick sync read "at least" 5 Gbit/s
        # on the cnn's 980 Mbit/s link (Top-k syncs of 246 KB in 8-68 ms).
        bound = slowest if narrow else self._bound_beta(seconds, beta_bytes)
        if beta is None or wire is None:
            if bound is not None:
                self._set(bound, SYNC if narrow else SYNC_BOUND, ts, lower_bound=not narrow)
                self.seen_at = ts  # blind from the first figure on
            # A first figure the syncs read is the path as the job loads it: the
            # owner's wish to probe goes (a registration's test then shares the
            # link with the job: the lab's dense job's read 4.5 of 20 Mbit/s in
            # 1.4 s, the whole duty budget, and none was left when the link
            # recovered). A bound keeps it. Either wants looks at once: asked
            # only once the syncs grew blind, the lm lab's MOO had its first
            # figure (a dense sync with gloo's set-up in it, 0.86x) for 3.4 s.
            self.wants_probe = False
            if narrow:
                self.wants_look = self.config.looks
            else:
                self.find_out("first figure a bound", ts)
            return
        margin = self.config.change * wire
        slower = seconds > hi + wire + margin and slowest > beta * (1 + self.config.change)
        # A shared test's bound is a reading, not a sync's: syncs slower than any
        # host explains end it as they would a confirmed figure. Against the level
        # rule alone, a test that read 918 Mbit/s just before the short lab's link
        # fell to 10 left no fast messages to judge the slow ones by, and stood
        # through the slow phase.
        against_floor = self.floor is not None and self._beyond_host(seconds, beta_bytes)
        if self.lower_bound and not (slower and (narrow or against_floor)):
            self._within_bound(bound, narrow, ts)
        elif seconds < lo + wire - margin:
            self._disagree(-1, fastest, slowest, narrow, seconds, beta_bytes, ts, reports)
        elif slower:
            # A figure only bounded moves slower only as a confirmed one does:
            # taken from one reading, a sync a loaded host stalled 550 ms moved
            # the lab MOO's "at least 377 Mbit/s" to 1.8 on a 10 Mbit/s link.
            self._disagree(1, fastest, slowest, narrow, seconds, beta_bytes, ts, reports)
        else:
            self._agree(fit, fastest, slowest, narrow, seconds, beta_bytes, ts, reports)

    def _looked_at(self) -> float | None:
        """When the path was last looked at, for the aged ask: a confirmation, a
        shared test whose bound stands, a fall of one the syncs showed, or a look
        that found the figure (None while nothing was ever confirmed)."""
        if self.confirmed is None:
            return None
        seen = [self.floor[0] if self.floor else None, self.fell_at, self.looked]
        return max([self.confirmed, *(t for t in seen if t is not None)])

    def _crossed(self, beta: float | None, ts: float) -> None:
        window = self.config.bound_window_s
        self.crossing = [(t, b) for t, b in self.crossing if t > ts - window] + ([(ts, beta)] if beta else [])

    def _under_crossing(self, beta: float, ts: float, window: float | None = None) -> bool:
        """Whether a reading of the path is slower, by `change`, than what the
        job's syncs surely carried within the last `window` (`bound_window_s`
        unless given): a test or look that read what they left of the link,
        not the path (Linux's rate estimator takes such a sample as a lower
        bound on the path). In the cnn lab two tests read 136-149 Mbit/s of an
        820 Mbit/s link while the job's syncs carried 512, and were taken as a
        fall. While syncs read slower, only what crossed since they began
        counts: before, the path may have been another."""
        since = ts - (self.config.bound_window_s if window is None else window)
        if self.streak is not None and self.streak.direction > 0:
            since = max(since, self.streak.began - 1e-9)
        crossed = [b for t, b in self.crossing if t > since]
        return bool(crossed) and beta > min(crossed) * (1 + self.config.change)

    def _window(self, ts: float) -> list[tuple[float, float]]:
        """The bounds of the last `bound_window_s` before `ts`."""
        return [(t, b) for t, b in self.bounds if t > ts - self.config.bound_window_s]

    def _watch_level(self, key: str, beta_bytes: float, seconds: float, ts: float) -> bool:
        """One message's syncs of an option, for its level (`_level_shift`): a
        burst-sized option's move asks for a probe, but a quicker one while a
        shared test's bound stands (the test read the link as fast); a larger
        option's slower move ends that bound (`_floor_fell`), so a larger
        option's level is kept only while the bound stands (kept always, every
        job's stored state grew by them, and the agent's ingest of large report
        messages fell in bench/agent_load.py). The level is reset to the recent
        messages only when a move is acted on. Whether the sync is burst-sized
        (nothing more to read from it)."""
        small = beta_bytes <= self.config.burst_bytes
        if not small and self.floor is None:
            self.levels.pop(key, None)
            return False
        level = self._level_shift(key, seconds)
        if level is None:
            return small
        slower = level[1] > level[0]
        if small and (slower or self.floor is None):
            self._suspect(beta_bytes, *level, ts)
            self.levels[key] = self.levels[key][-LEVEL_RECENT:]  # the new level is the reference
        elif not small and slower:
            self._floor_fell(self._bound_beta(seconds, beta_bytes), ts)
            self.levels.pop(key)
        return small

    def _level_shift(self, key: str, seconds: float) -> tuple[float, float] | None:
        """One message's syncs of an option (their median `seconds`): the medians
        (before, recent) when the option's last LEVEL_RECENT messages moved
        `level_shift` from the median of the LEVEL_REFERENCE before them (a move
        acted on makes them the reference: a host that slowed shows once, not
        at every message); else None. Quicker: their median beyond, which
        costs at most a probe (the default lab's MOO saw its PowerSGD syncs
        quicken so in 3 of 3 runs, and in 1 of 4 when each had to be beyond
        the reference's median too). Slower: each of them beyond, since a busy
        host slows syncs too and a fall may be taken at once (`_floor_fell`):
        on the lm lab's 1 Gbit/s phases Top-k's and PowerSGD's syncs took 3-97
        ms a message, and medians with each message beyond the reference's
        median saw seven falls in five runs that were none. Windows, not
        messages in a row: at 1 Gbit/s the default lab's burst-sized syncs
        (5-19 ms) straddled any per-message line drawn under the 20 Mbit/s
        ones (17-32 ms)."""
        if self.beta_s_per_byte is None:
            return None
        times = self.levels[key] = [*self.levels.get(key, ()), seconds][-(LEVEL_RECENT + LEVEL_REFERENCE):]
        if len(times) < LEVEL_RECENT + LEVEL_REFERENCE // 2:
            return None
        recent_s = times[-LEVEL_RECENT:]
        before, recent = statistics.median(times[:-LEVEL_RECENT]), statistics.median(recent_s)
        shift = 1 + self.config.level_shift
        slower = min(recent_s) > before * shift
        quicker = recent < before / shift
        return (before, recent) if slower or quicker else None

    def _floor_fell(self, bound: float | None, ts: float) -> None:
        """An option's syncs slowed (the level rule) while a shared test's bound
        stood: the path slowed below it. A move, at once, to the fastest bound of
        the window, this sync's included; no probe is asked for: on a slower
        link the syncs' bytes show it, and a recovery, which they cannot show,
        needs the duty budget (in the lm lab the test that confirmed a fall
        left none for the next recovery)."""
        self.floor, self.fell_at = None, ts
        window = [b for _, b in self._window(ts)]
        figure = min(window + ([bound] if bound else []), default=self.beta_s_per_byte)
        self.beta_s_per_byte, self.evidence, self.lower_bound = figure, SYNC_BOUND, True
        self._moved(ts)

    def _suspect(self, beta_bytes: float, before_s: float, recent_s: float, ts: float) -> None:
        """An option's syncs moved from `before_s` to `recent_s`: a probe is asked
        for (of a look first), unless the move is the host's."""
        self.suspect_beta = self._shifted_beta(beta_bytes, before_s, recent_s)
        if self.suspect_beta is None:
            return
        self.find_out("syncs slowed" if recent_s > before_s else "syncs quickened", ts)

    def ask(self, reason: str) -> None:
        """Want a probe, and say why (the owner logs it with the ask): the first
        reason while the wish stands. It answers any question asked of a look."""
        if not self.wants_probe:
            self.probe_reason = reason
        self.wants_probe = True
        self.look_asked = None

    def find_out(self, reason: str, ts: float) -> None:
        """Want to know how fast the path is now: a look first (`observe_look`:
        one that agrees keeps the figure, two slower in a row or one faster on
        every path are the figure), a probe only where none answers within
        `probe_wait_s`, or looks twice read under a bound. A look holds the
        link 2-5 ms, a test hundreds: in the cnn lab a test at 20 Mbit/s held
        it 0.76 s, and tests and looks took 1.1-1.7% of wall time."""
        if not (self.config.probes and self.config.looks):
            self.ask(reason)
            return
        self.follow_up()
        if self.look_asked is None and not self.wants_probe:
            self.look_asked, self.look_reason = ts, reason

    def follow_up(self) -> None:
        """Want a look that follows up a reading: the rest of a round of the
        job's paths, which may run before the looks' pace allows."""
        self.wants_look = self.look_follows = True

    def _shifted_beta(self, beta_bytes: float, old_s: float, new_s: float) -> float | None:
        """The beta a sync's move from `old_s` to `new_s` would mean were it all the
        wire's, within SHIFT_RANGE of the figure. A faster move than the wire's
        time at the figure allows is the host's (None), unless the figure is only
        a lower bound (then the figure: how much faster, only a probe says)."""
        beta = self.beta_s_per_byte
        assert beta is not None
        wire = self._wire_s(beta, beta_bytes)
        moved = wire + new_s - old_s
        if moved <= wire / SHIFT_RANGE:
            return beta if self.lower_bound else None
        return min(self._beta(moved, beta_bytes), beta * SHIFT_RANGE)

    def _within_bound(self, bound: float | None, narrow: bool, ts: float) -> None:
        """A figure only bounded, and a sync that either stands for the path and
        reads no slower (taken: at least that fast, and more telling) or is too
        wide to stand for it (a bound, which also shows a slower streak in
        progress what crossed)."""
        if bound is None:
            return
        if narrow:
            self._set(bound, SYNC, ts)
            self.wants_probe = False
        else:
            self._bound(bound, ts)
            if self.streak is not None:
                self.streak.saw(bound)

    def _bound(self, beta: float, ts: float) -> None:
        """A figure only bounded: the fastest bound of the last `bound_window_s` (a
        windowed maximum of the bandwidth, as BBR keeps): a link that slowed shows
        as soon as the faster bounds age out of the window."""
        self.bounds = [*self._window(ts), (ts, beta)]
        fastest = min(b for _, b in self.bounds)
        if self.floor is not None and (ts - self.floor[0] >= self.config.max_age_s
                                       or fastest * (1 + self.config.level_shift) <= self.floor[1]):
            # Aged, or the syncs crossed 1.5x faster than the test read: the path moved
            # since (the cnn's MOO shared a test at 29 Mbit/s on a 33 Mbit/s link; kept,
            # it stilled every ask for 30 s through 160, 470 and 980 Mbit/s phases).
            self.floor = None
        figure = min(fastest, self.floor[1]) if self.floor else fastest
        old = self.beta_s_per_byte
        if old is None or relative_change(old, figure) >= self.config.change / 2:
            self.evidence = SYNC_BOUND
            if self.floor is None:  # a test the job shared stands: another would read the same
                self.find_out("bound moved", ts)
        self.beta_s_per_byte = figure
        # A bound shows only that the link is at least this fast: a faster one is a
        # move; a slower one is syncs that said less (a busier host, or smaller
        # syncs: PowerSGD's 70 KB in 20-50 ms of gloo's own work bound an 820 Mbit/s
        # link at ~20 Mbit/s), so it is a move only once a probe confirms it, or at
        # once where no probe will come. Counted at every 12.5% either way, the lab
        # cnn's Top-k job on 820 Mbit/s counted nine moves in 4 s (650, 76, 110,
        # 649, 183, 137, 307, 203, 149 Mbit/s) and explored after each; counted after
        # three in a row, PowerSGD's bounds restarted the cnn's first exploration.
        ratio = self.config.change / 2
        slower = self.moved_beta is not None and figure >= self.moved_beta * (1 + ratio)
        if self.moved_beta is None or figure * (1 + ratio) <= self.moved_beta or (slower and not self.config.probes):
            self._moved(ts)

    def _overhead_range(self, fit: CollectiveFit, seconds: float, wire: float | None) -> tuple[float, float]:
        """Where the collective's overhead lies in a sync of `seconds` (`wire` of it its
        bytes' at the figure): anywhere up to `overhead_max_s` until it is learned,
        else its fit within its noise. A fit host-bound syncs do not back holds
        for a sync the figure's wire explains most of; in one with less wire, the
        host's work the fit's wire-bound syncs hid may show (`CollectiveFit.hides`)."""
        anything = min(seconds, self.config.overhead_max_s)
        if not fit.known:
            return 0.0, anything
        noise = self.config.sigmas * fit.spread_s + self.config.noise * seconds
        high = fit.overhead_s + noise
        if not (fit.host_backed or self._wire_bound(seconds, wire)):
            high = max(high, fit.hides(anything))
        return max(0.0, fit.overhead_s - noise), high

    def _wire_s(self, beta: float, beta_bytes: float) -> float:
        """How long `beta_bytes` take on the wire at `beta`, through the link's token
        bucket (a message after idle runs at the peak while its credit lasts)."""
        return self.bucket.seconds(beta * beta_bytes)

    def _beta(self, wire_s: float, beta_bytes: float) -> float:
        """The beta at which `beta_bytes` take `wire_s` on the wire (`_wire_s` inverted)."""
        return self.bucket.at_rate_s(wire_s) / beta_bytes

    def _bound_beta(self, wire_s: float, beta_bytes: float) -> float | None:
        """The slowest beta a sync its bytes explain little of allows: its bytes
        crossed in at most `wire_s` (through the configured bucket)."""
        return self._beta(wire_s, beta_bytes) if wire_s > 0 else None

    def _agree(self, fit: CollectiveFit, fastest: float, slowest: float, narrow: bool, seconds: float,
               beta_bytes: float, ts: float, reports: int) -> None:
        beta = self.beta_s_per_byte
        assert beta is not None
        # A reading too wide to stand for the path says little against syncs that
        # read it slower: it neither ends their streak nor teaches the overhead
        # (on the cnn's 20 Mbit/s phase PowerSGD's syncs, mostly gloo's own work,
        # agreed with a 749 Mbit/s figure between bf16's, reset their streak each
        # time, and pulled the ring's overhead from 37 to 52 ms).
        pending = self.streak is not None and self.streak.direction > 0 and not narrow
        if pending:
            self.streak.saw(self._bound_beta(seconds, beta_bytes))
        else:
            self.streak = None
        weight = 1 - (1 - self.config.beta_weight) ** reports
        if narrow:
            # the fitted overhead, or none while it is unknown (a bound, not a guess)
            reading = self._beta(max(seconds - fit.overhead_s, self._wire_s(fastest, beta_bytes)), beta_bytes) \
                if fit.known else slowest
            share = min(1.0, self._wire_s(reading, beta_bytes) / seconds)
            if not self._look_holds_figure(ts):
                self.beta_s_per_byte = toward(beta, reading, weight * share)
            self.lower_bound, self.confirmed, self.syncs_agree = False, ts, True
        if self.lower_bound or pending:
            # an overhead against a beta only bounded would be only bounded too;
            # while slower syncs are pending it would absorb their move
            return
        # the overhead is read where it is most of the time: a wire-bound sync's
        # residual is the wire's noise, not the host's
        self._teach_overhead(fit, seconds, self._wire_s(self.beta_s_per_byte, beta_bytes), reports)

    def _teach_overhead(self, fit: CollectiveFit, seconds: float, wire: float, reports: int) -> None:
        """`reports` syncs of `seconds` each, `wire` of it the bytes' at the figure, into
        the fit: weighted by the share their bytes do not explain, squared."""
        weight = reports * max(0.0, 1 - wire / seconds) ** 2
        fit.learn(max(0.0, seconds - wire), weight, 1 / self.config.overhead_weight, wire,
                  self._wire_bound(seconds, wire))

    def _wire_bound(self, seconds: float, wire: float | None) -> bool:
        """Whether the wire (at the figure) is most of a sync: `alone_share` of it."""
        return wire is not None and wire >= self.config.alone_share * seconds

    def _look_holds_figure(self, ts: float) -> bool:
        """Whether a look set or refined the figure within `look_after_s` (the
        syncs then agree with the look's figure; they do not move it)."""
        return self.look_figure is not None and ts - self.look_figure < self.config.look_after_s

    def _disagree(self, direction: int, fastest: float, slowest: float, narrow: bool, seconds: float,
                  beta_bytes: float, ts: float, reports: int) -> None:
        # a reading that is not narrow says only what surely crossed: its bytes in its time
        reading = slowest if narrow else self._bound_beta(seconds, beta_bytes)
        if reading is None:
            return
        alone = seconds * self.config.alone_share <= self._wire_s(fastest, beta_bytes)
        beyond_host = self._beyond_host(seconds, beta_bytes)
        streak = self.streak
        if streak is None or streak.direction != direction:
            streak = self.streak = Streak(direction, ts)
        elif direction > 0 and reading >= min(streak.betas) * (1 + self.config.level_shift) \
                and self._contradicted(streak):
            # Still falling, as a second slower look: the streak begins again here.
            # Readings from before the fall are the old path's (or the host's): in
            # the cnn lab one stalled bf16 sync, then one that crossed fast, began
            # a streak the fall's 0.4 s syncs joined, and what had crossed before
            # the fall "contradicted" them; the move waited 1 s for a look.
            # Where nothing that crossed since says otherwise, its readings are the
            # fall's own and the streak goes on (begun again, a fall to 20 Mbit/s
            # read at 28, 39, then 13 Mbit/s moved only on a look, 2.3 s in).
            streak = self.streak = streak.again(ts)
        elif narrow and alone and not ((streak.informative and streak.alone) or streak.beyond_host):
            # A reading that stands for the path after readings that could not
            # (PowerSGD's, then Top-k's on the lab's 20 Mbit/s phase) begins the
            # streak again: judged by its weakest reading, the streak waited for
            # a probe the duty budget ran 110 s later, at 742 Mbit/s all along.
            # (One that moves at `persist` anyway goes on: a figure only bounded
            # takes the next reading that stands for the path, if no slower.)
            streak = self.streak = streak.again(streak.began)
        streak.saw(self._bound_beta(seconds, beta_bytes))
        streak.reports += reports
        streak.betas = [*streak.betas, reading][-self.config.persist:]
        streak.slowest = max(streak.slowest, reading)
        streak.informative = streak.informative and narrow
        streak.alone = streak.alone and alone
        streak.beyond_host = streak.beyond_host and beyond_host
        self.syncs_agree = False
        if streak.reports < self._persist(streak):
            return
        figure = min(streak.betas)  # the fastest the path surely was
        if direction > 0 and self._contradicted(streak):
            # What crossed since the streak began says the path was faster than its
            # readings: they are the host's, not the link's (on the cnn's fast phases
            # AllGather Top-k syncs read "65 Mbit/s" beside AR-tree syncs whose bytes
            # crossed at 330, and the estimate flipped between them). Nothing moves
            # on syncs that contradict each other; a probe settles it, unless a
            # test the job shared the link with stands: that test is what the
            # probe would read (in the lm lab such an ask 6 s after one spent the
            # duty budget the next recovery needed).
            self.streak = None
            if self.floor is None:
                self.find_out("syncs contradict each other", ts)
            return
        if direction < 0 and figure >= self.beta_s_per_byte:
            # Quicker than the fitted overhead allows, yet nothing in the streak surely
            # crossed faster than the figure: the host's work was quicker, not the path
            # (taken, the lm lab's PowerSGD rank 4 syncs "bounded" a 30 Mbit/s link at
            # 26 between looks at 35, down and up, a move each).
            self.streak = None
        elif direction < 0:
            old = self.beta_s_per_byte
            self._set(figure, SYNC if streak.informative else SYNC_BOUND, ts,
                      lower_bound=not streak.informative)
            if not streak.informative and old >= figure * (1 + self.config.level_shift):
                # Worth a test only as far as the syncs' own level rule: faster
                # bounds within 1.5x are noise a test cannot act on (the lm lab's
                # MOO asked four times at 26-30 Mbit/s on its first phase and
                # spent the duty budget before the link recovered); a recovery's
                # first bounds rose 2.3-20x.
                self.find_out("faster, only bounded", ts)
        elif streak.informative and streak.alone:
            self._set(figure, SYNC, ts, lower_bound=False)
        elif streak.beyond_host:
            # Slower than any overhead explains: the path moved, by at least this
            # much; a probe says how far. (The job's first steps all overlapped the
            # test asked for at registration and taught the ring no overhead; its
            # 305 ms bf16 syncs on a 10 Mbit/s link, an overhead of up to 100 ms
            # allowed, read too wide to stand alone, and the probe came too late.)
            self._set(figure, SYNC_BOUND, ts, lower_bound=True)
            self.find_out("slower than the host explains", ts)
        elif not self.config.probes or (streak.probe_late and ts - streak.began >= self.config.probe_wait_s):
            self._set(figure, SYNC_BOUND, ts, lower_bound=True)  # no probe will confirm it (soon): a bound
        elif not streak.probe_asked:
            streak.probe_asked = True
            self.find_out("slower streak", ts)

    def _persist(self, streak: Streak) -> int:
        """The readings a streak needs to move the figure: `persist`, or where every
        reading of a slower one stands for the path alone and took longer than
        any host work explains (a fall, not a stall), `persist_sure`. In the cnn
        lab each fall to 20 Mbit/s ran a third 0.45 s bf16 step before it moved,
        and the job two more before it adopted what that changed."""
        sure = streak.direction > 0 and streak.informative and streak.alone and streak.beyond_host
        return min(self.config.persist, self.config.persist_sure) if sure else self.config.persist

    def _contradicted(self, streak: Streak) -> bool:
        """Whether what crossed since a slower streak began was faster, by `change`,
        than its fastest reading: its readings are then the host's (or the old
        path's), not the link's."""
        return streak.crossed is not None and streak.crossed * (1 + self.config.change) < min(streak.betas)

    def _beyond_host(self, seconds: float, beta_bytes: float) -> bool:
        """Whether a sync's bytes took longer than the estimate allows (by `change`)
        even with `overhead_max_s` of its time the host's."""
        wire = seconds - self.config.overhead_max_s
        beta = self.beta_s_per_byte
        return beta is not None and wire > 0 and self._beta(wire, beta_bytes) > beta * (1 + self.config.change)

    def probe_late(self, wait_s: float) -> None:
        """The probe asked for runs `wait_s` from now. Further off than
        `probe_wait_s`, the syncs stand in for it: a slower move they keep showing
        for `probe_wait_s` is taken as a lower bound, as where no probe comes (the
        lab's duty budget, spent on a job's first tests, ran the next one 110 s
        later, the estimate the old, faster figure all the while). Taken at once,
        a cnn job's Top-k syncs on an 820 Mbit/s link, mostly gloo's own work,
        read "at least 27 Mbit/s" and restarted its first exploration three times.
        The probe still confirms or refutes it when it comes."""
        streak = self.streak
        if wait_s > self.config.probe_wait_s and streak is not None and streak.direction > 0:
            streak.probe_late = True

    # -- active figures -----------------------------------------------------------
    def observe_probe(self, beta: float, ts: float, shared: bool = False) -> None:
        """A bandwidth test of the job's path (the slowest of its fresh peers).
        `shared`: the job synced over the path while the test ran, so the test had
        what the job left of the link: a first figure, or one faster than the
        estimate, is a lower bound, and one that agrees with a figure only bounded
        confirms nothing. A slower one is judged as any slower test (read twice,
        or ignored while the syncs agree with the estimate): taken as nothing, a
        test that read 10 Mbit/s a minute after a drop from 1 Gbit/s was ignored
        and the estimate stayed at 598-953 Mbit/s (a CI run of the short lab)."""
        old, change = self.beta_s_per_byte, self.config.change
        # whatever syncs or looks suspected or asked, this answers
        self.suspect_beta = self.looking_since = self.look_asked = None
        slower_pending = self.streak is not None and self.streak.direction > 0
        if shared and (old is None or beta <= old / (1 + change)):
            self._set(beta, PROBE_SHARED, ts, lower_bound=True)  # the path is at least this fast
            self.floor, self.seen_at = (ts, beta), ts
            return
        if shared and self.lower_bound and beta < old * (1 + change):
            if self.floor is None or beta <= self.floor[1]:
                self.floor = (ts, beta)
            self.seen_at = ts
            return  # agrees with a figure only bounded: still only bounded
        if old is not None and self._under_crossing(beta, ts):
            self.probe_pending = None
            return  # it read what the job's syncs left of the link
        self.seen_at, self.look_pending = ts, None
        if old is None or (self.lower_bound and beta < old):
            self._set(beta, PROBE, ts)
        elif slower_pending and beta >= old * (1 + change):
            # the syncs' slower move, confirmed; the path carried at least what crossed it
            self._set(min(beta, min(self.streak.betas)), f"{SYNC}+{PROBE}", ts)
        elif beta <= old / (1 + change):
            self._set(beta, PROBE, ts)  # faster than the estimate: it carried that much
        elif beta < old * (1 + change):
            self.beta_s_per_byte = ewma(old, beta, self.config.beta_weight)
            self.lower_bound, self.confirmed, self.probe_pending = False, ts, None
        elif self.syncs_agree:
            self.probe_pending = None  # the job's own traffic shared the path with the test
        elif self.probe_pending is not None and relative_change(self.probe_pending, beta) < change:
            self._set(beta, PROBE, ts)
        else:  # one slower probe alone: read it again before believing it
            self.probe_pending = beta
            self.ask("a slower probe, read again")

    def observe_look(self, beta: float, ts: float, slowest: float | None = None,
                     all_paths: float | None = None) -> None:
        """A look at the job's path, its reading through the link's bucket
        (`looked_beta`; on a link configured plain it may read up to
        `look_overread` times the rate of a bucket the estimate was not told
        of). `slowest`: where the job has several paths, the slowest of recent
        looks at each (inf while one has none); else this look.

        Faster than the figure by `level_shift` (and that overread) on every path:
        the path moved, and the slowest reading is the figure, with no probe to
        wait for (a train is timed by the receiving kernel, not by a process a
        busy host starves). Faster on this path, where another has no recent
        look: looks at the others are wanted (in the cnn lab, tests asked so took
        most of the duty budget), and a probe is asked for if they have not
        settled it within `probe_wait_s`; where the slowest path's look is not
        faster, the figure stands.
        Slower by `level_shift` on this path, twice in a row, and neither under
        what the job's syncs carried meanwhile (`_under_crossing`: a look that
        shared the link with them read what they left): the path fell, and the
        faster of the two is the figure. Asked of a test, in the cnn lab the
        duty budget put it 70-90 s off, and the estimate stayed at 967 Mbit/s
        through a 410 Mbit/s phase its looks read at every turn. Where the
        second reads slower than the first by `level_shift` too, the path is
        still falling: it is read again (a short lab's 1 Gbit/s look, then one
        at 10 Mbit/s, made the figure 977 Mbit/s after the fall). The second
        must itself read slower: where another path's look agreed, the first
        (the slowest path's latest) counted twice made a 20 Mbit/s figure 9.3
        in the default lab. Else the figure stands, as of now; where not every
        path agrees, another path's slower look stays to be read again (in the
        digits lab one path's looks, agreeing with an overread 3,857 Mbit/s
        figure, dropped another's 975 each time, and the figure stood through
        the phase)."""
        figure = self.beta_s_per_byte
        if figure is None:
            return
        if not self.lower_bound and beta >= figure * (1 + self.config.level_shift) and self._syncs_slowed():
            self._fell_with_syncs(beta, ts)
            return
        shared = self.config.look_shared_s
        if self._under_crossing(beta, ts, shared):
            return  # it read what the job's syncs left of the link: it says nothing
        every = beta if slowest is None else slowest
        if math.isfinite(every) and self._under_crossing(every, ts, shared):
            every = math.inf  # another path's look read what the syncs left: looked at again
        paths = every if all_paths is None else all_paths
        pending = self.look_pending
        if pending is not None and ts - pending[0] > self.config.probe_wait_s:
            pending = None  # too old to be read twice with this one
        self.look_pending = None
        drift, self.look_drift = self.look_drift, None  # the look before, if this one agrees
        if self.lower_bound:
            self._look_at_bound(beta, every, pending, ts)
            return
        shift = 1 + self.config.level_shift
        reading = max(beta, every) if math.isfinite(every) else beta  # the slowest path looked at
        slower = reading >= figure * shift
        this_slower = beta >= figure * shift  # this look itself, not only the slowest path's latest
        if every * self.faster_look_shift <= figure:
            self._set(every, LOOK, ts)
            self.looked = self.look_figure = ts
        elif beta * self.faster_look_shift <= figure and not math.isfinite(every):
            self._look_elsewhere(beta, ts)
        elif slower and pending is not None and this_slower and reading < pending[1] * shift:
            self._set(min(reading, pending[1]), LOOK, ts)  # the two agree: the faster of them
            self.looked = self.look_figure = ts
        elif slower:
            # A look that itself agrees reads no path slower a second time: the
            # slowest path's earlier look stays the one to be read again.
            again = pending is not None and not this_slower
            self.look_pending = pending if again else (ts, reading)
            self.follow_up()
        else:  # the slowest path looked at agrees, or reads faster where another does not
            self.looked, self.suspect_beta, self.looking_since, self.look_asked = ts, None, None, None
            every_path_agrees = paths < figure * shift  # inf (a path unlooked) agrees with nothing
            if not every_path_agrees:
                self.look_pending = pending  # it read this path: another's slower look stays to be read again
            if not self._drift_down(figure, beta, drift, ts) and math.isfinite(paths):
                self._refine_by_look(figure, max(beta, paths), ts)
            if self.streak is not None and self.streak.direction > 0 and every_path_agrees:
                self.streak = None  # the syncs' slowing was the host's

    def _syncs_slowed(self) -> bool:
        """Whether the job's syncs have read slower than the figure `persist` times
        in a row (too wide to stand for the path: a look was asked of them)."""
        streak = self.streak
        return streak is not None and streak.direction > 0 and streak.reports >= self.config.persist

    def _fell_with_syncs(self, reading: float, ts: float) -> None:
        """A look slower by `level_shift` beside the syncs' slower streak: two kinds
        of reading agree that the path fell. The figure is the faster of the look
        and what the syncs surely carried (a lower bound, which the next looks
        refine): a look sent into the job's syncs reads what they leave. Waiting
        for a second look instead, the cnn lab's fall from 820 to 160 Mbit/s ran
        dense at 94 ms a sync for 1.5 s: the first look had held the link 7.5 ms,
        and the looks' pace held the next off."""
        streak = self.streak
        assert streak is not None
        carried = min(streak.betas)
        self.looked = ts  # `_set` ends the streak and the pending look
        if reading <= carried:
            self._set(reading, LOOK, ts)
            self.look_figure = ts
        else:
            self._set(carried, SYNC_BOUND, ts, lower_bound=True)

    def _drift_down(self, figure: float, beta: float, drift: tuple[float, float] | None, ts: float) -> bool:
        """Two looks in a row that themselves read slower than the figure by
        `change`, short of a slower look's `level_shift`: the figure drifts toward
        the faster of them by `look_weight` (no move). A figure an overread look
        set is otherwise held by the looks after it, whatever their paths: in the
        lm lab PowerSGD rank 4's 1,293 Mbit/s (1.35x a 1 Gbit/s link's goodput)
        stood 16 s beside looks at 0.97-1.04x. One such look alone is a path's
        noise (bf16's 0.78x beside two at 1.02x). `drift`: the look before, where
        it was such a look and nothing has moved the figure since."""
        slower = figure * (1 + self.config.change)
        if beta < slower:
            return False
        if drift is None or ts - drift[0] > self.config.probe_wait_s or drift[1] < slower:
            self.look_drift = (ts, beta)
            return False
        self.beta_s_per_byte = toward(figure, min(beta, drift[1]), self.config.look_weight)
        self.confirmed = self.look_figure = ts
        return True

    def _refine_by_look(self, figure: float, slowest: float, ts: float) -> None:
        """Every path looked at lately reads the figure or faster, short of a
        move: a faster slowest path is the figure, a slower one draws it by
        `look_weight` (slower by `change` or more is `_drift_down`'s). Faster
        readings short of `level_shift` moved nothing before: in the default lab
        one stalled look set a 1 Gbit/s phase's figure at 563 Mbit/s and every
        path's looks after it, 782-1,100, left it there; drawn halfway, another
        phase's figure reached 860 of 935 as it ended (replayed over 21 runs,
        taken whole: medians within 10% 430 then 439 of 649 phases). Taken to
        `change` or more from where the last move was counted, it is a move (the
        policy reconsiders only at one); counted at `change` / 2, as a figure
        set is, the lm lab's 30 Mbit/s phases, their syncs reading 0.85x and
        their looks 1.0x, counted 9% more moves in the replay. On a
        link configured plain only toward a slower one: a faster reading may be
        a bucket's peak the estimate was not told of."""
        if slowest >= figure * (1 + self.config.change):
            return
        if self.bucket.plain and slowest < figure:
            return
        self.confirmed = self.look_figure = ts
        if slowest >= figure:
            self.beta_s_per_byte = toward(figure, slowest, self.config.look_weight)
            return
        # faster: taken whole, as a path's reading is its fastest recent look (a
        # stall reads slow, not fast)
        self.beta_s_per_byte = slowest
        if self._past_last_move(slowest, self.config.change):
            self._moved(ts)  # the policy hears of it

    def _look_at_bound(self, beta: float, every: float, pending: tuple[float, float] | None, ts: float) -> None:
        """A look while the figure only bounds the path from below: the slowest
        path's reading (`every`) is the figure (the path is at least the bound,
        so no slower), unless it reads slower than the bound by `change`: it
        shared the link with the job's syncs and read what they left, and if
        the next look (`pending`) did too, a probe settles it. About the bound
        or faster on this path with another unlooked: looks at the others first
        (`_look_elsewhere`)."""
        bound = self.beta_s_per_byte
        assert bound is not None
        within = bound * (1 + self.config.change)
        under = (every > within and math.isfinite(every)) or beta > within
        if every <= within:
            self._set(min(every, bound), LOOK, ts)
            self.looked = self.look_figure = ts
        elif not under:
            self._look_elsewhere(beta, ts)
        elif pending is not None:  # twice in a row, as a slower look at a confirmed figure
            self.ask(self.look_reason if self.look_asked is not None else "looks read under the bound")
        else:
            self.look_pending = (ts, beta)
            self.follow_up()

    def _look_elsewhere(self, beta: float, ts: float) -> None:
        if self.looking_since is None:
            self.looking_since = ts
        if ts - self.looking_since < self.config.probe_wait_s:
            self.suspect_beta = beta
            self.follow_up()
        else:  # the other paths' looks did not come
            self.suspect_beta, self.looking_since = beta, None
            self.ask("a look read faster")

    @property
    def faster_look_shift(self) -> float:
        """How much faster than a reading a look must read to say the path moved:
        `level_shift`, and on a link configured plain the overread of a bucket the
        estimate was not told of (one it was told of is read through, `looked_beta`)."""
        overread = self.config.look_overread if self.bucket.plain else 1.0
        return (1 + self.config.level_shift) * overread

    def looked_beta(self, beta: float, bytes_sent: float, queued_s: float = 0.0) -> float:
        """What a look's reading stands for: a train of `bytes_sent` that crossed
        at `beta`, read through the link's bucket (a train inside the credit
        crosses at the peak), unless it waited `queued_s` (QUEUED_S or more)
        behind traffic while the job's syncs each hold the link so long that
        a train inside one came after its credit was spent (SPENT_SHARE): then
        it crossed at the rate. Read through the bucket, a dense lm job's looks
        of a 30 Mbit/s link, sent into its busy ring, read 0.83x the rate for
        whole phases."""
        spent_after_s = self.bucket.peak_s / (1 - SPENT_SHARE)
        if queued_s >= QUEUED_S and (self.sync_wire_s or 0.0) >= spent_after_s:
            return beta
        return self._beta(beta * bytes_sent, bytes_sent)

    def observe_report(self, beta: float, ts: float) -> None:
        """The job's own figure for its network, taken as it is."""
        self._set(beta, REPORT, ts)
        self.seen_at = ts

    def _set(self, beta: float, evidence: str, ts: float, lower_bound: bool = False) -> None:
        # measured from where the last move was counted: a figure that bounds let
        # drift is still judged against the link last declared
        moved = self._past_last_move(beta, self.config.change / 2)
        self.beta_s_per_byte, self.lower_bound, self.evidence = beta, lower_bound, evidence
        self.streak, self.probe_pending, self.syncs_agree, self.suspect_beta = None, None, False, None
        self.looking_since, self.look_pending, self.look_figure, self.look_drift = None, None, None, None
        self.bounds, self.floor = ([(ts, beta)] if lower_bound else []), None
        if not lower_bound:
            self.confirmed, self.look_asked = ts, None
        if moved:
            self._moved(ts)

    def _past_last_move(self, beta: float, share: float) -> bool:
        """Whether `beta` is `share` or more from the figure the last move was
        counted at (or no move was counted yet)."""
        return self.moved_beta is None or relative_change(self.moved_beta, beta) >= share

    def _moved(self, ts: float) -> None:
        self.moved_at, self.moves, self.moved_beta = ts, self.moves + 1, self.beta_s_per_byte

    # -- persistence --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = asdict(self)
        state.pop("config")
        state.pop("bucket")
        state["format"] = STATE_FORMAT
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly from `state_dict()`; ValueError naming what is wrong."""
        if state.get("format") not in (1, STATE_FORMAT):
            raise ValueError(f"estimate.format: expected {STATE_FORMAT}, got {state.get('format')!r}")
        try:
            # a fit written before `seen` and `host` were kept was read once its weight reached 1
            overheads = {k: CollectiveFit(**{"seen": v["weight"] >= 1.0, "host": v["weight"], **v})
                         for k, v in state["overheads"].items()}
            streak = self._streak(state["streak"]) if state["streak"] else None
            fields = {k: state[k] for k in ("beta_s_per_byte", "lower_bound", "evidence", "moved_at",
                                            "confirmed", "wants_probe", "probe_pending", "syncs_agree",
                                            "aged_ask")}
            # a state written before burst-sized syncs were watched had neither
            fields["suspect_beta"] = state.get("suspect_beta")
            # nor had a state written before looks
            fields["looked"] = None if state.get("looked") is None else float(state["looked"])
            fields["look_figure"] = None if state.get("look_figure") is None else float(state["look_figure"])
            fields["looking_since"] = None if state.get("looking_since") is None else float(state["looking_since"])
            fields["wants_look"] = bool(state.get("wants_look", False))
            fields["look_follows"] = bool(state.get("look_follows", False))
            fields["sync_wire_s"] = None if state.get("sync_wire_s") is None else float(state["sync_wire_s"])
            pending = state.get("look_pending")  # a bool before what it read was kept: read again
            fields["look_pending"] = (float(pending[0]), float(pending[1])) \
                if isinstance(pending, (list, tuple)) else None
            drift = state.get("look_drift")  # a state written before looks drifted the figure had none
            fields["look_drift"] = (float(drift[0]), float(drift[1])) if drift is not None else None
            fields["probe_reason"] = str(state.get("probe_reason", ""))
            fields["look_asked"] = None if state.get("look_asked") is None else float(state["look_asked"])
            fields["look_reason"] = str(state.get("look_reason", ""))
            fields["fell_at"] = None if state.get("fell_at") is None else float(state["fell_at"])
            # a state written before every option's level was watched named only burst-sized ones
            levels = {str(k): [float(t) for t in v] for k, v in state.get("levels", state.get("small", {})).items()}
            floor = state.get("floor")
            fields["floor"] = (float(floor[0]), float(floor[1])) if floor is not None else None
            fields["moves"] = state.get("moves", 0)  # a state written before the count had none
            # a state written before moves cut the paths' readings had noted every move
            fields["moves_noted"] = int(state.get("moves_noted", fields["moves"]))
            for name in ("paths_fresh_since", "answer_looks_since"):  # None before they were kept
                fields[name] = None if state.get(name) is None else float(state[name])
            fields["moved_beta"] = state.get("moved_beta", state["beta_s_per_byte"])
            bounds = [(float(t), float(b)) for t, b in state["bounds"]]
            # a state written before what crossed was kept had none
            fields["crossing"] = [(float(t), float(b)) for t, b in state.get("crossing", [])]
            # before it was kept: the confirmation, or for a figure only bounded its last time
            seen_at = state.get("seen_at", state["confirmed"] if state["confirmed"] is not None else
                                None if state["beta_s_per_byte"] is None else _latest(state, bounds))
            fields["seen_at"] = None if seen_at is None else float(seen_at)
            # a state written before the job's clock ran on the caller's: go on from its last time
            fields["trained_s"] = float(state.get("trained_s", _latest(state, bounds)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"estimate: damaged state ({exc!r})") from None
        check_count("estimate.moves", fields["moves"])
        if fields["moved_beta"] is not None:
            check_range("estimate.moved_beta", fields["moved_beta"], 0.0, math.inf, open_low=True)
        for name, value in fields.items():
            setattr(self, name, value)
        self.overheads, self.streak, self.bounds, self.levels = overheads, streak, bounds, levels

    def _streak(self, state: dict[str, Any]) -> Streak:
        """A stored streak; one of format 1 has a `since` and every beta it read."""
        state = {k: v for k, v in state.items() if k != "since"}
        betas = [float(b) for b in state.pop("betas")]
        streak = Streak(**state, betas=betas[-self.config.persist:])
        streak.slowest = max([streak.slowest, *betas])
        return streak


def _latest(state: dict[str, Any], bounds: list[tuple[float, float]]) -> float:
    """The latest time a stored estimate names."""
    times = [state[k] for k in ("moved_at", "confirmed", "aged_ask") if state[k] is not None]
    times += [t for t, _ in bounds]
    if state["streak"]:
        times.append(state["streak"].get("began", 0.0))
    return max(times, default=0.0)


class SyncReader:
    """Reads a job's step reports as syncs of its options: each report's bytes per
    unit of beta from the cost model's formulas for what it ran (cached per option:
    the agent ingests tens of thousands of reports a second), and a message's
    reports as one observation per option (their median time). Reports that
    overlapped a bandwidth test (`disturbed`) or measured no sync are left out."""

    def __init__(self, layout: GradientLayout, nodes: int, forms: ModelForms | None = None) -> None:
        self.layout, self.nodes, self.forms = layout, nodes, forms or ModelForms()
        self._terms: dict[tuple[str, float, str], tuple[str, float]] = {}

    def terms(self, report: StepReport) -> tuple[str, float]:
        """(the option's sync form, the bytes its sync moves per unit of beta)."""
        key = (report.family, report.param, report.collective)
        terms = self._terms.get(key)
        if terms is None:
            choice = report.choice
            _, beta_bytes = option_terms(choice.compression, choice.collective, self.layout, self.nodes, self.forms)
            terms = self._terms[key] = (sync_form(choice.compression, choice.collective), beta_bytes)
        return terms

    def observe(self, estimate: LinkEstimate, reports: Iterable[StepReport], ts: float) -> None:
        by_option: dict[tuple[str, float], list[float]] = {}
        for r in reports:
            if not r.disturbed and r.t_sync_s >= MIN_SYNC_S:
                by_option.setdefault(self.terms(r), []).append(r.t_sync_s)
        for (form, beta_bytes), times in by_option.items():
            estimate.observe_sync(form, beta_bytes, statistics.median(times), ts, len(times))
