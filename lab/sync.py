"""How a lab rank synchronises gradients: the flexcomm DDP hook driven by a named
policy, or PyTorch's own hooks (PowerSGD; plain DDP AllReduce) to compare with.

`attach_sync(ddp, cfg, rank, grad_bytes)` registers the method on the DDP model
and returns a `SyncMethod` whose `after_step` gives the step's record fields:
cr, collective, t_sync_s, t_comp_s, bytes_sent, and for the flexcomm hook the
decision's version, reason and predicted sync time. bytes_sent is the payload
this rank contributes to the step's collectives (the message size M of the cost
model, as the flexcomm hook counts it), not what the ring forwards on the wire.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch.nn.parallel import DistributedDataParallel

POWERSGD_RANK = 2
POWERSGD_START_ITER = 10


class SyncMethod(Protocol):
    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        """Record fields for the step that just ran."""

    def close(self) -> None:
        """Stop background work (agent client threads)."""


def attach_sync(ddp: DistributedDataParallel, cfg: Any, rank: int, grad_bytes: int) -> SyncMethod:
    if cfg.policy == "powersgd":
        return PowerSGDSync(ddp, grad_bytes)
    if cfg.policy == "allreduce":
        return TorchAllReduceSync(grad_bytes)
    from flexcomm.lab.flexsync import FlexcommSync

    return FlexcommSync(ddp, cfg, rank, grad_bytes)


class TorchAllReduceSync:
    """DDP's built-in AllReduce (no hook registered)."""

    def __init__(self, grad_bytes: int) -> None:
        self._bytes = grad_bytes

    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        return {"cr": 1.0, "collective": "torch_allreduce", "bytes_sent": self._bytes}

    def close(self) -> None:
        pass


class PowerSGDSync:
    """PyTorch's `powerSGD_hook` as a user would add it: low rank, error feedback,
    warm start, a few dense iterations first."""

    def __init__(self, ddp: DistributedDataParallel, grad_bytes: int) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        self._state = psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=POWERSGD_START_ITER, use_error_feedback=True, warm_start=True,
        )
        ddp.register_comm_hook(self._state, psgd.powerSGD_hook)
        self._dense_bytes = grad_bytes
        self._compressed_bytes = _powersgd_bytes(ddp, POWERSGD_RANK)

    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        if step < POWERSGD_START_ITER:
            return {"cr": 1.0, "collective": "dense_ring", "bytes_sent": self._dense_bytes}
        return {
            "cr": self._compressed_bytes / self._dense_bytes,
            "collective": "powersgd",
            "bytes_sent": self._compressed_bytes,
        }

    def close(self) -> None:
        pass


def _powersgd_bytes(ddp: DistributedDataParallel, rank: int) -> int:
    """Bytes PowerSGD AllReduces per step: P and Q for each matrix it compresses,
    the tensor itself for the rest (vectors, and matrices too small to pay),
    following powerSGD_hook's own rule (min_compression_rate = 2)."""
    total = 0
    for p in ddp.module.parameters():
        size = p.element_size()
        if p.dim() < 2:
            total += p.numel() * size
            continue
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, rank)
        compressed = (n + m) * r
        total += (compressed if n * m >= 2 * compressed else n * m) * size
    return total
