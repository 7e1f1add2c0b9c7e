"""flexcomm: data-parallel training that adapts to networks that change under it.

In a training script, after wrapping the model in DistributedDataParallel:

    import flexcomm
    state = flexcomm.register(model)        # or flexcomm.GradientSync(model) without DDP

The names below load torch only when first used: the CLI and the agent import
this package and never need it.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it
LAZY = {
    "register": "flexcomm.client.job",
    "GradientSync": "flexcomm.client.job",
    "job_id": "flexcomm.client.job",
    "FlexcommState": "flexcomm.client.hook",
    "flexcomm_hook": "flexcomm.client.hook",
    "AgentClient": "flexcomm.client.agent_client",
    "layout_of": "flexcomm.client.layout",
}
__all__ = ["__version__", *LAZY]


def __getattr__(name: str) -> Any:
    module = LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flexcomm' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
