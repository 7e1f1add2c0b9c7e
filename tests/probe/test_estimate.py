"""The agent's network model: per-peer smoothing of probes, and the bottleneck a
job's policy sees: its own estimate (policy/linkestimate.py, tested there) fed
by probes of its peers made since it registered, the slowest fresh probe until
it has one, never a probe older than `max_probe_age_s`, the worst alpha."""

from __future__ import annotations

import math

import pytest

from flexcomm.policy.linkestimate import AGE_STEP_S, QUEUED_S, LinkEstimate
from flexcomm.policy.types import LinkBucket, StepReport
from flexcomm.probe.estimate import LOOK_SPAN_S, EstimateConfig, Estimator, PeerPath, _path_reading
from flexcomm.store import Measurement

NODES = 4
BUCKET = LinkBucket(1.2, 0.005)


def bandwidth(peer: str, bps: float) -> Measurement:
    return Measurement(peer=peer, kind="bandwidth", bandwidth_bps=bps, beta_s_per_byte=8 / bps)


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


def test_a_job_starts_from_fresh_probes_only_and_its_own_estimate_takes_over():
    est = Estimator(BUCKET, EstimateConfig(max_probe_age_s=60.0))
    est.observe(bandwidth("p1", 50e6), ts=900.0)  # left by a job two minutes before
    est.add_job("j", ("p1", "p2"), ts=1020.0)
    assert est.bottleneck("j", NODES, ts=1020.0) is None  # older than max_probe_age_s
    est.observe(Measurement(peer="p2", kind="latency", alpha_s=2e-3), ts=1021.0)
    est.observe(bandwidth("p2", 80e6), ts=1022.0)
    net = est.bottleneck("j", NODES, ts=1022.0)
    assert (net.alpha_s, net.bandwidth_bps, net.evidence, net.lower_bound) == (2e-3, pytest.approx(80e6), "probe",
                                                                               False)
    assert net.bucket == BUCKET
    est.observe_reported_network("j", 1e-3, 90e6)
    # the job trains 2.5 AGE_STEP_S: its estimate ages on the job's clock
    est.jobs["j"].advance([StepReport(step=0, family="dense", param=0.0, collective="dense_ring", t_comp_s=0.0,
                                      t_sync_s=0.01, t_compute_s=2.5 * AGE_STEP_S - 0.01, gain=1.0)])
    net = est.bottleneck("j", NODES, ts=1023.0)
    assert (net.alpha_s, net.bandwidth_bps, net.evidence) == (2e-3, pytest.approx(90e6), "report")
    assert net.age_s == 2 * AGE_STEP_S  # in whole steps: a fraction of a second is no news


def test_a_probe_of_a_peer_reaches_only_the_jobs_it_serves():
    est = Estimator()
    est.add_job("a", ("p1",), ts=0.0)
    est.add_job("b", ("p2",), ts=0.0)
    assert est.observe(bandwidth("p1", 100e6), ts=1.0) == ["a"]
    assert est.jobs["a"].bandwidth_bps == pytest.approx(100e6) and est.jobs["b"].bandwidth_bps is None
    est.remove_job("a")
    assert est.observe(bandwidth("p1", 100e6), ts=2.0) == [] and "a" not in est.fresh_since


def test_a_job_with_no_peers_gets_an_estimate_that_expects_no_probe():
    est = Estimator()
    assert est.add_job("a", ("p1",), ts=0.0).config.probes
    assert not est.add_job("local", (), ts=0.0).config.probes  # its syncs stand alone


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"^max_probe_age_s:"):
        EstimateConfig(max_probe_age_s=0.0)
    with pytest.raises(ValueError, match=r"^smoothing:"):
        EstimateConfig(smoothing=-1.0)


def test_after_a_suspected_move_only_peers_tested_since_stand_for_the_path():
    # A link that recovered: p1 and p2 read 20 Mbit/s before it, p2 reads 950
    # after; the slowest of all three would hold the job at the old rate.
    est = Estimator()
    est.add_job("j", ("p1", "p2"), ts=0.0)
    est.observe(bandwidth("p1", 20e6), ts=1.0)
    est.observe(bandwidth("p2", 20e6), ts=2.0)
    assert est.jobs["j"].bandwidth_bps == pytest.approx(20e6)
    est.observe(bandwidth("p2", 950e6), ts=15.0)
    assert est.jobs["j"].bandwidth_bps == pytest.approx(20e6)  # p1's reading still counts
    est.moved_since("j", 14.0)
    est.moved_since("j", 3.0)  # an older suspicion moves nothing back
    est.observe(bandwidth("p2", 950e6), ts=16.0)
    assert est.jobs["j"].bandwidth_bps == pytest.approx(950e6)


def look(peer: str, bps: float) -> Measurement:
    return Measurement(peer=peer, kind="look", bandwidth_bps=bps, beta_s_per_byte=8 / bps, bytes_sent=256 << 10)


def slow_look_read(job: LinkEstimate) -> float:
    """What a look at 20 Mbit/s reads for `job`: a 256 KB train outlasts the
    bucket's credit, and through it reads 1.1x the rate."""
    return 8 / job.looked_beta(8 / (1.167 * 20e6), 256 << 10)


@pytest.mark.parametrize(("sync_wire_s", "read_bps"), [(1.3, 30e6), (0.067, 30e6 / 1.2), (None, 30e6 / 1.2)])
def test_a_look_that_waited_behind_syncs_longer_than_the_credit_is_read_at_the_rate(sync_wire_s, read_bps):
    # The lab's bucket: 1.2x for 5 ms of the rate, spent by 25 ms of backlog at
    # the peak. A train sent into a dense ring's 1.3 s syncs at 30 Mbit/s waited
    # behind one and crossed at the rate; behind PowerSGD's 67 ms syncs, one in
    # three such trains came inside the credit.
    est = Estimator(BUCKET)
    job = est.add_job("j", ("p1",), ts=0.0)
    job.sync_wire_s = sync_wire_s
    train = dict(kind="look", bandwidth_bps=30e6, beta_s_per_byte=8 / 30e6, bytes_sent=16800)
    path = est.peer("p1")
    est.observe(Measurement(peer="p1", rtt_min_s=0.0006, **train), ts=1.0)
    assert path.looks[-1].queued_s == 0.0
    assert 8 / _path_reading(job, path, since=1.0) == pytest.approx(30e6 / 1.2)  # idle: inside the credit
    est.observe(Measurement(peer="p1", rtt_min_s=0.0006 + 2 * QUEUED_S, **train), ts=2.0)
    assert path.looks[-1].queued_s == pytest.approx(2 * QUEUED_S)
    assert 8 / _path_reading(job, path, since=2.0) == pytest.approx(read_bps)


def test_a_bucket_is_spent_by_a_backlog_at_its_peak_in_its_credit_over_the_peaks_excess():
    assert BUCKET.peak_s == pytest.approx(0.005 / 0.2)
    assert LinkBucket().peak_s == math.inf


def three_paths(bps: float) -> tuple[Estimator, LinkEstimate]:
    """A job over three peers, each tested at `bps` at 1.0."""
    est = Estimator(BUCKET)
    est.add_job("j", ("p1", "p2", "p3"), ts=0.0)
    for peer in ("p1", "p2", "p3"):
        est.observe(bandwidth(peer, bps), ts=1.0)
    return est, est.jobs["j"]


def test_looks_move_a_job_only_once_every_peer_has_a_recent_one_and_then_to_the_slowest():
    # Through the lab's bucket a 256 KB train at the 1.2x peak (1.167 of UDP
    # payload) reads 0.97x the rate.
    est = Estimator(BUCKET)
    est.add_job("j", ("p1", "p2"), ts=0.0)
    est.observe(bandwidth("p1", 20e6), ts=1.0)
    est.observe(bandwidth("p2", 20e6), ts=1.0)
    est.observe(look("p1", 1.167 * 900e6), ts=2.0)  # p2 may still be at 20
    job = est.jobs["j"]
    assert job.bandwidth_bps == pytest.approx(20e6) and job.wants_look and not job.wants_probe
    est.observe(look("p2", 1.167 * 400e6), ts=2.0 + LOOK_SPAN_S + 0.1)  # p1's look is too old to stand
    assert job.bandwidth_bps == pytest.approx(20e6)
    est.observe(look("p1", 1.167 * 900e6), ts=LOOK_SPAN_S + 3.0)
    assert job.bandwidth_bps == pytest.approx(0.972 * 400e6, rel=0.01) and job.evidence == "look"
    assert est.peer("p1").bandwidth_bps == pytest.approx(20e6)  # a look is the job's, not the probed rate


def test_a_look_that_answers_a_question_reads_the_peers_looked_at_since_it_was_asked():
    # The default lab's 2-4 s of 1 Gbit/s after 20 Mbit/s: a look of the slow phase
    # at another path held the recovery back until the job ended.
    est, job = three_paths(20e6)
    est.observe(look("p3", 1.167 * 20e6), ts=2.0)
    job.find_out("syncs quickened", job.trained_s)  # as the syncs ask
    est.observe(look("p1", 1.167 * 900e6), ts=3.0)
    assert job.bandwidth_bps == pytest.approx(0.972 * 900e6, rel=0.01) and job.evidence == "look"
    # p3 is still slow: its looks, read twice, are the figure again
    est.observe(look("p3", 1.167 * 20e6), ts=4.0)
    assert job.bandwidth_bps == pytest.approx(0.972 * 900e6, rel=0.01) and job.look_pending
    est.observe(look("p3", 1.167 * 20e6), ts=5.0)
    assert job.bandwidth_bps == pytest.approx(slow_look_read(job))


def test_looks_taken_before_the_figure_moved_do_not_read_the_path_after_it():
    # The default lab's Top-k job, 1 Gbit/s after 20: p2's and p3's looks of the
    # slow phase, inside LOOK_SPAN_S of the move, made p2's agreeing look a
    # slower one and p3's underread (a host stall) the second in a row.
    est, job = three_paths(20e6)
    est.observe(look("p2", 1.167 * 20e6), ts=2.0)
    est.observe(look("p3", 1.167 * 20e6), ts=3.0)
    job.find_out("syncs quickened", job.trained_s)
    est.observe(look("p1", 1.167 * 900e6), ts=4.0)
    moved = job.bandwidth_bps
    assert moved == pytest.approx(0.972 * 900e6, rel=0.01) and job.paths_fresh_since == 4.0
    est.observe(look("p2", 1.167 * 900e6), ts=6.0)  # agrees: p3's look of the slow phase is not the path's now
    assert job.look_pending is None
    est.observe(look("p3", 1.167 * 250e6), ts=6.5)
    assert job.bandwidth_bps == pytest.approx(moved, rel=0.05) and job.look_pending  # one slower look: read again
    est.observe(look("p3", 1.167 * 250e6), ts=7.0)  # the path did fall: twice in a row
    assert job.bandwidth_bps < 300e6


def test_after_a_move_each_path_not_looked_at_since_is_looked_at_and_then_no_more():
    # A look set the figure from one path: the others' readings are the old
    # network's, and until each is looked at again no look refines the figure.
    est, job = three_paths(20e6)
    job.find_out("syncs quickened", job.trained_s)
    job.wants_look = False  # the owner asked
    est.observe(look("p1", 1.167 * 900e6), ts=2.0)
    assert job.evidence == "look" and job.wants_look  # p2 and p3: not looked at since
    job.wants_look = False
    est.observe(Measurement(peer="p2", kind="look", ok=False, error="no answer"), ts=2.5)
    assert not job.wants_look  # a failed look reaches no job
    est.observe(look("p3", 1.167 * 900e6), ts=3.0)
    assert not job.wants_look  # p2 was tried since the move, p3 read: none left untried
    est.observe(look("p1", 1.167 * 900e6), ts=3.5)
    assert not job.wants_look


def test_a_look_that_reads_its_path_quickened_has_the_other_paths_looked_at_now():
    # The default lab's MOO, 1 Gbit/s after 20: p3's look at 1 Gbit/s agreed with
    # the figure through p1's and p2's looks of the slow phase, and the looks that
    # came as the syncs grew blind moved the figure 5 s into the 5 s phase.
    est, job = three_paths(20e6)
    for ts, peer in ((2.0, "p1"), (3.0, "p2"), (4.0, "p3")):
        est.observe(look(peer, 1.167 * 20e6), ts=ts)
    job.wants_look = False
    est.observe(look("p3", 1.167 * 950e6), ts=6.0)
    assert job.bandwidth_bps == pytest.approx(slow_look_read(job)) and job.wants_look  # the others: looked at now
    job.wants_look = False
    est.observe(look("p1", 1.167 * 950e6), ts=6.5)
    assert job.bandwidth_bps == pytest.approx(slow_look_read(job)) and job.wants_look  # p1's own look: quickened too
    est.observe(look("p2", 1.167 * 900e6), ts=7.0)  # each path's reading: its fastest recent look
    assert job.bandwidth_bps == pytest.approx(0.972 * 900e6, rel=0.01) and job.evidence == "look"


def test_a_slowest_path_that_rests_on_one_look_is_looked_at_again_when_another_reads_a_move_faster():
    # The default lab's Top-k job: a stalled look (338 of 1,000 Mbit/s) set the
    # figure and stood as its path's reading while the others read 965 and 1,289.
    est, job = three_paths(20e6)
    job.find_out("syncs quickened", job.trained_s)
    est.observe(look("p3", 1.167 * 300e6), ts=2.0)
    assert job.bandwidth_bps == pytest.approx(0.972 * 300e6, rel=0.01)
    est.observe(look("p1", 1.167 * 950e6), ts=2.5)
    est.observe(look("p2", 1.167 * 950e6), ts=3.0)
    job.wants_look = False
    est.observe(look("p1", 1.167 * 950e6), ts=3.5)
    assert job.wants_look  # p3's one look: read again
    job.wants_look = False
    est.observe(look("p3", 1.167 * 940e6), ts=4.0)  # its reading: the faster of its two
    assert job.bandwidth_bps > 900e6 and job.wants_look  # a move: p1 and p2 not looked at since
    for ts, peer in ((4.5, "p1"), (5.0, "p2")):
        job.wants_look = False
        est.observe(look(peer, 1.167 * 950e6), ts=ts)
    assert not job.wants_look  # every path read since the move, none on one stalled look: the asks stop


def test_a_paths_reading_is_the_fastest_of_its_recent_looks_so_stalled_looks_between_agreeing_ones_set_nothing():
    # Three paths at 1 Gbit/s, looks a host stall read at 0.3x now and then: p3's,
    # kept as the slowest path's latest, made p1's agreeing look a slower one, and
    # with p2's stalled look the figure fell.
    est, job = three_paths(950e6)
    for ts, peer in ((2.0, "p1"), (2.5, "p2"), (3.0, "p3")):
        est.observe(look(peer, 1.167 * 950e6), ts=ts)
    figure = job.bandwidth_bps
    est.observe(look("p3", 1.167 * 300e6), ts=3.5)
    assert job.look_pending
    est.observe(look("p1", 1.167 * 950e6), ts=4.0)
    assert job.look_pending is None  # p3's reading is still its faster look
    est.observe(look("p2", 1.167 * 300e6), ts=4.5)
    assert job.bandwidth_bps == pytest.approx(figure, rel=0.05) and job.look_pending
    est.observe(look("p2", 1.167 * 300e6), ts=5.0)  # twice in a row: the path did fall
    assert job.bandwidth_bps < 400e6


def test_a_look_faster_on_one_path_stands_aside_when_the_slowest_path_looked_as_the_figure():
    est = Estimator(BUCKET)
    est.add_job("j", ("p1", "p2"), ts=0.0)
    # Paths of different rates: the slow one is the bottleneck, and the fast one's
    # looks leave it the figure; seen once, it is looked at again, once.
    est.observe(bandwidth("p1", 20e6), ts=1.0)
    est.observe(look("p2", 1.167 * 20e6), ts=1.2)  # the bottleneck path, as the figure says
    job = est.jobs["j"]
    job.wants_look = job.wants_probe = False
    est.observe(look("p1", 1.167 * 900e6), ts=2.0)
    # the slowest path's look (a 256 KB train at 20 Mbit/s outlasts the credit: 1.1x) moves it a little
    assert job.bandwidth_bps == pytest.approx(slow_look_read(job)) and not job.wants_probe
    assert job.suspect_beta is None and job.looked is not None and job.wants_look  # p2 rests on one look
    job.wants_look = False
    est.observe(look("p2", 1.167 * 20e6), ts=2.5)
    est.observe(look("p1", 1.167 * 900e6), ts=3.0)
    assert job.bandwidth_bps == pytest.approx(slow_look_read(job)) and not job.wants_look and not job.wants_probe


def test_a_restart_reads_measurements_back_into_the_paths_alone():
    # A resumed job's estimate took them in before its state was saved: read
    # again, a probe or a look would count twice, and a restarted agent decide
    # otherwise than a never-killed one.
    est, job = three_paths(20e6)
    before = job.state_dict()
    for ts in (2.0, 3.0):
        est.restore(Measurement(peer="p1", kind="look", bandwidth_bps=1.167 * 900e6,
                                beta_s_per_byte=8 / (1.167 * 900e6), bytes_sent=256 << 10, ts=ts))
    est.restore(Measurement(peer="p2", kind="bandwidth", bandwidth_bps=900e6, beta_s_per_byte=8 / 900e6, ts=3.0))
    assert job.state_dict() == before
    assert len(est.peer("p1").looks) == 2 and est.peer("p2").bandwidth_bps == pytest.approx(900e6)


def test_a_peer_that_cannot_answer_a_look_does_not_take_every_look():
    est = Estimator()
    est.add_job("j", ("p1", "p2"), ts=0.0)
    est.observe(Measurement(peer="p1", kind="look", ok=False, error="no answer to the look within 1 s"), ts=5.0)
    assert est.peer("p1").look_tried == 5.0 and est.peer("p1").looked is None
