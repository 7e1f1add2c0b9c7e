"""The agent's network model (flexcomm.probe.estimate.Estimator), fed and read on
the event loop: probe measurements and step reports go in; jobs whose bottleneck
may have moved are re-decided, probes are asked for when a job's estimate wants
one, and what GetNetwork shows comes out (as domain objects: the service turns
them into messages).

A job's paths are those to its nodes but this host's own addresses (a path to
itself measures nothing). A step that overlapped a bandwidth test of one of its
paths is marked `disturbed`: the test shared the link with its sync, so neither
the estimate nor the policy's sync figures take it, unless the test held the
link for less than `HELD_SHARE` of the sync (a look's trains: a few ms). A test counts from when the
prober says it started (`bandwidth_started`), so the steps of messages that
arrive while it runs are marked too, and until its measurement (failed or not)
comes it has no end. The test's own reading is, for a job that synced while it
ran, what the job left of the link: at least that fast (`shared`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from flexcomm.agent.jobs import Job
from flexcomm.agent.metrics import Metrics
from flexcomm.policy.costmodel import ModelForms
from flexcomm.policy.linkestimate import LinkEstimate, SyncReader
from flexcomm.policy.types import GradientLayout, NetworkObservation, StepReport
from flexcomm.probe.addresses import is_local, local_addresses
from flexcomm.probe.estimate import Estimator, PeerPath
from flexcomm.store import TEST_KINDS, Measurement

log = logging.getLogger("flexcomm.agent.network")
# Bandwidth tests remembered per peer to mark the steps they overlapped.
TESTS_KEPT = 8
# Slack around a test (s) where a step's end is reckoned back from when its message
# arrived (the client's batching), and where the client stamped it (the test's own
# connection setup and teardown, both inside its recorded span, and a clock read).
TEST_SLACK_S = 0.5
STAMPED_SLACK_S = 0.05
# A stamp later than the message's arrival by more than this is another host's clock.
STAMP_AHEAD_S = 0.1
# A test started this long ago whose measurement never came (the prober stopped)
# marks no more steps: far longer than iperf3 may run
# before it is ended (its duration, connect timeout and slack, probe.iperf.run_test).
IN_FLIGHT_MAX_S = 60.0
# A job whose report came this long before a bandwidth test began, or later, synced
# while it ran: a job streaming reports sends one every agreement period (two steps;
# under a second at the lab's slowest, 500 ms steps).
SHARED_GAP_S = 1.0
# A test that held the link for less than this share of a step's sync delayed it
# less than the noise the estimate allows each sync (`LinkEstimateConfig.noise`).
# Counted whole, the cnn lab's looks (3-12 ms of trains) hid 0.4-0.55 s syncs of
# a fall to 20 Mbit/s from the estimate, which then moved on looks alone, 2-3 s in.
HELD_SHARE = 0.05

# peers -> seconds until the duty budget has room for the first
RequestProbes = Callable[[Sequence[str]], float]
RequestLooks = Callable[[Sequence[str], bool], None]


def job_layout(job: Job) -> GradientLayout:
    """The job's gradient as it described it, else one vector of its bytes."""
    return job.spec.layout or GradientLayout.flat(job.spec.grad_bytes)


def model_forms(job: Job) -> ModelForms | None:
    """The formulas the job's policy predicts with (its `forms`, when it has them),
    so its syncs are read alike."""
    forms = getattr(job.policy, "forms", None)
    return forms if isinstance(forms, ModelForms) else None


def job_peers(nodes: Iterable[str], own: frozenset[str]) -> list[str]:
    """The nodes a job's syncs reach from here: all but this host's `own` addresses."""
    return [n for n in dict.fromkeys(nodes) if not is_local(n, own)]


def mark_disturbed(reports: Sequence[StepReport], received: float,
                   tests: Iterable[tuple[float, float]]) -> list[StepReport]:
    """`reports` (oldest first) with those whose step overlapped one of `tests`
    ((start, end) times, the span the test held the link) for `HELD_SHARE` or
    more of its sync marked. A step ended when its client stamped it
    (`ended_unix`), else (no stamp, or one from another clock) as the next began,
    the last about when the message was `received`: there the slack is wide (the
    lab's 0.2 s tests, widened by 0.5 s either side, hid a job's first 1.2 s of
    steps from its estimate and stalled its first exploration for 34 steps)."""
    tests = list(tests)
    if not tests:
        return list(reports)
    out, end = [], received
    for r in reversed(reports):
        stamped = 0 < r.ended_unix <= received + STAMP_AHEAD_S
        end = r.ended_unix if stamped else end
        start, slack = end - r.step_s, STAMPED_SLACK_S if stamped else TEST_SLACK_S
        hit = any(s - slack < end and start < e + slack and e - s >= HELD_SHARE * r.t_sync_s for s, e in tests)
        out.append(dataclasses.replace(r, disturbed=True) if hit and not r.disturbed else r)
        end = start
    out.reverse()
    return out


@dataclass(frozen=True)
class JobNetwork:
    """What GetNetwork shows of one job: its peers' paths (own addresses as "self"),
    its estimate and the bottleneck its policy sees."""

    peers: list[tuple[PeerPath, str]]
    estimate: LinkEstimate
    bottleneck: NetworkObservation | None
    nodes: int
    job_id: str
    moved_unix: float | None  # when the estimate last moved (None: not since this agent started)


class NetworkFeed:
    """`redecide(job_id)` gives a job's policy its current bottleneck;
    `request_probes(peers)`, when probing runs, asks for bandwidth
    tests now and says how soon the duty budget allows them, and
    `request_looks(peers)` for looks."""

    def __init__(self, estimator: Estimator, metrics: Metrics, redecide: Callable[[str], None],
                 request_probes: RequestProbes | None = None, request_looks: RequestLooks | None = None) -> None:
        self.estimator = estimator
        self.metrics = metrics
        self.redecide = redecide
        self.request_probes = request_probes
        self.request_looks = request_looks
        self._readers: dict[str, SyncReader] = {}
        self._moved_unix: dict[str, float] = {}  # when each job's estimate last moved (this agent's clock)
        self._tests: dict[str, deque[tuple[float, float]]] = {}  # peer -> recent bandwidth tests
        self._started: dict[str, float] = {}  # peer -> when its bandwidth test in flight started
        self._reported_unix: dict[str, float] = {}  # job -> when its last report message came

    async def add_job(self, job: Job) -> None:
        """Follow a registered job's paths from now on. A resumed job continues from
        exactly the estimate its policy was using (`job.estimate_state`); its first
        probe is asked for once the prober knows its peers (`probe_if_wanted`)."""
        own = await asyncio.to_thread(local_addresses)  # netlink: off the event loop
        estimate = self.estimator.add_job(job.job_id, job_peers(job.spec.nodes, own), time.time())
        self._readers[job.job_id] = SyncReader(job_layout(job), job.spec.world_size, model_forms(job))
        job.estimate = estimate
        if job.estimate_state is not None and self._resume(estimate, job):
            if job.reported_network is not None:
                self.estimator.reported_alpha[job.job_id] = job.reported_network[0]
            return
        if job.reported_network is not None:
            self.estimator.observe_reported_network(job.job_id, *job.reported_network)
        estimate.ask("registered")  # the paths as they are now, before the job loads them

    @staticmethod
    def _resume(estimate: LinkEstimate, job: Job) -> bool:
        """Continue from the estimate the job's policy was using; False if it is damaged."""
        try:
            estimate.load_state_dict(job.estimate_state or {})
        except ValueError as exc:
            log.error("cannot resume the job's network estimate: starting afresh",
                      extra={"fields": {"job": job.job_id, "error": str(exc)}})
            return False
        return True

    def forget(self, job: Job) -> None:
        """Stop following a job (it ended)."""
        self.estimator.remove_job(job.job_id)
        for table in (self._readers, self._moved_unix, self._reported_unix):
            table.pop(job.job_id, None)

    def measured(self, m: Measurement) -> None:
        """One probe's measurement: into the model and the metrics; the jobs it
        concerns are re-decided."""
        if not m.ok:
            failures = self.estimator.peer(m.peer).failures + 1
            self.metrics.probe_failures.labels(m.peer, m.kind).inc()
            if failures == 1:
                log.warning("probe failed", extra={"fields": {"peer": m.peer, "kind": m.kind,
                                                              "error": m.error}})
        ts = m.ts or time.time()
        shared: set[str] = set()
        if m.kind in TEST_KINDS:
            start = min(self._started.pop(m.peer, ts - (m.duration_s or 0.0)), ts)
            self._tests.setdefault(m.peer, deque(maxlen=TESTS_KEPT)).append((start, ts))
            shared = {job_id for job_id, last in self._reported_unix.items() if last >= start - SHARED_GAP_S}
        before = self._moves(self.estimator.jobs)
        affected = self.estimator.observe(m, ts, shared)
        self._log_moves(before)
        peer = self.estimator.peer(m.peer)
        if peer.bandwidth_bps:
            self.metrics.peer_bandwidth.labels(m.peer).set(peer.bandwidth_bps)
        if peer.rtt_s:
            self.metrics.peer_rtt.labels(m.peer).set(peer.rtt_s)
        for job_id in affected:
            self.probe_if_wanted(job_id)
            self.redecide(job_id)

    def bandwidth_started(self, peer: str, start: float | None) -> None:
        """A bandwidth test of `peer` began at `start` (unix time): until its
        measurement comes, every step that ended after it is disturbed. None: the
        test announced last did not run (the peer's server was busy)."""
        if start is None:
            self._started.pop(peer, None)
        else:
            self._started[peer] = start  # one test per peer at a time: a newer start ends the last

    def _windows(self, peer: str, now: float) -> list[tuple[float, float]]:
        """`peer`'s recent bandwidth tests as (start, end), one in flight open-ended."""
        start = self._started.get(peer)
        running = [(start, math.inf)] if start is not None and now - start < IN_FLIGHT_MAX_S else []
        return [*self._tests.get(peer, ()), *running]

    def restore(self, measurements: Iterable[Measurement]) -> None:
        """What the probes knew before a restart, as of when they measured it
        (`Estimator.restore`: the peers' paths; each resumed job's estimate took
        them in before, and its saved state has them)."""
        for m in measurements:
            self.estimator.restore(m)

    def disturbed(self, job: Job, reports: Sequence[StepReport], received: float) -> list[StepReport]:
        """`reports` with the steps that overlapped a bandwidth test of the job's paths marked."""
        tests = [t for peer in self.estimator.job_peers.get(job.job_id, ()) for t in self._windows(peer, received)]
        return mark_disturbed(reports, received, tests) if tests else list(reports)

    def reported(self, job: Job, reports: Sequence[StepReport], network: tuple[float, float] | None) -> None:
        """A message's step reports (one observation per option, on the job's clock)
        and, when it sent one, the job's own estimate of its network."""
        self._reported_unix[job.job_id] = time.time()
        before = self._moves([job.job_id])
        estimate = self.estimator.jobs[job.job_id]
        self._readers[job.job_id].observe(estimate, reports, estimate.advance(reports))
        if network is not None:
            self.estimator.observe_reported_network(job.job_id, network[0], network[1])
        self.probe_if_wanted(job.job_id)
        self._log_moves(before)

    def _moves(self, job_ids: Iterable[str]) -> dict[str, int]:
        return {job_id: self.estimator.jobs[job_id].moves for job_id in job_ids}

    def _log_moves(self, before: dict[str, int]) -> None:
        for job_id, moves in before.items():
            e = self.estimator.jobs[job_id]
            if e.moves != moves:
                self._moved_unix[job_id] = time.time()
            if e.moves != moves and e.bandwidth_bps:
                log.info("network estimate moved", extra={"fields": {
                    "job": job_id, "bandwidth_bps": round(e.bandwidth_bps), "evidence": e.evidence,
                    "lower_bound": e.lower_bound}})

    def probe_if_wanted(self, job_id: str) -> None:
        """One bandwidth test when the job's estimate wants one: of the peer tested
        longest ago (one reading confirms or refutes a move; the duty budget has
        room for a few a minute, not a round of every peer at each move). Without
        a prober or peers the wish is only cleared: such an estimate was made
        knowing no probe comes (`LinkEstimateConfig.probes`) and takes a slower
        move from the syncs alone, as a lower bound; it does so too when the duty
        budget puts the test further off than its `probe_wait_s` and the syncs
        keep showing the move that long. A look when it wants one, of the peer
        looked at longest ago."""
        estimate = self.estimator.jobs.get(job_id)
        if estimate is None or estimate.bandwidth_bps is None:
            # the job's first syncs give the first figure: a test run as they start shares the
            # link with them (the digits lab's read 1-21 Mbit/s of 20 and took 0.3-0.65 s)
            return
        if estimate.wants_look:
            self._look(job_id, estimate)
        if estimate.wants_probe:
            self._probe(job_id, estimate)

    def _look(self, job_id: str, estimate: LinkEstimate) -> None:
        follows, estimate.wants_look, estimate.look_follows = estimate.look_follows, False, False
        peers = self.estimator.job_peers[job_id]
        if self.request_looks is not None and peers:
            # by the last look asked, answered or not: a peer that cannot answer one
            # (no look server there) must not take every look from the others
            self.request_looks([min(peers, key=lambda a: self.estimator.peer(a).look_tried or 0.0)], follows)

    def _probe(self, job_id: str, estimate: LinkEstimate) -> None:
        peers = self.estimator.job_peers[job_id]
        if self.request_probes is None or not peers:
            estimate.wants_probe = False  # no probe will come: the syncs stand alone
            return
        peer = min(peers, key=lambda a: self.estimator.peer(a).measured or 0.0)
        if estimate.suspects_move:
            # A peer read before it may be another network's: in the lab's lm job a
            # test of one peer read the recovered link (967 Mbit/s) and the estimate
            # took another's, read 2 s before the recovery (25 Mbit/s).
            self.estimator.moved_since(job_id, time.time())
        wait_s = self.request_probes([peer])
        if math.isinf(wait_s):
            return  # the prober does not know the peer yet: asked again when it does
        estimate.wants_probe = False
        estimate.probe_late(wait_s)
        log.info("probe asked for", extra={"fields": {"job": job_id, "peer": peer,
                                                      "reason": estimate.probe_reason,
                                                      "budget_wait_s": round(wait_s, 1)}})

    def bottleneck(self, job: Job) -> NetworkObservation | None:
        return self.estimator.bottleneck(job.job_id, job.spec.world_size, time.time())

    def peers(self) -> list[PeerPath]:
        return list(self.estimator.peers.values())

    def job_network(self, job: Job) -> JobNetwork:
        probed = self.estimator.job_peers[job.job_id]
        peers = [(self.estimator.peers.get(n) or PeerPath(n), "probe" if n in probed else "self")
                 for n in job.spec.nodes]
        return JobNetwork(peers, self.estimator.jobs[job.job_id], self.bottleneck(job), job.spec.world_size,
                          job.job_id, self._moved_unix.get(job.job_id))
