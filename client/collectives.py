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

Futures resolve once the data has arrived; nothing here blocks the caller or
the CUDA stream but where gloo must: the ring's collectives and the NCCL tree
return at once (their callbacks run on streams that wait for the data, as
PyTorch's own hooks chain them), and a broadcast on NCCL only makes the stream
wait. gloo runs its collectives on the host, so a broadcast there waits for the
data, and its point-to-point messages take host tensors only: the tree stages a
CUDA tensor through pinned host memory, waiting on one event for the bucket's
data (not for the whole device), and copies the result back without waiting.
Launching a dependent collective from a callback instead would let ranks issue
collectives in different orders on gloo, whose callbacks run when each
collective completes.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from flexcomm.client.device import Later

Future = torch.futures.Future
# torch 2.13 renamed all_gather_into_tensor (now deprecated) to all_gather_single.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


_unreleased: weakref.WeakSet = weakref.WeakSet()  # callbacks given to futures, until let go of


def chain(fut: Future, fn: Callable[[Future], Any]) -> Future:
    """`fut.then(fn)`, with `fn` remembered until the thread that ran it has let go
    of it (`callbacks_released`)."""
    _unreleased.add(fn)
    return fut.then(fn)


def callbacks_released(timeout_s: float = 1.0) -> bool:
    """Wait, the GIL released, until every callback given to `chain` that has run
    has been let go of (at most `timeout_s`; False if some has not). gloo's worker
    thread lets go of a Python callback right after running it, and that takes
    the GIL: if the interpreter is finalising by then, the thread exits mid-unwind
    and the process aborts (SIGABRT, "terminate called without an active
    exception") after the job is done. A core of that abort shows the thread in
    `Future::markCompleted`, releasing the callback's `PythonFunctionGuard`."""
    deadline = time.monotonic() + timeout_s
    while len(_unreleased):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def new_future(like: torch.Tensor) -> Future:
    """A future for tensors on `like`'s device (on CUDA, its waiters wait on the
    streams its result was set on)."""
    return torch.futures.Future(devices=[like.device]) if like.is_cuda else torch.futures.Future()


def completed(value: torch.Tensor) -> Future:
    fut = new_future(value)
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
        return chain(work.get_future(), lambda _fut: then(t))

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        dist.broadcast(t, group=self.group, group_src=root)

    def allgather(self, t: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor]) -> Future:
        """Every rank's `t` (same size everywhere) into one tensor of size*numel,
        asynchronously; the future holds then(gathered)."""
        gathered = t.new_empty(self.size * t.numel())
        work = _all_gather_flat(gathered, t, group=self.group, async_op=True)
        # Read the tensor we passed in: the work's own future value is not it.
        return chain(work.get_future(), lambda _fut: then(gathered))


class Tree(Ring):
    """Sum all-reduce and broadcast over a binomial tree (see the module docstring).
    Construct it on every rank at the same point (on NCCL, new_group is collective)."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        super().__init__(group)
        self.backend = dist.get_backend(group)
        # On NCCL the tree is the ring's collectives on a group that runs NCCL's Tree algorithm.
        self.nccl = Ring(_nccl_tree_group(group)) if self.backend == "nccl" else None

    def allreduce_mean(self, t: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> Future:
        """Average `t` in place over the tree; a future of then(t) (on gloo, completed:
        its point-to-point messages block)."""
        if self.nccl is not None:
            return self.nccl.allreduce_mean(t, then)
        t.div_(self.size)
        with _on_host(t) as host:
            tree_reduce_(host, self.group)
            tree_broadcast_(host, self.group, 0)
        return completed(then(t))

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        if self.nccl is not None:
            self.nccl.broadcast(t, root)
            return
        with _on_host(t) as host:
            tree_broadcast_(host, self.group, root)


class _on_host:
    """`t` itself when it is in host memory; else a pinned host copy, which the
    host waits for (gloo's send/recv take host tensors only), written back on exit
    without waiting."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.host = t
        if t.device.type != "cpu":
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            arrived = torch.cuda.Event()
            arrived.record()
            arrived.synchronize()

    def __enter__(self) -> torch.Tensor:
        return self.host

    def __exit__(self, *exc: object) -> None:
        if self.host is not self.t:
            self.t.copy_(self.host, non_blocking=True)


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


class ArgmaxAgreement:
    """The group rank with the largest of one number per rank (lowest rank on
    ties): one tiny all-reduce launched now, whose answer is copied to the host as
    soon as it arrives, so that `result()`, asked a step later, finds it there
    instead of waiting on the device. Used to pick VAR-Topk's root."""

    def __init__(self, local: torch.Tensor, group: dist.ProcessGroup | None) -> None:
        n, me = dist.get_world_size(group), dist.get_rank(group)
        slots = torch.zeros(n, dtype=torch.float64, device=local.device)
        slots.select(0, me).copy_(local)
        work = dist.all_reduce(slots, group=group, async_op=True)
        self._winner: Later | None = None

        def fetch(_fut: Future) -> None:
            self._winner = Later([torch.argmax(slots)])

        self._arrived = chain(work.get_future(), fetch)

    def result(self) -> int:
        self._arrived.wait()
        assert self._winner is not None
        return int(self._winner.numbers()[0])
