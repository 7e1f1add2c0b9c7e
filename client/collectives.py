"""The collectives the client runs, each averaging (not summing) over the group.

- dense Ring: `dist.all_reduce` (gloo and NCCL both run a ring for large messages).
- dense Tree: on gloo a binomial-tree reduce + broadcast built from point-to-point
  send/recv (log2 N rounds each way); on NCCL `all_reduce` on a second process group
  created with NCCL_ALGO=Tree (see `TreeAllreduce`).
- AG-Topk: `all_gather_into_tensor` (`all_gather_single` from torch 2.13) of every
  rank's k values and k int32 indices,
  then a scatter-add.
- AR-Topk: the root broadcasts its k int32 indices, every rank all-reduces its own
  values at those indices (over the ring or the tree).

Functions that return a `torch.futures.Future` resolve to the output tensor once
the collective and its decompression are done; they never block the caller. The
tree and the AR-Topk index broadcast block (gloo point-to-point has no chaining).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

Future = torch.futures.Future
# torch 2.13 renamed all_gather_into_tensor (now deprecated) to all_gather_single.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def completed(value: torch.Tensor) -> Future:
    fut: Future = torch.futures.Future()
    fut.set_result(value)
    return fut


def group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def ring_allreduce_mean(
    t: torch.Tensor,
    group: dist.ProcessGroup | None,
    on_done: Callable[[float], None] | None = None,
    size: int | None = None,
) -> Future:
    """Average `t` in place over `group`, asynchronously.

    Divides first, then sums: exactly what PyTorch's `allreduce_hook` does, so the
    result is bit-identical to it. `on_done(t_end)` runs when the sum arrived.
    `size` saves looking the group's size up on every call.
    """
    t.div_(size or group_size(group))
    work = dist.all_reduce(t, group=group, async_op=True)

    def done(_fut: Future) -> torch.Tensor:
        if on_done is not None:
            on_done(time.perf_counter())
        return t

    return work.get_future().then(done)


def tree_reduce_(t: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Binomial-tree sum of `t` into group rank 0 (other ranks' `t` is scratch)."""
    n, me = group_size(group), dist.get_rank(group)
    buf = torch.empty_like(t)
    mask = 1
    while mask < n:
        if me & mask:
            dist.send(t, group=group, group_dst=me - mask)
            return
        if me + mask < n:
            dist.recv(buf, group=group, group_src=me + mask)
            t.add_(buf)
        mask <<= 1


def tree_broadcast_(t: torch.Tensor, group: dist.ProcessGroup | None, root: int = 0) -> None:
    """Binomial-tree broadcast of `t` from group rank `root`, in place."""
    n, me = group_size(group), dist.get_rank(group)
    rel = (me - root) % n
    mask = 1
    while mask < n:
        if rel & mask:
            dist.recv(t, group=group, group_src=(rel - mask + root) % n)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if rel + mask < n:
            dist.send(t, group=group, group_dst=(rel + mask + root) % n)
        mask >>= 1


class TreeAllreduce:
    """Sum all-reduce over a tree, for the `*_tree` collectives.

    gloo: binomial reduce to rank 0 then binomial broadcast (point-to-point).
    NCCL: all_reduce on a second process group created while NCCL_ALGO=Tree is set
    and initialised eagerly by one collective, so its communicator picks the tree.
    UNTESTED HERE: this machine has no GPU and no NCCL; only the gloo path is tested.
    Construct it on every rank at the same point (new_group is collective).
    """

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.backend = dist.get_backend(group)
        self.nccl_group: dist.ProcessGroup | None = None
        if self.backend == "nccl":
            self.nccl_group = _nccl_tree_group(group)

    def sum_(self, t: torch.Tensor) -> None:
        if self.nccl_group is not None:
            dist.all_reduce(t, group=self.nccl_group)
            return
        tree_reduce_(t, self.group)
        tree_broadcast_(t, self.group, 0)

    def broadcast_(self, t: torch.Tensor, root: int) -> None:
        if self.nccl_group is not None:
            dist.broadcast(t, group=self.nccl_group, group_src=root)
            return
        tree_broadcast_(t, self.group, root)


def _nccl_tree_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """A second NCCL group over the same ranks whose communicator uses the Tree algorithm.

    NCCL reads NCCL_ALGO when a communicator is created, and PyTorch creates it at
    the group's first collective, so the variable is held until that collective ran.
    UNTESTED HERE (no GPU on this machine).
    """
    ranks = dist.get_process_group_ranks(group) if group is not None else None
    saved = os.environ.get("NCCL_ALGO")
    os.environ["NCCL_ALGO"] = "Tree"
    try:
        tree = dist.new_group(ranks=ranks, backend="nccl")
        warm = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(warm, group=tree)
        torch.cuda.synchronize()
    finally:
        if saved is None:
            os.environ.pop("NCCL_ALGO", None)
        else:
            os.environ["NCCL_ALGO"] = saved
    return tree


def tree_allreduce_mean(t: torch.Tensor, tree: TreeAllreduce) -> Future:
    """Average `t` in place over the tree (blocking); returns a completed future."""
    t.div_(group_size(tree.group))
    tree.sum_(t)
    return completed(t)


def ag_topk_mean(
    values: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    group: dist.ProcessGroup | None,
    on_scatter: Callable[[float, float], None] | None = None,
) -> Future:
    """AllGather every rank's (values, int32 indices) and scatter-add them into `out`.

    `values` must already be divided by the group size; every rank must send the
    same k. `out` is overwritten with the average (zeros where no rank sent).
    `on_scatter(t_begin, t_end)` is told when the scatter-add ran (perf_counter).
    """
    n = group_size(group)
    # One AllGather of (values, indices) packed as bytes, not one each: every
    # collective call costs gloo and Python a few handoffs between threads, which
    # on a busy CPU is most of a small AG-Topk's time.
    value_bytes = values.numel() * values.element_size()
    packed = torch.cat([values.reshape(-1).view(torch.uint8), indices.reshape(-1).view(torch.uint8)])
    gathered = packed.new_empty(n * packed.numel())
    work = _all_gather_flat(gathered, packed, group=group, async_op=True)

    def scatter(_fut: Future) -> torch.Tensor:
        # Read the gathered tensor we passed in: the future's value is not it.
        t0 = time.perf_counter()
        per_rank = gathered.view(n, -1)
        all_values = per_rank[:, :value_bytes].contiguous().view(values.dtype).reshape(-1)
        all_indices = per_rank[:, value_bytes:].contiguous().view(indices.dtype).reshape(-1)
        out.zero_()
        out.index_add_(0, all_indices, all_values)
        if on_scatter is not None:
            on_scatter(t0, time.perf_counter())
        return out

    return work.get_future().then(scatter)


def broadcast_indices(
    indices: torch.Tensor, root: int, group: dist.ProcessGroup | None, tree: TreeAllreduce | None
) -> None:
    """AR-Topk's first half: everyone receives the root's indices (blocking)."""
    if tree is None:
        dist.broadcast(indices, group=group, group_src=root)
    else:
        tree.broadcast_(indices, root)


def ar_values_mean(
    values: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    group: dist.ProcessGroup | None,
    tree: TreeAllreduce | None,
    on_scatter: Callable[[float, float], None] | None = None,
) -> Future:
    """AR-Topk's second half: sum `values` (already divided by N) at the shared
    `indices` over the ring (tree None, async) or the tree (blocking), then write
    them into `out`, zero elsewhere."""

    def scatter(_fut: Future | None = None) -> torch.Tensor:
        t0 = time.perf_counter()
        out.zero_()
        out[indices] = values
        if on_scatter is not None:
            on_scatter(t0, time.perf_counter())
        return out

    if tree is not None:
        tree.sum_(values)
        return completed(scatter())
    work = dist.all_reduce(values, group=group, async_op=True)
    return work.get_future().then(scatter)


def agree_argmax(local: float, group: dist.ProcessGroup | None) -> int:
    """The group rank with the largest `local` (lowest rank on ties), agreed by
    one tiny all-reduce. Used to pick VAR-Topk's root."""
    from flexcomm.client.agreement import control_device

    n, me = group_size(group), dist.get_rank(group)
    slots = torch.zeros(n, dtype=torch.float64)
    slots[me] = local
    slots = slots.to(control_device(group))
    dist.all_reduce(slots, group=group)
    return int(torch.argmax(slots))
