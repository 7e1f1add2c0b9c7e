"""How a lab rank synchronises gradients: the flexcomm DDP hook driven by a named
policy, or PyTorch's own hooks (PowerSGD, bf16 compression, post-local SGD;
plain DDP AllReduce) to compare with.

`attach_sync(ddp, cfg, rank, grad_bytes)` registers the method on the DDP model
and returns a `SyncMethod` whose `after_step` gives the step's record fields:
compression, cr (the share of a dense step's bytes), collective, bytes_sent,
and for the flexcomm hook t_sync_s, t_comp_s and the decision's version, reason,
exploring flag and predicted sync time. bytes_sent is the payload
this rank contributes to the step's collectives (the message size M of the cost
model, as the flexcomm hook counts it), not what the ring forwards on the wire.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch.nn.parallel import DistributedDataParallel

POWERSGD_START_ITER = 10
LOCALSGD_START_ITER = 10  # global AllReduce steps before local SGD starts (as PowerSGD's)


class SyncMethod(Protocol):
    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        """Record fields for the step that just ran."""

    def close(self) -> None:
        """Stop background work (agent client threads)."""


def attach_sync(ddp: DistributedDataParallel, cfg: Any, rank: int, grad_bytes: int) -> SyncMethod:
    if cfg.policy == "powersgd":
        return PowerSGDSync(ddp, grad_bytes, cfg.policy_options["rank"])
    if cfg.policy == "bf16":
        return Bf16Sync(ddp, grad_bytes)
    if cfg.policy == "allreduce":
        return TorchAllReduceSync(grad_bytes)
    if cfg.policy == "localsgd":
        return PostLocalSGDSync(ddp, grad_bytes, cfg.policy_options["period"])
    from flexcomm.lab.flexsync import FlexcommSync

    return FlexcommSync(ddp, cfg, rank, grad_bytes)


class TorchAllReduceSync:
    """DDP's built-in AllReduce (no hook registered)."""

    def __init__(self, grad_bytes: int) -> None:
        self._bytes = grad_bytes

    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        return {"compression": "dense", "cr": 1.0, "collective": "torch_allreduce",
                "bytes_sent": self._bytes}

    def close(self) -> None:
        pass


def _gloo_bf16_compress_hook(state, bucket):
    """PyTorch's `bf16_compress_hook` under another name. DDP refuses that name
    unless CUDA and NCCL are there (this machine has neither); gloo AllReduces
    bfloat16 all the same, so the lab runs PyTorch's hook unchanged on it.
    Unannotated: DDP compares a hook's annotations with the real classes, and
    this module's are strings."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    return bf16_compress_hook(state, bucket)


class Bf16Sync:
    """PyTorch's `bf16_compress_hook`: the gradient cast to bfloat16, AllReduced, cast back."""

    def __init__(self, ddp: DistributedDataParallel, grad_bytes: int) -> None:
        ddp.register_comm_hook(None, _gloo_bf16_compress_hook)
        self._bytes = grad_bytes // 2

    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        return {"compression": "bf16", "cr": 0.5, "collective": "bf16_allreduce",
                "bytes_sent": self._bytes}

    def close(self) -> None:
        pass


class PowerSGDSync:
    """PyTorch's `powerSGD_hook` as a user would add it: low rank, error feedback,
    warm start, a few dense iterations first. Tensors of more than two dimensions
    (convolution weights) the hook reshapes to matrices itself."""

    def __init__(self, ddp: DistributedDataParallel, grad_bytes: int, rank: int) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        self._state = psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank,
            start_powerSGD_iter=POWERSGD_START_ITER, use_error_feedback=True, warm_start=True,
        )
        ddp.register_comm_hook(self._state, psgd.powerSGD_hook)
        self._dense_bytes = grad_bytes
        self._compressed_bytes = _powersgd_bytes(ddp, rank)
        self._compression = f"powersgd:{rank}"

    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        if step < POWERSGD_START_ITER:
            return {"compression": "dense", "cr": 1.0, "collective": "dense_ring",
                    "bytes_sent": self._dense_bytes}
        return {
            "compression": self._compression,
            "cr": self._compressed_bytes / self._dense_bytes,
            "collective": "powersgd",
            "bytes_sent": self._compressed_bytes,
        }

    def close(self) -> None:
        pass


class PostLocalSGDSync:
    """PyTorch's post-local SGD as its documentation sets it up: `post_localSGD_hook`
    AllReduces gradients globally for LOCALSGD_START_ITER steps, then only within
    each node's subgroup (one rank per lab node, so nothing crosses the network),
    and a `PeriodicModelAverager` AllReduces the parameters every `period` steps
    after the optimizer step (here: in `after_step`, which the trainer calls then)."""

    def __init__(self, ddp: DistributedDataParallel, grad_bytes: int, period: int) -> None:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as local
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        subgroup, _ = dist.new_subgroups(group_size=1)  # a node's ranks: one per lab node
        state = local.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                        start_localSGD_iter=LOCALSGD_START_ITER)
        ddp.register_comm_hook(state, local.post_localSGD_hook)
        self._averager = PeriodicModelAverager(period=period, warmup_steps=LOCALSGD_START_ITER)
        self._params = list(ddp.module.parameters())
        self._bytes = grad_bytes
        self._compression = f"localsgd:{period}"

    def after_step(self, step: int, epoch: int) -> dict[str, Any]:
        averages = self._averager.step >= LOCALSGD_START_ITER and (
            self._averager.step - LOCALSGD_START_ITER) % self._averager.period == 0
        self._averager.average_parameters(self._params)
        if step < LOCALSGD_START_ITER:
            return {"compression": "dense", "cr": 1.0, "collective": "dense_ring",
                    "bytes_sent": self._bytes}
        return {"compression": self._compression, "cr": (1.0 if averages else 0.0),
                "collective": "model_average" if averages else "local",
                "bytes_sent": self._bytes if averages else 0}

    def close(self) -> None:
        pass


def _powersgd_bytes(ddp: DistributedDataParallel, rank: int) -> int:
    """Bytes PowerSGD AllReduces per step: P and Q for each matrix it compresses,
    the tensor itself for the rest, by powerSGD_hook's own rule (the cost model's)."""
    from flexcomm.client.layout import layout_of
    from flexcomm.policy.costmodel import powersgd_split

    layout = layout_of(ddp.module)
    split = powersgd_split(layout, rank)
    return (split.dense_values + split.p_values + split.q_values) * layout.value_bytes
