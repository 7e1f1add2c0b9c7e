"""A job as registered: who it is, where it runs, its gradient and the policy it
asked for (checked field by field from the request by proto/validate.py), and
the fresh policy it gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flexcomm.policy import make_policy
from flexcomm.policy.types import GradientLayout, Policy


@dataclass(frozen=True)
class JobSpec:
    """A validated registration. `nodes` keeps the order given; `layout` is None
    when the job sent none (the policy then takes one flat vector of grad_bytes)."""

    job_id: str
    world_size: int
    grad_bytes: int
    nodes: tuple[str, ...]
    policy: str
    options: dict[str, Any] = field(default_factory=dict)
    layout: GradientLayout | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "world_size": self.world_size, "grad_bytes": self.grad_bytes,
                "nodes": list(self.nodes), "policy": self.policy, "options": self.options,
                "layout": self.layout.to_dict() if self.layout else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        layout = d.get("layout")
        return cls(job_id=d["job_id"], world_size=int(d["world_size"]), grad_bytes=int(d["grad_bytes"]),
                   nodes=tuple(d["nodes"]), policy=d["policy"], options=dict(d.get("options") or {}),
                   layout=GradientLayout.from_dict(layout) if layout else None)


def policy_for(spec: JobSpec) -> Policy:
    """A fresh policy for `spec`; ValueError naming the option for bad options."""
    try:
        return make_policy(spec.policy, grad_bytes=spec.grad_bytes, nodes=spec.world_size,
                           options=dict(spec.options), layout=spec.layout)
    except TypeError as exc:  # a value of the wrong kind reaching a constructor
        raise ValueError(f"spec.options: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"spec.options.{exc}") from None
