"""An epoch-keyed emulation schedule advanced by the jobs' reported epochs.

With `emulation_schedule` set, the agent shapes `emulation_interface` (the only
interface it may touch) through flexcomm.probe: the original qdisc is recorded
before the first change and restored when the agent stops; an agent killed
with the interface shaped restores it at its next start (the state file names
the dead owner). The step in force is the one for the highest epoch any job
has reported; each applied step is recorded in the store. Shaping runs on a
worker thread, in order, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from flexcomm.agent.config import AgentConfig
from flexcomm.agent.jobs import Job
from flexcomm.emulation.emulator import AppliedStep, Emulator
from flexcomm.emulation.revert import Revert
from flexcomm.emulation.schedule import load_schedule
from flexcomm.emulation.shaping import Shaper
from flexcomm.store import EmulationStep

if TYPE_CHECKING:
    from flexcomm.agent.server import Agent

log = logging.getLogger("flexcomm.agent.emulation")


class EpochEmulation:
    def __init__(self, config: AgentConfig) -> None:
        schedule = load_schedule(config.emulation_schedule)
        if not schedule.by_epoch:
            raise ValueError(f"emulation_schedule: {config.emulation_schedule} is keyed by time; "
                             "the agent advances epoch-keyed schedules (use `flexcomm emulate run`)")
        self.shaper = Shaper(config.emulation_interface, netns=config.emulation_netns or None,
                             allowed={config.emulation_interface})
        self.revert = Revert(self.shaper)
        self.emulator = Emulator(schedule, self.shaper, on_step=self._record)
        self.epoch = -1
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexcomm-emulation")
        self._agent: Agent | None = None

    async def start(self, agent: Agent) -> None:
        self._agent = agent
        loop = asyncio.get_running_loop()
        stale = await loop.run_in_executor(self._executor, self.revert.restore_if_stale)
        if stale:
            log.warning("restored an interface a dead agent left shaped",
                        extra={"fields": {"interface": self.shaper.where, "pid": stale.get("pid")}})
        await loop.run_in_executor(self._executor, self.revert.record, "run")
        self.advance(max((job.last_epoch for job in agent.jobs), default=0))

    def on_epoch(self, job: Job, epoch: int) -> None:
        self.advance(epoch)

    def advance(self, epoch: int) -> None:
        if epoch <= self.epoch:
            return
        self.epoch = epoch
        future = self._executor.submit(self.emulator.advance_epoch, epoch)
        future.add_done_callback(self._report_failure)

    def _report_failure(self, future) -> None:
        exc = future.exception()
        if exc is not None:
            log.error("emulation step failed", extra={"fields": {"interface": self.shaper.where,
                                                                 "error": str(exc)}})

    def _record(self, applied: AppliedStep) -> None:
        state = applied.state
        log.info("emulation step applied", extra={"fields": {
            "interface": self.shaper.where, "step": applied.step_index, "epoch": applied.epoch,
            "state": state.describe()}})
        if self._agent is not None and self._agent.persister.store is not None:
            self._agent.persister.store.add_emulation_step(EmulationStep(
                interface=self.shaper.ifname, step_index=applied.step_index,
                netns=self.shaper.netns or "", rate_bps=state.rate_bps, delay_s=state.delay_s,
                jitter_s=state.jitter_s, loss=state.loss, ts=applied.applied_at))

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self.revert.restore)
        finally:
            self._executor.shutdown(wait=True)
