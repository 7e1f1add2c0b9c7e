"""Between the proto messages and the policy vocabulary (flexcomm.policy.types).

Enums map one to one onto the canonical names; an unknown or unspecified enum
value raises ValueError naming the field, like every other bad field.
"""

from __future__ import annotations

from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.types import COLLECTIVES, ROOT_SELECTIONS, Decision, GradientLayout, StepReport
from flexcomm.proto.flexcomm.v1 import agent_pb2 as pb

_COLLECTIVE_TO_ENUM = {name: pb.Collective.Value(f"COLLECTIVE_{name.upper()}") for name in COLLECTIVES}
_ENUM_TO_COLLECTIVE = {v: k for k, v in _COLLECTIVE_TO_ENUM.items()}
_ROOT_TO_ENUM = {name: pb.RootSelection.Value(f"ROOT_SELECTION_{name.upper()}") for name in ROOT_SELECTIONS}
_ENUM_TO_ROOT = {v: k for k, v in _ROOT_TO_ENUM.items()}


def collective_to_enum(name: str) -> int:
    try:
        return _COLLECTIVE_TO_ENUM[name]
    except KeyError:
        raise ValueError(f"collective: unknown collective {name!r} (one of {', '.join(COLLECTIVES)})") from None


def collective_from_enum(value: int, field: str = "collective") -> str:
    try:
        return _ENUM_TO_COLLECTIVE[value]
    except KeyError:
        known = ", ".join(pb.Collective.Name(v) for v in _ENUM_TO_COLLECTIVE)
        raise ValueError(f"{field}: unknown or unspecified collective {value} (one of {known})") from None


def root_to_enum(name: str) -> int:
    try:
        return _ROOT_TO_ENUM[name]
    except KeyError:
        raise ValueError(f"root: unknown root selection {name!r} (one of star, var)") from None


def root_from_enum(value: int, field: str = "root") -> str:
    try:
        return _ENUM_TO_ROOT[value]
    except KeyError:
        raise ValueError(f"{field}: unknown or unspecified root selection {value}") from None


def decision_to_proto(decision: Decision, job_id: str = "", decided_unix: float = 0.0) -> pb.Decision:
    return pb.Decision(
        job_id=job_id,
        family=decision.family,
        param=decision.param,
        collective=collective_to_enum(decision.collective),
        root=root_to_enum(decision.root),
        version=decision.version,
        predicted_sync_s=decision.predicted_sync_s,
        predicted_comp_s=decision.predicted_comp_s,
        reason=decision.reason,
        probes=list(decision.probes),
        model_forms=decision.model_forms,
        decided_unix=decided_unix,
        exploring=decision.exploring,
    )


def decision_from_proto(msg: pb.Decision) -> Decision:
    """Raises ValueError naming the field when the message is not a valid decision."""
    return Decision(
        family=msg.family,
        param=msg.param,
        collective=collective_from_enum(msg.collective),
        root=root_from_enum(msg.root),
        version=msg.version,
        predicted_sync_s=msg.predicted_sync_s,
        predicted_comp_s=msg.predicted_comp_s,
        reason=msg.reason,
        probes=tuple(msg.probes),
        model_forms=msg.model_forms,
        exploring=msg.exploring,
    )


def report_to_proto(report: StepReport) -> pb.StepReport:
    return pb.StepReport(
        step=report.step,
        epoch=report.epoch,
        family=report.family,
        param=report.param,
        collective=collective_to_enum(report.collective),
        t_comp_s=report.t_comp_s,
        t_sync_s=report.t_sync_s,
        t_compute_s=report.t_compute_s,
        gain=report.gain,
        bytes_sent=report.bytes_sent,
        gains=[pb.Gain(compression=name, gain=g) for name, g in report.gains.items()],
        ended_unix=report.ended_unix,
        grad_norm=report.grad_norm,
    )


def layout_to_proto(layout: GradientLayout) -> pb.GradientLayout:
    return pb.GradientLayout(
        matrices=[pb.MatrixShape(rows=r, cols=c) for r, c in layout.matrices],
        vector_values=layout.vector_values, value_bytes=layout.value_bytes)


def layout_from_proto(msg: pb.GradientLayout) -> GradientLayout:
    """Raises ValueError naming the field (layout.matrices[3]: ...)."""
    return GradientLayout(tuple((m.rows, m.cols) for m in msg.matrices), msg.vector_values, msg.value_bytes)


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    """A registered job's spec as the API shows it."""
    msg = pb.JobSpec(job_id=spec.job_id, world_size=spec.world_size, grad_bytes=spec.grad_bytes,
                     nodes=list(spec.nodes), policy=spec.policy)
    msg.options.update(spec.options)
    if spec.layout is not None:
        msg.layout.CopyFrom(layout_to_proto(spec.layout))
    return msg
