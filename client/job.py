"""The one-line form: `flexcomm.register(ddp_model)` and `flexcomm.GradientSync(model)`.

Given no choice of its own (no source, policy or compression), rank 0 asks the
node's agent (`agent=`, else $FLEXCOMM_AGENT_SOCKET, else the default socket)
under a job id unique to this run (`job_id()`), describing the model's gradient
by its layout; the agent client ends the job at the interpreter's exit (or at
`state.close()`). When no agent answers within `agent_wait_s`, rank 0 decides
in-process with the MOO instead and says so once. Every option of FlexcommState
and GradientSync passes through, and a choice given (source=, policy=,
compression=) is used as it is.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Iterable
from typing import Any

import grpc
import torch
import torch.distributed as dist

from flexcomm.client import hook, sync
from flexcomm.client.agent_client import AgentClient, channel_target, default_target
from flexcomm.client.controller import check_group
from flexcomm.client.decisions import DecisionSource
from flexcomm.client.layout import layout_of
from flexcomm.policy import make_policy
from flexcomm.policy.types import Policy
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc

log = logging.getLogger("flexcomm.client")
CHOICES = ("source", "policy", "compression")
DEFAULT_TUNING = ("agent", "job", "agent_policy", "agent_wait_s")  # default_source's options
NOT_IN_AN_ID = re.compile(r"[^A-Za-z0-9._-]+")
MAX_ID = 128


def job_id(now: float | None = None) -> str:
    """A job id unique to this run, from its rendezvous: torchrun's run id (when
    it is not `none`), the master's address and port, and the start time (UTC).
    Two jobs at once cannot share a master address and port; one job run twice
    differs in its start time."""
    parts = []
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        parts.append(run_id)
    parts.append(os.environ.get("MASTER_ADDR") or socket.gethostname())
    parts.append(os.environ.get("MASTER_PORT") or f"pid{os.getpid()}")
    parts.append(time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now)))
    name = NOT_IN_AN_ID.sub("_", "-".join(parts))
    return name[-MAX_ID:]


def agent_answers(target: str, timeout_s: float) -> bool:
    """Whether a flexcomm agent answers at `target` (a socket path or host:port)."""
    if target.startswith("/") and not os.path.exists(target):
        return False
    with grpc.insecure_channel(channel_target(target)) as channel:
        try:
            pb_grpc.AgentStub(channel).GetAgentInfo(pb.GetAgentInfoRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return True


def default_source(params: torch.nn.Module | Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None, *,
                   agent: str | None = None, job: str | None = None, agent_policy: str = "moo",
                   agent_wait_s: float = 1.0) -> DecisionSource | Policy | None:
    """Rank 0: the node's agent if one answers, else the in-process MOO. Other
    ranks: None (only rank 0's source is asked)."""
    check_group(group)
    if dist.get_rank(group) != 0:
        return None
    layout = layout_of(params)
    world = dist.get_world_size(group)
    target = agent or default_target()
    if agent_answers(target, agent_wait_s):
        return AgentClient(target, job_id=job or job_id(), world_size=world, layout=layout, policy=agent_policy)
    log.warning("no flexcomm agent answers at %s; this job decides in-process with the MOO, from its own "
                "steps only (start the agent, or set FLEXCOMM_AGENT_SOCKET)", target)
    return make_policy("moo", grad_bytes=layout.grad_bytes, nodes=world, layout=layout)


def _with_default_source(params: Any, group: dist.ProcessGroup | None, options: dict[str, Any]) -> dict[str, Any]:
    tuning = {name: options.pop(name) for name in DEFAULT_TUNING if name in options}
    if all(options.get(name) is None for name in CHOICES) and options.get("collective") is None:
        options["source"] = default_source(params, group, **tuning)
    return options


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, **options: Any) -> hook.FlexcommState:
    """Register the flexcomm hook on `ddp_model` (every rank), deciding as the
    module says; `agent=`, `job=`, `agent_policy=` and `agent_wait_s=` tune the
    default (default_source), the rest are FlexcommState's options. Returns the state."""
    group = options.get("process_group") or getattr(ddp_model, "process_group", None)
    return hook.register(ddp_model, **_with_default_source(ddp_model, group, options))


class GradientSync(sync.GradientSync):
    """`flexcomm.client.sync.GradientSync` with the one-line form's default source."""

    def __init__(self, params: torch.nn.Module | Iterable[torch.nn.Parameter],
                 process_group: dist.ProcessGroup | None = None, **options: Any) -> None:
        params = list(params.parameters()) if isinstance(params, torch.nn.Module) else list(params)
        super().__init__(params, process_group, **_with_default_source(params, process_group, options))
