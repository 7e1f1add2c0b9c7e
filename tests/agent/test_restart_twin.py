"""A restarted agent decides as a never-killed one: two agents (each its own store)
are fed the same step reports, one is killed (SIGKILL) partway and started again
on its store, and every decision after the restart equals its twin's. The job's
network comes only from its syncs (no probes, no reported network), so what the
restart must restore is the estimate the policy was using; the link drops from
1 Gbit/s to 50 Mbit/s partway, so there is a move to follow.

Each message goes to both agents at once: the estimator keeps the bounds of the
last second by its own clock, and sent one after the other the two agents took a
message tens of milliseconds apart on a loaded host (the twin's commit between),
enough for a bound to fall out of one window and not the other."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flexcomm.policy.types import Compression
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto.convert import collective_from_enum
from support.agent_process import AgentProcess, spec

GRAD_BYTES = 8_000_000
MESSAGES = 60
REPORTS_PER_MESSAGE = 4
SLOWS_AT = 30  # the message from which the link is 50 Mbit/s
OVERHEAD_S = {"dense_ring": 0.003, "dense_tree": 0.004, "ag_topk": 0.002, "art_ring": 0.005, "art_tree": 0.005}


def sync_seconds(d: pb.Decision, bandwidth_bps: float, jitter: float) -> float:
    """A 2-rank sync of the decided option: its bytes on the link plus gloo's overhead."""
    c = Compression(d.family, d.param)
    collective = collective_from_enum(d.collective)
    m = GRAD_BYTES / 2 if c.family == "bf16" else GRAD_BYTES
    k = c.param * m if c.family == "topk" else 0.0
    wire = {"dense_ring": m, "dense_tree": 2 * m, "ag_topk": 2 * k, "art_ring": 2 * k,
            "art_tree": 3 * k}.get(collective, m)
    return (OVERHEAD_S.get(collective, 0.003) + wire * 8 / bandwidth_bps) * jitter


def message(d: pb.Decision, first_step: int, bandwidth_bps: float, rng: random.Random) -> pb.ReportStepsRequest:
    c = Compression(d.family, d.param)
    gains = {name: min(1.0, Compression.parse(name).cr ** 0.15) for name in d.probes}
    reports = [pb.StepReport(step=first_step + i, family=d.family, param=d.param, collective=d.collective,
                             t_comp_s=0.0 if c.family == "dense" else 0.004, t_compute_s=0.1,
                             t_sync_s=sync_seconds(d, bandwidth_bps, rng.uniform(0.95, 1.08)),
                             gain=gains.get(c.name, 1.0), bytes_sent=int(GRAD_BYTES * c.cr),
                             gains=[pb.Gain(compression=n, gain=g) for n, g in gains.items()])
               for i in range(REPORTS_PER_MESSAGE)]
    return pb.ReportStepsRequest(job_id="twin", reports=reports)


def choice(d: pb.Decision) -> tuple:
    return (d.family, round(d.param, 9), d.collective, d.root, d.version, d.exploring)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[tuple[AgentProcess, AgentProcess]]:
    (tmp_path / "twin").mkdir()
    (tmp_path / "killed").mkdir()
    twin, killed = AgentProcess(tmp_path / "twin"), AgentProcess(tmp_path / "killed")
    try:
        yield twin.start(), killed.start()
    finally:
        twin.stop()
        killed.stop()


@pytest.mark.parametrize("trial", range(5))
def test_a_restarted_agent_decides_as_its_never_killed_twin(agents, trial: int) -> None:
    twin, killed = agents
    rng = random.Random(trial)
    kill_at = rng.randrange(8, MESSAGES - 8)
    for agent in agents:
        agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("twin", grad_bytes=GRAD_BYTES)), timeout=5)
    decision = twin.stub.GetDecision(pb.JobRef(job_id="twin"), timeout=5)
    differ = []
    with ThreadPoolExecutor(2) as pool:
        for n in range(MESSAGES):
            if n == kill_at:
                killed.kill9()
                killed.start()
                resumed = killed.stub.GetDecision(pb.JobRef(job_id="twin"), timeout=5)
                assert choice(resumed) == choice(decision), "the restart changed the decision by itself"
            request = message(decision, n * REPORTS_PER_MESSAGE, 1e9 if n < SLOWS_AT else 50e6, rng)
            sent = [pool.submit(a.stub.ReportSteps, iter([request]), timeout=10) for a in agents]
            decision, other = (future.result().decision for future in sent)
            if choice(other) != choice(decision):
                differ.append((n, choice(decision), choice(other), other.reason))
    assert not differ, f"killed at message {kill_at}; decisions differ: {differ[:3]}"
    nets = [a.stub.GetNetwork(pb.GetNetworkRequest(job_id="twin"), timeout=5).bottleneck for a in agents]
    assert nets[0].bandwidth_bps == pytest.approx(nets[1].bandwidth_bps, rel=1e-9)
    assert nets[0].bandwidth_bps == pytest.approx(50e6, rel=0.15)  # and it followed the slower link
