"""The network as the agent knows it: each peer's path from active probes, and
each job's bottleneck from its own syncs and its peers' probes.

alpha: per-message latency (s); beta: seconds per byte (8 / bits per second).

- A peer's path (`PeerPath`) is what active probes measured: a latency burst gives
  alpha (half the smallest RTT; the smallest of the last ALPHA_BURSTS bursts: a
  loaded host once read 8 ms on a 40 us path, and the policy explored on it), a
  bandwidth test beta. Readings within `change_threshold` of the last are
  smoothed; one beyond it replaces it.
- A job's bandwidth is its `LinkEstimate` (policy/linkestimate.py, the one
  detector of a moved network, shared with in-process policies): every sync of
  every option the job runs, read through the cost model's bytes, with each
  option's overhead fitted beside the one bandwidth; probes of its peers confirm
  or correct it. It runs on the job's own clock (`LinkEstimate.advance`: the
  training time its reports add up to), the peers' paths on the caller's.
  Until the job's syncs or a probe made since it registered give it a figure,
  the slowest peer probed within `max_probe_age_s` stands in. A probe for the
  job reads the slowest of its peers tested since it registered, or since its
  syncs last suspected a move (`moved_since`, when a probe is asked for
  then): a peer tested before a link recovered would otherwise hold the job
  at the old, slower rate.
- `Estimator` owns every path and computes the one bottleneck a policy sees: the
  job's beta, whether it is only a lower bound and how long ago it was confirmed,
  and the highest alpha among its peers.

Pure: no I/O and no clock (timestamps are whatever the caller passes).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from flexcomm.policy.linkestimate import PROBE, LinkEstimate, LinkEstimateConfig, ewma, relative_change
from flexcomm.policy.types import PLAIN_LINK, LinkBucket, NetworkObservation, check_range
from flexcomm.store.records import BANDWIDTH, LATENCY, LOOK, PASSIVE, Measurement

ALPHA_BURSTS = 5
# Looks at a job's several peers within this long stand together for its path: the
# scheduler looks at them in turn, one every 0.4-2 s at most (LOOK_DUTY_CYCLE).
# An older look slower than the path holds a recovery back only until that peer is
# looked at again; the slowest path is taken, so no path makes the job's seem faster
# than it is (a path's own older, faster look stands for it only until the figure
# moves: a fall is read off the looks themselves, LinkEstimate.observe_look).
# While the job's estimate has a question out, only the peers looked at since count,
# as a test's reading counts from the peers read since the move it answers.
LOOK_SPAN_S = 30.0
# A path's reading is the fastest of its last few looks within the span (since the
# job's figure last moved): a host stall stretches a train and reads it slow, and
# one sent while the job's syncs had spent the bucket's credit crosses at the rate,
# not the peak it is read through (1/1.2 slow in the lab); neither reads fast
# beyond the peak (BBR keeps the windowed maximum of its rate samples so). In the
# default lab at 1 Gbit/s a quarter of the looks read under 0.8x and some 0.3x; in
# the lm lab a dense job's looks of a 30 Mbit/s link read 0.83x or 1.0x, and with
# one look per path in a 10 s span the slowest path's was mostly a 0.83x one: its
# figure sat at 0.85x for whole phases.
LOOKS_KEPT = 5
LOOK_RTTS_KEPT = 20  # the looks whose quickest answer is the path's own round trip
# What a restarted agent reads back of each peer's measurements of each kind: all
# that a path keeps (its looks, its alpha's bursts).
RESTORED_PER_KIND = max(LOOKS_KEPT, ALPHA_BURSTS)


@dataclass(frozen=True)
class EstimateConfig:
    """How probe readings are smoothed (`smoothing`, `change_threshold`, fractions),
    how old a probe may be to start a job's estimate (`max_probe_age_s`), and how a
    job's syncs are weighed (`link`, policy.linkestimate)."""

    smoothing: float = 0.3
    change_threshold: float = 0.10
    max_probe_age_s: float = 60.0
    link: LinkEstimateConfig = field(default_factory=LinkEstimateConfig)

    def __post_init__(self) -> None:
        for name in ("smoothing", "change_threshold", "max_probe_age_s"):
            check_range(name, getattr(self, name), 0.0, math.inf, open_low=True)


class Look(NamedTuple):
    """A look that read: when, the train's figure before the bucket, its bytes,
    and how long it waited behind traffic on the path (its round trip less the
    quickest of the path's latest LOOK_RTTS_KEPT; None where not known)."""

    ts: float
    beta: float
    bytes_sent: int | None
    queued_s: float | None


@dataclass
class PeerPath:
    """One peer as active probes measured it; None until measured. Timestamps
    are the caller's (seconds since the epoch in the agent)."""

    address: str
    alpha_s: float | None = None
    beta_s_per_byte: float | None = None
    rtt_s: float | None = None
    rtt_p99_s: float | None = None
    loss: float | None = None
    updated: float | None = None  # the last successful measurement
    measured: float | None = None  # the last bandwidth test
    look_tried: float | None = None  # the last look, answered or not
    looks: deque[Look] = field(
        default_factory=lambda: deque(maxlen=LOOKS_KEPT), repr=False)
    failures: int = 0
    _look_rtts: deque[float] = field(default_factory=lambda: deque(maxlen=LOOK_RTTS_KEPT), repr=False)
    _alphas: deque[float] = field(default_factory=lambda: deque(maxlen=ALPHA_BURSTS), repr=False)

    @property
    def bandwidth_bps(self) -> float | None:
        return None if not self.beta_s_per_byte else 8.0 / self.beta_s_per_byte

    @property
    def looked(self) -> float | None:
        """When the last look that read was taken."""
        return self.looks[-1][0] if self.looks else None

    def observe(self, m: Measurement, ts: float, config: EstimateConfig) -> bool:
        """Take one measurement; True when it was a bandwidth reading."""
        if m.kind == LOOK:
            self.look_tried = ts
        if not m.ok:
            self.failures += 1
            return False
        if m.kind in (LATENCY, PASSIVE) and m.alpha_s is not None:
            self._alphas.append(m.alpha_s)
            self.alpha_s = min(self._alphas)  # a burst that read more was the host's delay
        for name in ("rtt_p50_s", "rtt_p99_s", "loss"):
            value = getattr(m, name)
            if value is not None:
                setattr(self, "rtt_s" if name == "rtt_p50_s" else name, value)
        self.updated = ts
        if m.kind == LOOK:  # the job's estimate judges it: not the probed rate
            self.looks.append(Look(ts, m.beta_s_per_byte, m.bytes_sent, self._queued(m.rtt_min_s)))
        if m.kind not in (BANDWIDTH, PASSIVE) or not m.beta_s_per_byte:
            return False
        old, new = self.beta_s_per_byte, m.beta_s_per_byte
        moved = old is None or relative_change(old, new) >= config.change_threshold
        self.beta_s_per_byte = new if moved else ewma(old, new, config.smoothing)
        self.measured = ts
        return True

    def _queued(self, rtt_s: float | None) -> float | None:
        """How long a train whose round trip (less its crossing) took `rtt_s`
        waited behind traffic: the excess over the path's quickest recent look."""
        if rtt_s is None:
            return None
        self._look_rtts.append(rtt_s)
        return rtt_s - min(self._look_rtts)


def _looked(job: LinkEstimate, path: PeerPath) -> float:
    """`path`'s latest look as `job`'s estimate reads it (through its bucket)."""
    return _read(job, path.looks[-1])


def _path_reading(job: LinkEstimate, path: PeerPath, since: float) -> float | None:
    """The fastest of `path`'s kept looks taken at or after `since`, as `job` reads
    them (LOOKS_KEPT); None where it has none."""
    betas = [_read(job, look) for look in path.looks if look.ts >= since]
    return min(betas) if betas else None


def _quickened(job: LinkEstimate, path: PeerPath, ts: float) -> bool:
    """Whether `path`'s latest look (at `ts`) reads it faster than every earlier
    look of it within the span, since `job`'s figure last moved, by a move's
    `level_shift` (and the overread a plain link allows): the path moved, and
    the other paths, whose readings may be of the old network, are looked at
    now (each path's reading is its fastest recent look, so a new one that
    reads the move outweighs the old). A host stall never reads a path fast,
    so only a quicker look says so. In the default lab a look at 1 Gbit/s
    after 20 agreed with the figure through the other paths' looks of the slow
    phase, and the next looks came only as the syncs grew blind, one a 2 s: the
    figure moved 5 s into a 5 s phase."""
    since = _look_window(job, ts)
    earlier = [_read(job, look) for look in list(path.looks)[:-1] if look.ts >= since]
    return bool(earlier) and _looked(job, path) * job.faster_look_shift <= min(earlier)


def _read(job: LinkEstimate, look: Look) -> float:
    return job.looked_beta(look.beta, look.bytes_sent, look.queued_s or 0.0) if look.bytes_sent else look.beta


def _since_move(job: LinkEstimate) -> float:
    """Readings of `job`'s paths taken before this are of the network before its last move."""
    return -math.inf if job.paths_fresh_since is None else job.paths_fresh_since


def _look_window(job: LinkEstimate, ts: float) -> float:
    """The oldest look that stands for its path at `ts`: within LOOK_SPAN_S and since the figure moved."""
    return max(ts - LOOK_SPAN_S, _since_move(job))


class Estimator:
    """Every path the agent knows: its jobs' peers and the jobs themselves.

    `bucket` is the token bucket every path is taken to have (configured, not probed).
    """

    def __init__(self, bucket: LinkBucket = PLAIN_LINK, config: EstimateConfig | None = None) -> None:
        self.bucket = bucket
        self.config = config or EstimateConfig()
        self.peers: dict[str, PeerPath] = {}
        self.jobs: dict[str, LinkEstimate] = {}
        self.job_peers: dict[str, tuple[str, ...]] = {}
        self.fresh_since: dict[str, float] = {}  # per job: peer readings older than this are another network's
        self.reported_alpha: dict[str, float] = {}

    def peer(self, address: str) -> PeerPath:
        return self.peers.setdefault(address, PeerPath(address))

    def add_job(self, job_id: str, peers: Iterable[str], ts: float) -> LinkEstimate:
        """Follow a job whose syncs cross the paths to `peers` (this host's own
        addresses already left out); a job added again starts afresh. A job with
        no peers gets no probe: its syncs stand alone."""
        self.job_peers[job_id] = tuple(dict.fromkeys(peers))
        link = self.config.link if self.job_peers[job_id] else replace(self.config.link, probes=False)
        self.jobs[job_id] = LinkEstimate(link, self.bucket)
        self.fresh_since[job_id] = ts
        self.reported_alpha.pop(job_id, None)
        return self.jobs[job_id]

    def remove_job(self, job_id: str) -> None:
        for table in (self.jobs, self.job_peers, self.fresh_since, self.reported_alpha):
            table.pop(job_id, None)

    def restore(self, m: Measurement) -> None:
        """A measurement taken before a restart, into its peer's path alone (at its
        own time): the jobs' estimates resume from their saved state, which took it
        in, and taken in again it would be counted twice."""
        self.peer(m.peer).observe(m, m.ts or 0.0, self.config)

    def observe(self, m: Measurement, ts: float, shared: Container[str] = ()) -> list[str]:
        """One probe's measurement; the jobs whose paths it measured. `shared`: the
        jobs that synced over the path while the test ran (LinkEstimate.observe_probe).
        A look goes to those jobs' estimates alone (`LinkEstimate.observe_look`),
        with the slowest of its peers' readings within LOOK_SPAN_S (each the fastest
        of its kept looks; inf while one has none), and has the job want looks at
        its other paths where it calls for them (`_other_paths_wanted`)."""
        bandwidth = self.peer(m.peer).observe(m, ts, self.config)
        affected = [j for j, peers in self.job_peers.items() if m.ok and m.peer in peers]
        for job_id in affected:
            self.jobs[job_id].note_moves(ts)  # a move the syncs made since the last reading
        if m.kind == LOOK and m.beta_s_per_byte:
            for job_id in affected:
                self._looked_for(job_id, self.peer(m.peer), ts)
        for job_id in affected if bandwidth else ():
            beta = self._probed_beta(self.job_peers[job_id], since=self._fresh(job_id, ts))
            if beta is not None:
                job = self.jobs[job_id]
                job.observe_probe(beta, job.trained_s, shared=job_id in shared)
        for job_id in affected:
            self.jobs[job_id].note_moves(ts)  # this reading's move: it counts, those before do not
            if m.kind == LOOK and m.beta_s_per_byte and self._other_paths_wanted(job_id, self.peer(m.peer), ts):
                self.jobs[job_id].follow_up()
        return affected

    def _other_paths_wanted(self, job_id: str, looked: PeerPath, ts: float) -> bool:
        """Whether a look at `looked` calls for looks at the job's other paths now:
        one of them was not looked at since the figure moved, this look read its
        path quickened (`_quickened`), or the slowest path rests on one look."""
        return self._untried_since_move(job_id) or _quickened(self.jobs[job_id], looked, ts) or \
            self._slowest_on_one_look(job_id, looked, ts)

    def _slowest_on_one_look(self, job_id: str, looked: PeerPath, ts: float) -> bool:
        """Whether the latest look at `looked` reads faster, by a move, than the
        slowest of the job's paths, whose reading rests on its one look since the
        figure moved (within the span): a look a host stall stretched is read
        again. In the default lab a look read 338 Mbit/s of 1 Gbit/s and, taken
        as the figure, stood as its path's reading while the others read 965 and
        1,289."""
        job = self.jobs[job_id]
        since = _look_window(job, ts)
        read = self._readings(job, self.job_peers[job_id], since)
        if not read:
            return False
        slowest, path = max(read, key=lambda item: item[0])
        alone = sum(look.ts >= since for look in path.looks) == 1
        return alone and path is not looked and _looked(job, looked) * job.faster_look_shift <= slowest

    def _untried_since_move(self, job_id: str) -> bool:
        """Whether one of the job's paths has not been looked at since its figure
        last moved. Until each has, the slowest path is not known and no look
        refines the figure: looked at only as the syncs grew blind (one a 2 s),
        the default lab's 1 Gbit/s phases, 4-5 s long, ended with a figure one
        stalled look had set."""
        moved = _since_move(self.jobs[job_id])
        tried = [None if p is None else p.look_tried for p in (self.peers.get(a) for a in self.job_peers[job_id])]
        return any(t is None or t < moved for t in tried)

    def _fresh(self, job_id: str, ts: float) -> float:
        """The oldest test of the job's paths that is of its network now: not one
        older than `max_probe_age_s`, than a move its syncs suspect (`moved_since`),
        or than its estimate's last move (`LinkEstimate.note_moves`)."""
        return max(self.fresh_since[job_id], ts - self.config.max_probe_age_s, _since_move(self.jobs[job_id]))

    def moved_since(self, job_id: str, ts: float) -> None:
        """The job's syncs suspect its path moved by `ts`: what its peers read
        before describes the old network."""
        self.fresh_since[job_id] = max(self.fresh_since[job_id], ts)

    def observe_reported_network(self, job_id: str, alpha_s: float, bandwidth_bps: float) -> None:
        """The job's own estimate of its network, taken as it is."""
        self.reported_alpha[job_id] = alpha_s
        job = self.jobs[job_id]
        job.observe_report(8.0 / bandwidth_bps, job.trained_s)

    def bottleneck(self, job_id: str, nodes: int, ts: float) -> NetworkObservation | None:
        """What the job's policy sees at `ts`: its estimate (the slowest peer probed
        within `max_probe_age_s` until it has one; its age on the job's clock) and
        the highest alpha known on its paths. None while nothing is known."""
        job = self.jobs[job_id]
        alpha = self._alpha(job_id) or 0.0
        beta = job.beta_s_per_byte or self._probed_beta(self.job_peers[job_id],
                                                        since=ts - self.config.max_probe_age_s)
        if beta is None:
            return None
        net = NetworkObservation(alpha, beta, nodes, self.bucket, evidence=PROBE)
        return job.observation(net, job.trained_s) if job.beta_s_per_byte else net

    def _probed_beta(self, peers: Sequence[str], since: float) -> float | None:
        """The slowest of `peers` among those tested at or after `since`; None when none was."""
        betas = [p.beta_s_per_byte for p in (self.peers.get(a) for a in peers)
                 if p is not None and p.beta_s_per_byte and p.measured is not None and p.measured >= since]
        return max(betas) if betas else None

    def _looked_for(self, job_id: str, path: PeerPath, ts: float) -> None:
        """A look at one of the job's peers (`path`: its latest), with the
        slowest of their readings within LOOK_SPAN_S and since the job's figure
        last moved (inf while one has none); while the job's estimate has a question out
        (`LinkEstimate.find_out`), the figure is taken from the slowest of those
        looked at since its first look after the question, as a test's is from
        the peers read since the move it answers (in the default lab's 2-4 s of
        1 Gbit/s after 20, an older look at another path held each recovery back
        until the job ended)."""
        job, peers = self.jobs[job_id], self.job_peers[job_id]
        beta, moved = _looked(job, path), _since_move(job)
        every = self._slowest_look(job, peers, since=_look_window(job, ts))
        if job.look_asked is None:
            job.answer_looks_since = None
            job.observe_look(beta, job.trained_s, every)
            return
        if job.answer_looks_since is None:
            job.answer_looks_since = ts
        since = max(job.answer_looks_since, moved)
        job.observe_look(beta, job.trained_s, self._slowest_look(job, peers, since, partial=True), every)

    def _slowest_look(self, job: LinkEstimate, peers: Sequence[str], since: float, partial: bool = False) -> float:
        """The slowest of `peers`' readings since `since` (each path's the fastest of
        its kept looks), as `job` reads them; inf unless every one has one
        (`partial`: of those that have)."""
        readings = self._readings(job, peers, since)
        if not readings or (len(readings) < len(peers) and not partial):
            return math.inf
        return max(r for r, _ in readings)

    def _readings(self, job: LinkEstimate, peers: Sequence[str], since: float) -> list[tuple[float, PeerPath]]:
        """(reading, path) of each of `peers` with a look since `since` (`_path_reading`)."""
        paths = [p for p in (self.peers.get(a) for a in peers) if p is not None]
        return [(r, p) for p in paths if (r := _path_reading(job, p, since)) is not None]

    def _alpha(self, job_id: str) -> float | None:
        alphas = [p.alpha_s for p in (self.peers.get(a) for a in self.job_peers.get(job_id, ()))
                  if p is not None and p.alpha_s is not None]
        if job_id in self.reported_alpha:
            alphas.append(self.reported_alpha[job_id])
        return max(alphas) if alphas else None
