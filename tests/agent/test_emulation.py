"""Epoch-keyed emulation driven by a job's reports, for real: the agent shapes a
veth in a namespace (HTB, rate only: this kernel has no sch_netem) as the job's
reported epoch advances, records each step in its store, re-applies the step in
force after a kill -9 (restoring first what the dead agent left), and gives the
interface back exactly as it found it on SIGTERM."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flexcomm.emulation.revert import kernel_view
from flexcomm.emulation.shaping import Shaper
from flexcomm.lab.netns import netns_pair
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Store
from support.agent_process import AgentProcess, spec

SCHEDULE = """
name = "agent test"
[[step]]
epoch = 0
rate = "400Mbit"
[[step]]
epoch = 1
rate = "100Mbit"
[[step]]
epoch = 2
rate = "20Mbit"
"""


def shaped_rates(shaper: Shaper) -> list[float]:
    summary = shaper.show()["shaping"] or {}
    return sorted(v["rate_bps"] for v in summary.values())


def report_epoch(agent: AgentProcess, epoch: int) -> None:
    step = pb.StepReport(step=epoch * 10, epoch=epoch, family="dense", collective=pb.COLLECTIVE_DENSE_RING,
                         t_sync_s=0.1, gain=1.0)
    agent.stub.ReportSteps(iter([pb.ReportStepsRequest(job_id="emu", reports=[step])]), timeout=5)


def wait_rates(shaper: Shaper, expected: list[float], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while shaped_rates(shaper) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shaped_rates(shaper) == expected


@pytest.mark.privileged
def test_reported_epochs_drive_the_shaping(tmp_path: Path, privileged: None) -> None:
    schedule = tmp_path / "epochs.toml"
    schedule.write_text(SCHEDULE)
    with netns_pair("fca", "10.204.0.0/24") as (a, _b):
        shaper = Shaper(a.ifname, netns=a.ns)
        original = kernel_view(shaper.show())
        agent = AgentProcess(tmp_path, "--emulation-schedule", str(schedule), "--emulation-interface",
                             a.ifname, "--emulation-netns", a.ns,
                             env={"FLEXCOMM_STATE_DIR": str(tmp_path / "emulation")})
        try:
            agent.start()
            agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("emu", policy="dense")), timeout=5)
            wait_rates(shaper, [400e6])  # epoch 0's step from the start
            report_epoch(agent, 0)
            report_epoch(agent, 1)
            wait_rates(shaper, [100e6])
            report_epoch(agent, 2)
            wait_rates(shaper, [20e6])
            time.sleep(0.5)  # the job's epoch reaches the store
            agent.kill9()
            assert shaped_rates(shaper) == [20e6], "kill -9 leaves the link shaped..."
            agent.start()  # ...and the next agent restores it, then re-applies epoch 2's step
            wait_rates(shaper, [20e6])
            assert agent.terminate() == 0
            assert kernel_view(shaper.show()) == original, "SIGTERM gives the interface back"
        finally:
            agent.stop()
    with Store(agent.db) as store:
        steps = [s.step_index for s in reversed(store.emulation_steps(a.ifname))]
    assert steps[:3] == [0, 1, 2] and steps[-1] == 2
