"""Checking every field of every request before anything is changed.

Shared by the agent (every RPC) and the agent client (a job spec is checked when
the client is built, so a bad one fails in the user's code, not silently in a
background thread).

Each check raises ValueError whose message starts with the field's path in the
request (e.g. "reports[3].t_sync_s: must be finite and >= 0, got nan"); the
service turns it into INVALID_ARGUMENT. Bounds are generous but finite, so an
absurd value (a 10^30-byte gradient, a step time of a year) is refused rather
than fed to a policy.
"""

from __future__ import annotations

import math
import re
from typing import Any

from google.protobuf import struct_pb2

from flexcomm.policy import POLICY_NAMES
from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.types import MAX_EXACT_INT, MAX_LAYOUT_MATRICES, GradientLayout, StepReport
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto.convert import collective_from_enum, layout_from_proto

JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
HOST = re.compile(r"^[A-Za-z0-9.:_\[\]-]{1,253}$")
POLICIES = POLICY_NAMES
MAX_WORLD_SIZE = 1 << 20
MAX_GRAD_BYTES = 1 << 40  # 1 TiB of gradient per step
MAX_NODES = 4096
MAX_OPTIONS_BYTES = 16 * 1024
MAX_REPORTS_PER_MESSAGE = 4096
MAX_GAINS_PER_REPORT = 64
MAX_STEP = MAX_EXACT_INT
MAX_SECONDS = 86_400.0  # one step phase longer than a day is a broken clock
MAX_BYTES_PER_STEP = 1 << 44
MAX_BANDWIDTH_BPS = 1e13  # 10 Tbit/s
# 1 kbit/s: a slower estimate is a broken one, and a subnormal one made beta infinite.
MIN_BANDWIDTH_BPS = 1e3
MAX_ALPHA_S = 60.0
MAX_HISTORY = 1000
DEFAULT_HISTORY = 10


def job_id(value: str, field_name: str = "job_id") -> str:
    if not JOB_ID.fullmatch(value):
        raise ValueError(f"{field_name}: must be 1-128 characters of A-Z a-z 0-9 . _ -, got {value[:140]!r}")
    return value


def _bounded_float(name: str, value: float, high: float, *, positive: bool = False) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name}: must be {'> 0' if positive else '>= 0'}, got {value!r}")
    if value > high:
        raise ValueError(f"{name}: must be <= {high:g}, got {value!r}")
    return value


def _plain(value: struct_pb2.Value, where: str) -> Any:
    """A Struct value as plain Python; whole numbers as ints (Struct numbers are
    doubles), non-finite numbers refused."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        v = value.number_value
        if not math.isfinite(v):
            raise ValueError(f"{where}: numbers must be finite, got {v!r}")
        return int(v) if v.is_integer() and abs(v) < MAX_STEP else v
    if kind == "struct_value":
        return {k: _plain(v, f"{where}.{k}") for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value.list_value.values)]
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None


def options(msg: pb.JobSpec) -> dict[str, Any]:
    size = msg.options.ByteSize()
    if size > MAX_OPTIONS_BYTES:
        raise ValueError(f"spec.options: {size} bytes, at most {MAX_OPTIONS_BYTES}")
    return {k: _plain(v, f"spec.options.{k}") for k, v in msg.options.fields.items()}


def spec(msg: pb.JobSpec) -> JobSpec:
    job_id(msg.job_id, "spec.job_id")
    if not 2 <= msg.world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"spec.world_size: must be in 2..{MAX_WORLD_SIZE}, got {msg.world_size}")
    if not 0 < msg.grad_bytes <= MAX_GRAD_BYTES:
        raise ValueError(f"spec.grad_bytes: must be in 1..{MAX_GRAD_BYTES}, got {msg.grad_bytes}")
    if len(msg.nodes) > MAX_NODES:
        raise ValueError(f"spec.nodes: at most {MAX_NODES} nodes, got {len(msg.nodes)}")
    for i, node in enumerate(msg.nodes):
        if not HOST.fullmatch(node):
            raise ValueError(f"spec.nodes[{i}]: not an address or host name: {node[:260]!r}")
    if len(set(msg.nodes)) != len(msg.nodes):
        raise ValueError("spec.nodes: an address is listed twice")
    if msg.policy not in POLICIES:
        raise ValueError(f"spec.policy: unknown policy {msg.policy[:64]!r} (one of {', '.join(POLICIES)})")
    return JobSpec(job_id=msg.job_id, world_size=msg.world_size, grad_bytes=msg.grad_bytes,
                   nodes=tuple(msg.nodes), policy=msg.policy, options=options(msg), layout=layout(msg))


def layout(msg: pb.JobSpec) -> GradientLayout | None:
    """The job's gradient layout, or None when it sent none. Its values must add up
    to grad_bytes: the two describe one gradient."""
    if not msg.HasField("layout"):
        return None
    if len(msg.layout.matrices) > MAX_LAYOUT_MATRICES:
        raise ValueError(f"spec.layout.matrices: at most {MAX_LAYOUT_MATRICES}, got {len(msg.layout.matrices)}")
    try:
        found = layout_from_proto(msg.layout)
    except ValueError as exc:
        raise ValueError(f"spec.{exc}") from None
    if found.grad_bytes != msg.grad_bytes:
        raise ValueError(f"spec.layout: its values are {found.grad_bytes} bytes, grad_bytes says {msg.grad_bytes}")
    return found


def report(msg: pb.StepReport, where: str) -> StepReport:
    """One step report; `where` is its path, e.g. "reports[3]"."""
    if msg.step > MAX_STEP:
        raise ValueError(f"{where}.step: must be <= 2^53, got {msg.step}")
    if msg.epoch > MAX_STEP:
        raise ValueError(f"{where}.epoch: must be <= 2^53, got {msg.epoch}")
    if msg.bytes_sent > MAX_BYTES_PER_STEP:
        raise ValueError(f"{where}.bytes_sent: must be <= 2^44, got {msg.bytes_sent}")
    collective = collective_from_enum(msg.collective, f"{where}.collective")
    # NaN fails every comparison: one chained test per value passes the good ones,
    # and only a bad one pays for the message naming it (a report is checked in
    # about 3 us; the agent ingests tens of thousands a second).
    if not (0 <= msg.t_comp_s <= MAX_SECONDS and 0 <= msg.t_sync_s <= MAX_SECONDS
            and 0 <= msg.t_compute_s <= MAX_SECONDS and 0 <= msg.gain <= 1.0):
        for name in ("t_comp_s", "t_sync_s", "t_compute_s"):
            _bounded_float(f"{where}.{name}", getattr(msg, name), MAX_SECONDS)
        _bounded_float(f"{where}.gain", msg.gain, 1.0)
    if len(msg.gains) > MAX_GAINS_PER_REPORT:
        raise ValueError(f"{where}.gains: at most {MAX_GAINS_PER_REPORT} entries, got {len(msg.gains)}")
    gains = {}
    for i, g in enumerate(msg.gains):
        if len(g.compression) > 64:
            raise ValueError(f"{where}.gains[{i}].compression: at most 64 characters")
        gain = g.gain
        gains[g.compression] = gain if 0 <= gain <= 1.0 else _bounded_float(f"{where}.gains[{i}].gain", gain, 1.0)
    try:
        return StepReport(step=msg.step, family=msg.family, param=msg.param, collective=collective,
                          t_comp_s=msg.t_comp_s, t_sync_s=msg.t_sync_s, gain=msg.gain,
                          bytes_sent=msg.bytes_sent, epoch=msg.epoch, t_compute_s=msg.t_compute_s, gains=gains,
                          ended_unix=msg.ended_unix, grad_norm=msg.grad_norm)
    except ValueError as exc:  # anything the shared vocabulary checks beyond the above
        raise ValueError(f"{where}.{exc}") from None


def reports(msg: pb.ReportStepsRequest, start: int = 0, stop: int | None = None) -> list[StepReport]:
    """The message's reports [start, stop) (all by default)."""
    if len(msg.reports) > MAX_REPORTS_PER_MESSAGE:
        raise ValueError(f"reports: at most {MAX_REPORTS_PER_MESSAGE} per message, got {len(msg.reports)}")
    stop = len(msg.reports) if stop is None else min(stop, len(msg.reports))
    return [report(msg.reports[i], f"reports[{i}]") for i in range(start, stop)]


def network(msg: pb.NetworkEstimate) -> tuple[float, float]:
    """(alpha_s, bandwidth_bps) of a job's own estimate."""
    alpha = _bounded_float("network.alpha_s", msg.alpha_s, MAX_ALPHA_S)
    bandwidth = _bounded_float("network.bandwidth_bps", msg.bandwidth_bps, MAX_BANDWIDTH_BPS,
                               positive=True)
    if bandwidth < MIN_BANDWIDTH_BPS:
        raise ValueError(f"network.bandwidth_bps: must be >= {MIN_BANDWIDTH_BPS:g} bit/s, got {bandwidth!r}")
    return alpha, bandwidth


def history_limit(value: int) -> int:
    """GetHistory's limit: 0 means DEFAULT_HISTORY."""
    if value > MAX_HISTORY:
        raise ValueError(f"limit: must be in 1..{MAX_HISTORY} (0: {DEFAULT_HISTORY}), got {value}")
    return value or DEFAULT_HISTORY
