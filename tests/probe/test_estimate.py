"""The network model: a report's alpha/beta sample, the passive fit, the token
bucket's inverse, per-peer smoothing, and a job's estimate following a moved link
while it stays still for a noisy host (each move saying what evidence made it).

The job's sync times here come from the cost model itself (times a bias, as gloo
adds, and times a noise factor where said), so every figure has a known truth."""

from __future__ import annotations

import pytest

from flexcomm.policy.costmodel import sync_time
from flexcomm.policy.types import GradientLayout, LinkBucket, NetworkObservation, StepReport
from flexcomm.probe.estimate import (
    EstimateConfig,
    Estimator,
    JobEstimate,
    PeerPath,
    SyncObservation,
    fit_alpha_beta,
    passive_beta,
    relative_change,
    sync_observation,
)
from flexcomm.store import Measurement

ALPHA = 5e-4
BETA = 8 / 100e6  # 100 Mbit/s
GRAD = 1_400_000
LAYOUT = GradientLayout.flat(GRAD)
NODES = 4
BUCKET = LinkBucket(1.2, 0.005)
DENSE, SPARSE = ("dense_ring", 1.0), ("art_ring", 0.011)


def report(option: tuple[str, float], t_sync_s: float, step: int = 0) -> StepReport:
    """A step of (collective, cr): dense for cr 1, else Top-k."""
    collective, cr = option
    family, param = ("dense", 0.0) if cr == 1.0 else ("topk", cr)
    return StepReport(step=step, family=family, param=param, collective=collective, t_comp_s=0.0,
                      t_sync_s=t_sync_s, gain=1.0 if cr == 1.0 else 0.5)


def sync_s(option: tuple[str, float], bandwidth_bps: float, overhead_s: float = 3e-4,
           bias: float = 1.1) -> float:
    """What a sync of `option` takes on a link of `bandwidth_bps`: the model with
    gloo's per-message overhead as alpha, times a bias."""
    net = NetworkObservation.from_link(overhead_s, bandwidth_bps, NODES, BUCKET)
    return bias * sync_time(option[0], GRAD, option[1], net)


class Job:
    """An Estimator following one job whose peers are `peers`, on a clock that
    advances by each step's time."""

    def __init__(self, peers: tuple[str, ...] = ("p1", "p2"), **config: float) -> None:
        self.est = Estimator(BUCKET, EstimateConfig(**config))
        self.now = 1000.0
        self.est.add_job("j", peers, self.now)

    @property
    def estimate(self) -> JobEstimate:
        return self.est.jobs["j"]

    def steps(self, option: tuple[str, float], bandwidth_bps: float, n: int, noise: float = 1.0,
              step_s: float = 0.2, extra_s: float = 0.0) -> None:
        """`extra_s`: time per sync the model does not count (gloo's own work)."""
        for _ in range(n):
            self.now += step_s
            t = sync_s(option, bandwidth_bps) * noise + extra_s
            self.est.observe_report("j", report(option, t), LAYOUT, NODES, self.now)

    def probe(self, peer: str, bandwidth_bps: float) -> None:
        self.now += 0.3
        self.est.observe(Measurement(peer=peer, kind="bandwidth", bandwidth_bps=bandwidth_bps,
                                     beta_s_per_byte=8 / bandwidth_bps), self.now)

    def probe_all(self, bandwidth_bps: float) -> None:
        for peer in self.est.job_peers["j"]:
            self.probe(peer, bandwidth_bps)

    @property
    def mbps(self) -> float:
        net = self.est.bottleneck("j", NODES)
        assert net is not None
        return net.bandwidth_bps / 1e6


def test_sync_observation_coefficients_are_the_paper_forms():
    # N = 4, M = 16 MB, log2 N = 2, by hand from the paper's forms
    expected = {("dense_ring", 1.0): (2 * 3, 2 * 3 / 4 * 16e6),  # 2(N-1) a + 2(N-1)/N M b
                ("ag_topk", 0.01): (2, 2 * 3 * 16e6 * 0.01),  # a logN + 2(N-1) M c b
                ("art_tree", 0.1): (3 * 2, 3 * 16e6 * 0.1 * 2)}  # 3 a logN + 3 M c b logN
    for option, (alpha_coeff, beta_bytes) in expected.items():
        obs = sync_observation(report(option, 0.25), GradientLayout.flat(16_000_000), 4)
        assert (obs.alpha_coeff, obs.beta_bytes, obs.seconds) == pytest.approx((alpha_coeff, beta_bytes, 0.25))
    assert sync_observation(report(DENSE, 0.0), LAYOUT, NODES) is None  # nothing measured


def test_passive_fit_recovers_alpha_and_beta_from_two_sizes():
    net = NetworkObservation(ALPHA, BETA, NODES)
    observations = [sync_observation(report(DENSE, sync_time("dense_ring", m, 1.0, net)), GradientLayout.flat(m),
                                     NODES) for m in (1e4, 1e5, 1e6, 1e7)]
    alpha, beta = fit_alpha_beta(observations)
    assert alpha == pytest.approx(ALPHA, rel=1e-6) and beta == pytest.approx(BETA, rel=1e-6)
    assert fit_alpha_beta([observations[0]] * 3) is None  # one size cannot tell alpha from beta


def test_passive_beta_inverts_the_token_bucket():
    for m in (2e4, 2e5, 2e6, 2e7):  # inside the bucket's credit, across it, far beyond it
        net = NetworkObservation(ALPHA, BETA, NODES, BUCKET)
        t = sync_time("dense_ring", m, 1.0, net)
        obs = sync_observation(report(DENSE, t), GradientLayout.flat(m), NODES)
        assert passive_beta(obs, ALPHA, BUCKET) == pytest.approx(BETA, rel=1e-9)
    assert passive_beta(SyncObservation(10.0, 1e6, 1e-3), ALPHA) == 0.0  # all latency


def test_peer_path_smooths_within_noise_takes_a_move_whole_and_the_least_latency():
    path, config = PeerPath("p"), EstimateConfig(smoothing=0.5)
    bw = lambda b: Measurement(peer="p", kind="bandwidth", bandwidth_bps=b, beta_s_per_byte=8 / b)  # noqa: E731
    path.observe(bw(100e6), 1.0, config)
    path.observe(bw(95e6), 2.0, config)
    assert path.bandwidth_bps == pytest.approx(1 / (0.5 / 100e6 + 0.5 / 95e6))  # within 10%: smoothed
    path.observe(bw(20e6), 3.0, config)
    assert path.bandwidth_bps == pytest.approx(20e6) and path.measured == 3.0  # moved: taken whole
    latency = lambda a: Measurement(peer="p", kind="latency", rtt_p50_s=1e-3, rtt_p99_s=2e-3, alpha_s=a)  # noqa: E731
    for alpha in (4e-4, 8e-3, 5e-4):  # one burst on a loaded host read 20x the path
        path.observe(latency(alpha), 4.0, config)
    path.observe(Measurement(peer="p", kind="bandwidth", ok=False, error="timed out"), 5.0, config)
    assert (path.alpha_s, path.rtt_s, path.failures, path.measured) == (4e-4, 1e-3, 1, 3.0)
    for _ in range(5):
        path.observe(latency(2e-3), 6.0, config)
    assert path.alpha_s == 2e-3  # a path whose every burst reads more did move


def test_syncs_alone_give_an_estimate_and_follow_a_moved_link():
    job = Job(peers=())
    job.steps(DENSE, 100e6, 3)
    first = job.mbps
    assert 70 < first < 100 and job.estimate.evidence == "passive"  # gloo's overhead reads as slower
    job.steps(DENSE, 100e6, 10, noise=1.3)  # within the passive threshold: no move
    job.steps(DENSE, 100e6, 20)
    assert job.mbps == first
    job.steps(DENSE, 20e6, 2)
    assert job.mbps == first and not job.estimate.wants_probe  # two slow steps are not yet a move
    job.steps(DENSE, 20e6, 1)
    assert job.estimate.wants_probe and job.mbps == first  # three: probes asked for, and waited for
    job.estimate.wants_probe = False
    job.steps(DENSE, 20e6, 4, step_s=1.0)  # no probe came within confirm_s: the syncs alone
    assert job.estimate.evidence == "passive"
    assert relative_change(first / 5, job.mbps) < 0.1  # the link's 5x, not gloo's bias


def test_probes_anchor_the_estimate_and_a_noisy_host_moves_nothing():
    job = Job()
    job.probe_all(100e6)
    job.steps(DENSE, 100e6, 10)
    assert job.mbps == pytest.approx(100) and job.estimate.evidence == "probe"
    moved_at = job.estimate.moved_at
    job.steps(DENSE, 100e6, 3, noise=2.5)  # a loaded host: syncs 2.5x slower
    assert job.estimate.wants_probe
    job.probe_all(100e6)  # the probes read the same link
    job.steps(DENSE, 100e6, 30, noise=2.5, step_s=1.0)  # the load stays: the syncs' new normal
    assert job.mbps == pytest.approx(100) and job.estimate.moved_at == moved_at


def test_a_passive_move_confirmed_by_fresh_probes_is_taken_at_once():
    job = Job()
    job.probe_all(100e6)
    job.steps(DENSE, 100e6, 10)
    job.steps(DENSE, 500e6, 3)
    assert job.estimate.wants_probe and job.mbps == pytest.approx(100)
    job.probe("p1", 480e6)  # p2's reading predates the move: not the bottleneck now
    assert job.mbps == pytest.approx(480) and job.estimate.evidence == "passive+probe"
    job.probe("p2", 470e6)
    assert job.mbps == pytest.approx(1 / (0.7 / 480 + 0.3 / 470))  # a fresh peer within noise


def test_probes_sharing_the_path_with_the_job_neither_pull_it_down_nor_miss_a_move():
    job = Job()
    job.probe_all(100e6)
    job.steps(DENSE, 100e6, 10)
    job.probe_all(50e6)  # the job's own dense traffic takes half of what iperf3 could get
    assert job.mbps == pytest.approx(100) and not job.estimate.wants_probe
    job.steps(DENSE, 20e6, 3)  # the link drops to 20 Mbit/s
    assert job.estimate.wants_probe
    job.probe_all(9e6)  # still contended, but 5x below what probes read before
    assert job.estimate.evidence == "passive+probe"
    assert 18 < job.mbps < 20  # what the bandwidth-bound syncs carried, not the contended probe


def test_a_probe_that_reads_more_raises_the_estimate_at_once():
    job = Job()
    job.steps(DENSE, 100e6, 3)
    assert job.mbps < 95 and job.estimate.evidence == "passive"  # gloo's overhead and bias
    job.probe("p1", 105e6)  # more than 10% above: the path carried it
    assert job.mbps == pytest.approx(105) and job.estimate.evidence == "probe"


def test_a_probe_alone_must_read_a_move_twice():
    job = Job(peers=("p1",))
    job.probe("p1", 100e6)
    job.probe("p1", 60e6)  # e.g. a test that shared the link with the job's own traffic
    assert job.mbps == pytest.approx(100) and job.estimate.wants_probe
    job.probe("p1", 100e6)
    assert job.mbps == pytest.approx(100)
    job.probe("p1", 50e6)
    job.probe("p1", 52e6)
    assert job.mbps == pytest.approx(1 / (0.7 / 50 + 0.3 / 52)) and job.estimate.evidence == "probe"


def test_latency_bound_syncs_ask_for_a_probe_but_never_move_the_figure_alone():
    job = Job()
    job.probe_all(20e6)
    job.steps(DENSE, 20e6, 3)
    job.steps(SPARSE, 20e6, 10)
    job.steps(SPARSE, 1e9, 3)  # the link recovers: the Top-k syncs get faster, mostly latency now
    assert job.estimate.wants_probe
    job.steps(SPARSE, 1e9, 20, step_s=1.0)  # no probe came
    assert job.mbps == pytest.approx(20), "a latency-bound sync moves with the host as much as the path"
    job.probe_all(950e6)
    assert job.mbps == pytest.approx(950) and job.estimate.evidence == "passive+probe"


def test_top_k_syncs_never_move_the_figure_alone_even_bandwidth_bound():
    job = Job()
    job.probe_all(100e6)
    job.steps(SPARSE, 100e6, 5, extra_s=0.002)  # Top-k syncs do work the model does not count
    job.steps(SPARSE, 20e6, 3, extra_s=0.002)
    assert job.estimate.wants_probe and job.estimate.pending_bandwidth_bps < 60e6  # sizes the probe
    job.estimate.probe_wait_s = 90.0  # and none can come soon
    job.steps(SPARSE, 20e6, 10, step_s=1.0, extra_s=0.002)
    assert job.mbps == pytest.approx(100) and job.estimate.evidence == "probe"
    job.probe("p1", 19e6)
    assert job.mbps == pytest.approx(19) and job.estimate.evidence == "passive+probe"


def test_a_move_stands_on_the_syncs_at_once_when_no_probe_can_come_soon():
    job = Job()
    job.probe_all(100e6)
    job.steps(DENSE, 100e6, 5)
    job.estimate.probe_wait_s = 90.0  # the duty budget is spent for the next minute and a half
    job.steps(DENSE, 20e6, 3, step_s=0.1)
    assert job.estimate.evidence == "passive" and 18 < job.mbps < 20


def test_dense_syncs_give_the_figure_top_k_syncs_cannot_but_never_lower_a_probed_one():
    job = Job(peers=())
    job.steps(SPARSE, 20e6, 3, extra_s=0.01)  # Top-k syncs do work the model does not count
    assert job.est.bottleneck("j", NODES) is None
    job.steps(DENSE, 20e6, 3)  # e.g. the policy's warm-up or exploration runs dense
    assert 18 < job.mbps < 20  # 20 Mbit/s, less gloo's bias
    fast = Job()
    fast.probe_all(1e9)
    fast.steps(DENSE, 1e9, 3, noise=2.0)  # a gigabit the host's CPU cannot fill
    assert fast.mbps == pytest.approx(1000) and fast.estimate.evidence == "probe"


def test_bottleneck_takes_the_worst_alpha_and_old_probes_until_the_job_has_its_own():
    job = Job()
    assert job.est.bottleneck("j", NODES) is None
    job.est.observe(Measurement(peer="p1", kind="bandwidth", bandwidth_bps=50e6, beta_s_per_byte=8 / 50e6),
                    ts=10.0)  # before the job registered
    job.est.observe(Measurement(peer="p2", kind="latency", alpha_s=2e-3), ts=job.now)
    net = job.est.bottleneck("j", NODES)
    assert (net.alpha_s, net.bandwidth_bps, net.evidence) == (2e-3, pytest.approx(50e6), "probe")
    job.est.observe_reported_network("j", 1e-3, 80e6, job.now)
    net = job.est.bottleneck("j", NODES)
    assert (net.alpha_s, net.bandwidth_bps, net.evidence) == (2e-3, pytest.approx(80e6), "report")


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"^passive_threshold:"):
        EstimateConfig(passive_threshold=0.0)
    with pytest.raises(ValueError, match=r"^persist_steps:"):
        EstimateConfig(persist_steps=0)
    with pytest.raises(ValueError, match=r"^informative_share:"):
        EstimateConfig(informative_share=-1.0)
    with pytest.raises(ValueError, match=r"^seconds:"):
        SyncObservation(1.0, 1.0, -1.0)
    with pytest.raises(ValueError, match=r"^beta_bytes:"):
        SyncObservation(1.0, 0.0, 1.0)
