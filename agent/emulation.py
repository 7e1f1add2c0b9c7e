"""An epoch-keyed emulation schedule advanced by the jobs' reported epochs.

With `emulation_schedule` set, the agent shapes `emulation_interface` (the only
interface it may touch) through flexcomm.emulation: the original qdisc is recorded
before the first change and restored when the agent stops; an agent killed
with the interface shaped restores it at its next start (the state file names
the dead owner). The step in force is the one for the highest epoch any job
has reported; each applied step is handed to `record` (the agent stores it).
Shaping runs on a worker thread, in order, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from flexcomm.agent.config import AgentConfig
from flexcomm.emulation.emulator import AppliedStep, Emulator
from flexcomm.emulation.revert import Revert
from flexcomm.emulation.schedule import load_schedule
from flexcomm.emulation.shaping import Shaper
from flexcomm.store import EmulationStep

log = logging.getLogger("flexcomm.agent.emulation")


class EpochEmulation:
    """`record(step)` is called, on the shaping thread, with each applied step."""

    def __init__(self, config: AgentConfig, record: Callable[[EmulationStep], None]) -> None:
        schedule = load_schedule(config.emulation_schedule)
        if not schedule.by_epoch:
            raise ValueError(f"emulation_schedule: {config.emulation_schedule} is keyed by time; "
                             "the agent advances epoch-keyed schedules (use `flexcomm emulate run`)")
        self.shaper = Shaper(config.emulation_interface, netns=config.emulation_netns or None,
                             allowed={config.emulation_interface})
        self.revert = Revert(self.shaper)
        self.emulator = Emulator(schedule, self.shaper, on_step=self._applied)
        self.record = record
        self.epoch = -1
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flexcomm-emulation")

    async def start(self, epoch: int) -> None:
        """Restore what a dead agent left shaped, record the interface as found,
        and apply the step for `epoch` (the highest any resumed job reported)."""
        loop = asyncio.get_running_loop()
        stale = await loop.run_in_executor(self._executor, self.revert.restore_if_stale)
        if stale:
            log.warning("restored an interface a dead agent left shaped",
                        extra={"fields": {"interface": self.shaper.where, "pid": stale.get("pid")}})
        await loop.run_in_executor(self._executor, self.revert.record, "run")
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

    def _applied(self, applied: AppliedStep) -> None:
        state = applied.state
        log.info("emulation step applied", extra={"fields": {
            "interface": self.shaper.where, "step": applied.step_index, "epoch": applied.epoch,
            "state": state.describe()}})
        self.record(EmulationStep(
            interface=self.shaper.ifname, step_index=applied.step_index,
            netns=self.shaper.netns or "", rate_bps=state.rate_bps, delay_s=state.delay_s,
            jitter_s=state.jitter_s, loss=state.loss, ts=applied.applied_at))

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self.revert.restore)
        finally:
            self._executor.shutdown(wait=True)
