"""One policy instance per job, built from the job's spec.

The policy package's `make_policy` builds every policy by name; while it is not
there (the package is built in parallel), "dense" and "static" come from
policy/static.py and the adaptive ones are refused with a message naming them.
"""

from __future__ import annotations

from typing import Any

from flexcomm.agent.validate import JobSpec
from flexcomm.policy.types import Policy


def _fallback(name: str, options: dict[str, Any]) -> Policy:
    from flexcomm.policy.static import StaticPolicy, dense_policy

    if name == "dense":
        return dense_policy()
    if name == "static":
        unknown = set(options) - {"cr", "collective", "root"}
        if unknown:
            raise ValueError(f"spec.options: unknown option(s) for static: {', '.join(sorted(unknown))}")
        return StaticPolicy(**options)
    raise ValueError(f"spec.policy: {name!r} is not available in this build (make_policy missing)")


def create_policy(spec: JobSpec) -> Policy:
    """A fresh policy for `spec`; ValueError naming the field for bad options."""
    try:
        from flexcomm.policy import make_policy
    except ImportError:
        make_policy = None
    try:
        if make_policy is None:
            return _fallback(spec.policy, dict(spec.options))
        return make_policy(spec.policy, grad_bytes=spec.grad_bytes, nodes=spec.world_size,
                           options=dict(spec.options))
    except TypeError as exc:  # e.g. an option the policy's constructor does not take
        raise ValueError(f"spec.options: {exc}") from None
    except ValueError as exc:
        text = str(exc)
        raise ValueError(text if text.startswith("spec.") else f"spec.options.{text}") from None
