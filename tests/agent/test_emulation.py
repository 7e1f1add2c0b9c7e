"""Epoch-keyed emulation driven by a job's reports, for real: the agent shapes a
veth in a namespace (HTB, rate only: this kernel has no sch_netem) as the job's
reported epoch advances, records each step in its store, re-applies the step in
force after a kill -9 (restoring first what the dead agent left), and gives the
interface back exactly as it found it on SIGTERM."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexcomm.emulation.revert import Revert, kernel_view
from flexcomm.emulation.shaping import Shaper
from flexcomm.lab.netns import netns_pair
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Store
from support.agent_process import AgentProcess, spec, wait_for
from support.names import run_prefix

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
    wait_for(lambda: shaped_rates(shaper) == expected, timeout_s, f"the link shaped to {expected}")


def stored(agent: AgentProcess, ifname: str) -> tuple[list[int], int]:
    """The emulation steps the agent's store recorded for `ifname` (oldest first)
    and the job's epoch as stored."""
    with Store(agent.db) as store:
        steps = [s.step_index for s in reversed(store.emulation_steps(ifname))]
        state = store.load_policy_state("emu")
    return steps, state["last_epoch"] if state else -1


def owner_pid(revert: Revert) -> int | None:
    record = revert.read()
    return record["pid"] if record else None


@pytest.mark.privileged
def test_reported_epochs_drive_the_shaping(tmp_path: Path, privileged: None) -> None:
    schedule = tmp_path / "epochs.toml"
    schedule.write_text(SCHEDULE)
    state_dir = tmp_path / "emulation"
    with netns_pair(run_prefix("fca"), "10.204.0.0/24") as (a, _b):
        shaper = Shaper(a.ifname, netns=a.ns)
        revert = Revert(shaper, state_dir)
        original = kernel_view(shaper.show())
        agent = AgentProcess(tmp_path, "--emulation-schedule", str(schedule), "--emulation-interface",
                             a.ifname, "--emulation-netns", a.ns, env={"FLEXCOMM_STATE_DIR": str(state_dir)})
        try:
            agent.start()
            agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("emu", policy="dense")), timeout=5)
            wait_rates(shaper, [400e6])  # epoch 0's step from the start
            report_epoch(agent, 0)
            report_epoch(agent, 1)
            wait_rates(shaper, [100e6])
            report_epoch(agent, 2)
            wait_rates(shaper, [20e6])
            wait_for(lambda: stored(agent, a.ifname) == ([0, 1, 2], 2), what="the steps and epoch in the store")
            first_pid = agent.proc.pid
            agent.kill9()
            assert shaped_rates(shaper) == [20e6], "kill -9 leaves the link shaped..."
            assert owner_pid(revert) == first_pid
            # ...and the next agent restores it, then re-applies epoch 2's step (a new
            # row: serving alone proves nothing, the dead agent's shaping looks the same).
            agent.start()
            wait_for(lambda: stored(agent, a.ifname)[0] == [0, 1, 2, 2], what="epoch 2's step applied again")
            assert owner_pid(revert) == agent.proc.pid, "the stale record was restored, then recorded anew"
            assert "restored an interface a dead agent left shaped" in agent.log.read_text()
            assert shaped_rates(shaper) == [20e6]
            assert agent.terminate() == 0
            assert kernel_view(shaper.show()) == original, "SIGTERM gives the interface back"
            assert revert.read() is None
        finally:
            agent.stop()
