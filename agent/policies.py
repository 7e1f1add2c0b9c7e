"""One policy instance per job, built from the job's spec by the policy
package's factory; a bad option is reported as `spec.options.<name>`."""

from __future__ import annotations

from flexcomm.agent.validate import JobSpec
from flexcomm.policy import make_policy
from flexcomm.policy.types import Policy


def create_policy(spec: JobSpec) -> Policy:
    """A fresh policy for `spec`; ValueError naming the option for bad options."""
    try:
        return make_policy(spec.policy, grad_bytes=spec.grad_bytes, nodes=spec.world_size,
                           options=dict(spec.options))
    except TypeError as exc:  # a value of the wrong kind reaching a constructor
        raise ValueError(f"spec.options: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"spec.options.{exc}") from None
