"""The communicators: how each collective moves a step's payload across the group.

A collective names a transport, and a compressor (client/compressors/) says what
the payload is:

| collective           | transport | what moves                                      |
|----------------------|-----------|-------------------------------------------------|
| dense_ring, art_ring | `Ring`    | `dist.all_reduce` (a ring for large messages)   |
| ag_topk              | `Ring`    | one `all_gather` of every rank's packed payload |
| dense_tree, art_tree | `Tree`    | a binomial-tree reduce + broadcast              |

`Tree` on gloo is built from send/recv (log2 N rounds each way); on NCCL it is
`all_reduce` on a second group made with NCCL_ALGO=Tree.

AR-Topk broadcasts the root's indices over its transport (`broadcast`), then
all-reduces the values at them. Every `allreduce_mean` divides first, then sums,
as PyTorch's `allreduce_hook` does (so dense_ring is bit-identical to it).

Futures resolve once the data has arrived; the ring's never block the caller.
gloo's point-to-point has no chaining, so the tree and every broadcast block.
gloo cannot send CUDA tensors point to point: the tree stages them through host
memory on gloo (NCCL sends them as they are).
"""

from __future__ import annotations

import os
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


class Ring:
    """The group's own collectives: all_reduce, broadcast, all_gather."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def allreduce_mean(self, t: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> Future:
        """Average `t` in place over the group, asynchronously; the future holds
        then(t), run once the sum arrived."""
        t.div_(self.size)
        work = dist.all_reduce(t, group=self.group, async_op=True)
        return work.get_future().then(lambda _fut: then(t))

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        dist.broadcast(t, group=self.group, group_src=root)

    def allgather(self, t: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor]) -> Future:
        """Every rank's `t` (same size everywhere) into one tensor of size*numel,
        asynchronously; the future holds then(gathered)."""
        gathered = t.new_empty(self.size * t.numel())
        work = _all_gather_flat(gathered, t, group=self.group, async_op=True)
        # Read the tensor we passed in: the work's own future value is not it.
        return work.get_future().then(lambda _fut: then(gathered))


class Tree(Ring):
    """Sum all-reduce and broadcast over a binomial tree (see the module docstring).
    Construct it on every rank at the same point (on NCCL, new_group is collective)."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        super().__init__(group)
        self.backend = dist.get_backend(group)
        self.nccl_group = _nccl_tree_group(group) if self.backend == "nccl" else None

    def allreduce_mean(self, t: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> Future:
        """Average `t` in place over the tree (blocking); a completed future of then(t)."""
        t.div_(self.size)
        if self.nccl_group is not None:
            dist.all_reduce(t, group=self.nccl_group)
        else:
            with _on_host(t) as host:
                tree_reduce_(host, self.group)
                tree_broadcast_(host, self.group, 0)
        return completed(then(t))

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        if self.nccl_group is not None:
            dist.broadcast(t, group=self.nccl_group, group_src=root)
            return
        with _on_host(t) as host:
            tree_broadcast_(host, self.group, root)


class _on_host:
    """`t` itself when it is in host memory, else a host copy written back on exit
    (gloo's send/recv take host tensors only)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.host = t.to("cpu") if t.device.type != "cpu" else t

    def __enter__(self) -> torch.Tensor:
        return self.host

    def __exit__(self, *exc: object) -> None:
        if self.host is not self.t:
            self.t.copy_(self.host)


def tree_reduce_(t: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Binomial-tree sum of `t` into group rank 0 (other ranks' `t` is scratch)."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
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
    n, me = dist.get_world_size(group), dist.get_rank(group)
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


def _nccl_tree_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """A second NCCL group over the same ranks whose communicator uses the Tree algorithm.

    NCCL reads NCCL_ALGO when a communicator is created, and PyTorch creates it at
    the group's first collective, so the variable is held until that collective ran.
    Not run on this project's CI (no GPU there).
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


def agree_argmax(local: float, group: dist.ProcessGroup | None) -> int:
    """The group rank with the largest `local` (lowest rank on ties), agreed by
    one tiny all-reduce. Used to pick VAR-Topk's root."""
    from flexcomm.client.agreement import control_device

    n, me = dist.get_world_size(group), dist.get_rank(group)
    slots = torch.zeros(n, dtype=torch.float64)
    slots[me] = local
    slots = slots.to(control_device(group))
    dist.all_reduce(slots, group=group)
    return int(torch.argmax(slots))
