"""A lab rank's flexcomm hook: `flexcomm.client.hook.register` with the decision
source a user would give it.

Rank 0's decisions come from the node's agent (`flexcomm.client.agent_client.
AgentClient` on the agent's socket) when the config names one, else from the
policy run in-process (`flexcomm.policy.make_policy`). Other ranks get no source:
they adopt whatever rank 0 decided, through the hook's agreement collective.
"""

from __future__ import annotations

from typing import Any

from torch.nn.parallel import DistributedDataParallel

from flexcomm.client.gains import merge_masses
from flexcomm.client.hook import register
from flexcomm.client.layout import layout_of
from flexcomm.policy import GradientLayout, make_policy


class FlexcommSync:
    def __init__(self, ddp: DistributedDataParallel, cfg: Any, rank: int, grad_bytes: int) -> None:
        source = self._source(cfg, layout_of(ddp.module), dict(cfg.policy_options)) if rank == 0 else None
        self.state = register(ddp, source=source, **cfg.hook_options)
        self.grad_bytes = grad_bytes

    @staticmethod
    def _source(cfg: Any, layout: GradientLayout, options: dict[str, Any]) -> Any:
        if cfg.agent_socket:
            from flexcomm.client.agent_client import AgentClient

            return AgentClient(
                cfg.agent_socket, job_id=cfg.job_id, world_size=cfg.world, layout=layout,
                nodes=list(cfg.node_addresses), policy=cfg.policy,
                options=options,
            )
        return make_policy(cfg.policy, grad_bytes=layout.grad_bytes, nodes=cfg.world, options=options, layout=layout)

    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        self.state.set_epoch(epoch)
        stats = self.state.last_stats()
        if stats is None:
            return {}
        decision = self.state.decision
        record = {
            "compression": stats.compression.name,
            "cr": stats.bytes_sent / self.grad_bytes,  # the share of a dense step's bytes
            "collective": stats.collective,
            "version": stats.version,
            "t_sync_s": stats.t_sync_s,
            "t_comp_s": stats.t_comp_s,
            "t_probe_s": stats.t_probe_s,  # rank 0's reading of the probes' gains, in no other figure
            "gain": stats.gain,
            "bytes_sent": stats.bytes_sent,
            "predicted_sync_s": decision.predicted_sync_s,
            "reason": decision.reason,
            "exploring": decision.exploring,
        }
        if stats.probes:  # resolved above (stats.gain); with the estimates, what replaying the policy needs
            record["gains"] = merge_masses(stats.probes)
        return record

    def close(self) -> None:
        self.state.close()
