"""The training side of the agent: a `DecisionSource` backed by the local agent.

    source = AgentClient(job_id="resnet-42", world_size=8, layout=layout_of(model), policy="moo")
    source.latest()        # the newest Decision, or None before the first answer
    source.report(step)    # a StepReport; returns at once
    source.close()         # ends the job at the agent (also done at interpreter exit)

Only rank 0 uses it (docs/ARCHITECTURE.md). The agent is at $FLEXCOMM_AGENT_SOCKET,
else /run/flexcomm/agent.sock, unless `target` names it (a socket path or
host:port). The gradient is described by its layout
(`flexcomm.client.layout.layout_of(model)`: the matrices PowerSGD's cost depends
on, the bytes of a value) or, less well, by grad_bytes alone. Without `nodes`,
the job's nodes come from its process group: the hook gathers every rank's
address when it is built (client/nodes.py) and hands them over with
`use_nodes`; registration waits for them (up to `nodes_wait_s`).

Every call from the training loop returns at once: `latest()` reads one
attribute, `report()` appends to a bounded deque (the oldest reports are dropped
when the agent is away long enough to fill it). A background thread registers
the job, streams the reports in batches and fetches the decision, each RPC with
a timeout. When the agent cannot be reached the job keeps its last decision,
says so once in its log, retries with backoff, and re-registers when the agent
answers again (a restarted agent resumes the job from its store).

Lifecycle: `close()`, and the interpreter's exit if close was not called, end
the job at the agent (EndJob) from rank 0; a client built on another rank (by
$RANK, or torch.distributed's rank once initialised) warns once and never ends
the job, so a rank that finishes early cannot cut rank 0's last reports off.
An ended job leaves the agent's list of jobs; its history stays in the store.
A job id registered again with another spec (other policy
options, a restart in a new world) is replaced (`replace=True`, the default),
and the log says so; but while the job runs (heard from in the last 5 s),
another world (a new world size, other nodes) is refused with an error naming
the id, never merged into it, and retries until the id is free. An agent
that refuses the job (it holds `max_jobs` jobs already) is an error in the
log, naming the limit; the job runs its last decision (dense at first) and
registers as soon as a slot frees.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from flexcomm.policy.jobspec import policy_for
from flexcomm.policy.types import Decision, GradientLayout, StepReport
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc
from flexcomm.proto import validate
from flexcomm.proto.convert import decision_from_proto, layout_to_proto, report_to_proto
from flexcomm.units import require_finite_positive

log = logging.getLogger("flexcomm.client.agent")
MAX_BATCH = 4096  # the agent's per-message limit
# A report goes as soon as it comes (an answer to it reaches a step that is still
# syncing: the agreement launched as its syncs end carries it), one message per
# this long at most: on a job of 5 ms steps, a message per step would spend the
# training process's time in gRPC; reports that come meanwhile go together.
SEND_GAP_S = 0.02
DEFAULT_SOCKET = "/run/flexcomm/agent.sock"


def default_target() -> str:
    """$FLEXCOMM_AGENT_SOCKET (the agent's own setting), else the systemd unit's socket."""
    return os.environ.get("FLEXCOMM_AGENT_SOCKET") or DEFAULT_SOCKET


def channel_target(target: str) -> str:
    """A socket path becomes "unix:PATH"; "unix:..." and "host:port" stay."""
    return f"unix:{target}" if target.startswith("/") else target


def _job_spec(job_id: str, world_size: int, grad_bytes: int, nodes: Sequence[str], policy: str,
              options: Mapping[str, Any] | None, layout: GradientLayout | None = None) -> pb.JobSpec:
    """The registration message, from plain arguments checked by name."""
    for name, value in (("world_size", world_size), ("grad_bytes", grad_bytes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"spec.{name}: expected a whole number, got {value!r}")
    if isinstance(nodes, str) or not all(isinstance(n, str) for n in nodes):
        raise ValueError(f"spec.nodes: expected a list of addresses, got {nodes!r}")
    for name, value in (("job_id", job_id), ("policy", policy)):
        if not isinstance(value, str):
            raise ValueError(f"spec.{name}: expected a string, got {value!r}")
    for name, value, bound in (("world_size", world_size, 1 << 32), ("grad_bytes", grad_bytes, 1 << 63)):
        if not 0 <= value < bound:
            raise ValueError(f"spec.{name}: out of range [0, {bound}), got {value!r}")
    spec = pb.JobSpec(job_id=job_id, world_size=world_size, grad_bytes=grad_bytes, nodes=list(nodes), policy=policy)
    if layout is not None:
        spec.layout.CopyFrom(layout_to_proto(layout))
    try:
        spec.options.update(dict(options or {}))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"spec.options: only numbers, strings, booleans, lists and tables: {exc}") from None
    return spec


def _this_rank() -> int | None:
    """This process's rank: torch.distributed's once initialised, else $RANK (None: unknown)."""
    dist = sys.modules.get("torch.distributed")  # not imported here: a training job has it already
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    rank = os.environ.get("RANK", "")
    return int(rank) if rank.isdigit() else None


_warned_rank: list[bool] = []


def _warn_not_rank_zero(job_id: str) -> None:
    if not _warned_rank:
        _warned_rank.append(True)
        log.warning("job %s: an AgentClient on rank %s; only rank 0's is asked (pass it on rank 0 and None "
                    "elsewhere). This one will not end the job.", job_id, _this_rank(),
                    extra={"fields": {"job": job_id}})


class AgentClient:
    """A DecisionSource that asks the agent at `target` (socket path or host:port)."""

    def __init__(self, target: str | None = None, *, job_id: str, world_size: int, grad_bytes: int | None = None,
                 layout: GradientLayout | None = None, nodes: Sequence[str] | None = None, policy: str = "moo",
                 options: Mapping[str, Any] | None = None, replace: bool = True,
                 credentials: grpc.ChannelCredentials | None = None,
                 timeout_s: float = 1.0, register_timeout_s: float = 10.0, poll_interval_s: float = 0.5,
                 retry_max_s: float = 5.0, nodes_wait_s: float = 10.0, max_pending: int = 100_000) -> None:
        for name, value in (("timeout_s", timeout_s), ("register_timeout_s", register_timeout_s),
                            ("poll_interval_s", poll_interval_s), ("retry_max_s", retry_max_s),
                            ("nodes_wait_s", nodes_wait_s)):
            require_finite_positive(name, value)
        if layout is not None and not isinstance(layout, GradientLayout):
            raise ValueError(f"layout: expected a GradientLayout (client.layout.layout_of(model)), got {layout!r}")
        if grad_bytes is None:
            if layout is None:
                raise ValueError("grad_bytes: give the gradient's layout (layout_of(model)) or its size in bytes")
            grad_bytes = layout.grad_bytes
        spec = _job_spec(job_id, world_size, grad_bytes, nodes or (), policy, options, layout)
        self.target = channel_target(target or default_target())
        # The agent's own checks, here: a bad spec fails in the caller's code at
        # construction, not as a refusal logged by a background thread.
        policy_for(validate.spec(spec))
        self._register = pb.RegisterJobRequest(spec=spec, replace=replace)
        self._nodes_given = nodes is not None
        self._nodes_known = threading.Event()
        if self._nodes_given:
            self._nodes_known.set()
        self.job_id = job_id
        self.timeout_s = timeout_s
        # Registering writes the job to the agent's store before it is held: on a
        # loaded host that took over 1 s, and a registration cut off at the RPC
        # timeout left the job's first steps without the agent's decision.
        self.register_timeout_s = register_timeout_s
        self.poll_interval_s = poll_interval_s
        self.retry_max_s = retry_max_s
        self.nodes_wait_s = nodes_wait_s
        self._latest: Decision | None = None
        self._pending: collections.deque[StepReport] = collections.deque(maxlen=max_pending)
        self._inflight: list[StepReport] = []
        self._network: tuple[float, float] | None = None
        self._network_sent: tuple[float, float] | None = None
        self._registered = False
        self._closing_by = 0.0  # when close() wants the thread done (monotonic; 0 until it is called)
        self._ever_registered = False
        self.reachable: bool | None = None  # None until the first attempt
        self.refusal: str | None = None  # why the agent refuses the job, while it does
        self.refused_batches = 0
        self.ended = False
        self._ends_job = _this_rank() in (None, 0)
        if not self._ends_job:
            _warn_not_rank_zero(job_id)
        self._stop = threading.Event()
        self._wake = threading.Event()  # a report came (or the client closes)
        self._first_try_done = threading.Event()  # the first registration answered, refused or failed
        self._channel = (grpc.secure_channel(self.target, credentials) if credentials
                         else grpc.insecure_channel(self.target))
        self._stub = pb_grpc.AgentStub(self._channel)
        self._thread = threading.Thread(target=self._run, name="flexcomm-agent-client", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._register.spec.nodes)

    def use_nodes(self, nodes: Sequence[str]) -> None:
        """The job's nodes, gathered from its process group (client/nodes.py); taken
        only when none were given. After a registration without them (none came in
        time) the job registers again, with them.

        The hook calls it once when it is built, before the first step, and it waits
        there for the first registration to end (at most `register_timeout_s`; an
        agent that is not there fails it at once), so that the job's first
        agreement already carries the agent's decision."""
        self._take_nodes(nodes)
        self._first_try_done.wait(self.register_timeout_s)

    def _take_nodes(self, nodes: Sequence[str]) -> None:
        if not self._nodes_given and not nodes:
            log.warning("job %s: no node addresses ($MASTER_ADDR unset or unresolvable); the agent "
                        "cannot probe this job's network (give nodes=)", self.job_id)
        if not self._nodes_given and list(nodes) != list(self.nodes):
            spec = pb.JobSpec()
            spec.CopyFrom(self._register.spec)
            del spec.nodes[:]
            spec.nodes.extend(nodes)
            validate.spec(spec)
            # One assignment: the background thread sees the old request or the new.
            self._register = pb.RegisterJobRequest(spec=spec, replace=self._register.replace)
            if self._ever_registered:
                self._registered = False
        self._nodes_known.set()

    # -- DecisionSource (called from the training loop: never blocks) -----------
    def latest(self) -> Decision | None:
        return self._latest

    def report(self, report: StepReport) -> None:
        self._pending.append(report)
        self._wake.set()

    def report_network(self, alpha_s: float, bandwidth_bps: float) -> None:
        """The job's own estimate of its network, sent with the next reports."""
        self._network = (float(alpha_s), float(bandwidth_bps))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, sending what it can (within the RPC timeout) and ending
        the job at the agent, both within `timeout_s` once an RPC in flight
        returns. Ending the job waits past the RPC timeout: at exit no training
        step waits on it, and a job left at the agent stays there until idle
        expiry (held to 1 s, a CI run beside two CPU hogs left one). Called at
        interpreter exit if not before."""
        atexit.unregister(self.close)
        if self._stop.is_set():
            return
        self._closing_by = time.monotonic() + timeout_s
        self._stop.set()
        self._wake.set()
        self._nodes_known.set()
        self._thread.join(timeout_s + self.timeout_s)
        self._channel.close()

    # -- the background thread --------------------------------------------------
    def _run(self) -> None:
        backoff = 0.05
        last_poll = 0.0
        self._wait_for_nodes()
        while not self._stop.is_set():
            try:
                if not self._registered:
                    self._do_register()
                if self._inflight or self._pending or self._network != self._network_sent:
                    self._send_reports()
                    self._stop.wait(SEND_GAP_S)
                elif time.monotonic() - last_poll >= self.poll_interval_s:
                    self._adopt(self._stub.GetDecision(pb.JobRef(job_id=self.job_id),
                                                       timeout=self.timeout_s))
                    last_poll = time.monotonic()
                self._mark_reachable()
                backoff = 0.05
                if not self._pending:
                    self._wake.wait(min(0.05, self.poll_interval_s))
                self._wake.clear()
            except grpc.RpcError as exc:
                backoff = self._on_error(exc, backoff)
            except Exception:
                # A bug or a closed channel must not end the thread silently with
                # `reachable` still True: say so, keep the last decision, retry.
                log.exception("agent client error; the job keeps its last decision",
                              extra={"fields": {"job": self.job_id, "agent": self.target}})
                self.reachable = False
                self._registered = False
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.retry_max_s)
        self._final_send()
        self._end_job()

    def _wait_for_nodes(self) -> None:
        if not self._nodes_known.wait(self.nodes_wait_s):
            log.warning("job %s: no node list after %gs; registering without one, so the agent "
                        "probes nothing for it (give nodes=, or build the flexcomm hook)",
                        self.job_id, self.nodes_wait_s, extra={"fields": {"job": self.job_id}})

    def _do_register(self) -> None:
        try:
            response = self._stub.RegisterJob(self._register, timeout=self.register_timeout_s)
        except grpc.RpcError:
            self._first_try_done.set()  # the job starts on its own decision (dense); retried
            raise
        self._registered = self._ever_registered = True
        self.refusal = None
        self._adopt(response.decision)
        self._first_try_done.set()
        if response.replaced:
            log.warning("job %s replaced its earlier registration at the agent (changed: %s); "
                        "its policy starts anew", self.job_id, ", ".join(response.changed),
                        extra={"fields": {"job": self.job_id, "changed": list(response.changed)}})
        log.info("registered job %s with the agent at %s (resumed: %s); nodes: %s", self.job_id,
                 self.target, response.resumed, ", ".join(self.nodes) or "none", extra={"fields": {
            "job": self.job_id, "agent": self.target, "resumed": response.resumed,
            "nodes": list(self.nodes), "version": response.decision.version}})

    def _end_job(self) -> None:
        # Tried even after a failed call: one report past its deadline on a loaded
        # host left `reachable` False and a CI run's job at the agent after exit;
        # a poll past its deadline also unsets `_registered` (to register again).
        if not self._ever_registered or not self._ends_job:
            return
        with contextlib.suppress(grpc.RpcError):  # an agent gone meanwhile expires it instead
            self._stub.EndJob(pb.EndJobRequest(job_id=self.job_id),
                              timeout=max(self.timeout_s, self._closing_by - time.monotonic()))
            self.ended = True
            log.info("ended job %s at the agent", self.job_id, extra={"fields": {"job": self.job_id}})

    def _take_batch(self) -> list[StepReport]:
        if not self._inflight:
            while self._pending and len(self._inflight) < MAX_BATCH:
                self._inflight.append(self._pending.popleft())
        return self._inflight

    def _send_reports(self) -> None:
        batch = self._take_batch()
        network = self._network
        request = pb.ReportStepsRequest(job_id=self.job_id,
                                        reports=[report_to_proto(r) for r in batch])
        if network is not None:
            request.network.alpha_s, request.network.bandwidth_bps = network
        response = self._stub.ReportSteps(iter([request]), timeout=self.timeout_s)
        self._inflight = []
        self._network_sent = network
        self._adopt(response.decision)

    def _adopt(self, msg: pb.Decision) -> None:
        try:
            decision = decision_from_proto(msg)
        except ValueError as exc:
            log.error("agent sent an invalid decision (%s); keeping the last one", exc,
                      extra={"fields": {"job": self.job_id, "error": str(exc)}})
            return
        if decision != self._latest:
            self._latest = decision

    def _mark_reachable(self) -> None:
        if self.reachable is False:
            log.warning("agent reachable again at %s", self.target,
                        extra={"fields": {"job": self.job_id, "agent": self.target}})
        self.reachable = True

    def _on_error(self, exc: grpc.RpcError, backoff: float) -> float:
        code = exc.code()
        if code == grpc.StatusCode.NOT_FOUND:  # the agent lost the job: register again
            self._registered = False
            return backoff
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and not self._registered:
            return self._refused(exc)
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS):
            # Retrying the same data would fail forever: drop it, say why.
            self.refused_batches += 1
            log.error("agent refused a request (%s): %s", code.name, exc.details(), extra={"fields": {
                "job": self.job_id, "code": code.name, "error": exc.details()}})
            self._inflight = []
            self._network_sent = self._network
            if not self._registered:
                self._stop.wait(self.retry_max_s)
            return backoff
        if self.reachable is not False:
            kept = self._latest
            what = f"{kept.label} (v{kept.version})" if kept else "none yet"
            log.warning("agent unreachable at %s (%s); the job keeps its last decision: %s",
                        self.target, code.name if code else "?", what,
                        extra={"fields": {"job": self.job_id, "agent": self.target}})
        self.reachable = False
        self._registered = False  # a restarted agent may need it (it resumes from its store)
        self._stop.wait(backoff)
        return min(backoff * 2, self.retry_max_s)

    def _refused(self, exc: grpc.RpcError) -> float:
        """The agent runs max_jobs jobs: say so (once per refusal spell), retry slowly."""
        if self.refusal is None:
            log.error("the agent at %s refuses job %s: %s. The job runs without its decisions "
                      "(dense) until it registers.", self.target, self.job_id, exc.details(),
                      extra={"fields": {"job": self.job_id, "error": exc.details()}})
        self.refusal = exc.details()
        self.reachable = True
        self._stop.wait(self.retry_max_s)
        return self.retry_max_s

    def _final_send(self) -> None:
        if (self._inflight or self._pending) and self.reachable:
            with contextlib.suppress(grpc.RpcError):  # best effort on the way out
                self._send_reports()
