"""Compression gain: the share of a compensated gradient's squared norm an option
would send, ||g_c||^2 / ||g_e||^2, read for every candidate off one gradient.

- Top-k at CR c: the mass of the k = cM largest entries (`topk_masses`: one
  selection of the largest k, then nested top-k's of what it selected).
- PowerSGD at rank r: what one PowerSGD iteration sends of each matrix it
  compresses at r, ||P P^T M||^2 with P = orth(M Q), Q warm-started from the
  last probe of the same bucket, matrix and rank (`WarmFactors`, the store the
  compressor keeps its Q in too, checkpointed with the job; random factors the
  first time, from a private generator, so the training's random streams are
  untouched), plus the tensors it sends dense at r whole.

Everything is computed on the gradient's device without reading a number back:
`probe_gains` returns a `ProbedGains` whose tensors travel to the host with no
one waiting (client/device.py); the host finishes there (sums of a few
numbers). `merge_masses` combines per-bucket readings into whole-gradient gains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize_gram_schmidt

from flexcomm.client.device import Later
from flexcomm.client.selection import check_flat, k_for, make_selector
from flexcomm.policy.costmodel import powersgd_compresses
from flexcomm.policy.types import POWERSGD, TOPK, Compression

Finish = Callable[[list[torch.Tensor]], Any]  # host tensors -> what they mean

# Added to each column norm when orthogonalising: a column of zeros (a gradient
# that vanished) would otherwise divide by zero.
ORTHOGONALIZE_EPSILON = 1e-8


def squared_norm(x: torch.Tensor) -> torch.Tensor:
    """||x||^2 of a flat tensor, a 0-dim float64 tensor on its device (fp16/bf16 summed in fp32)."""
    x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return torch.dot(x, x).double()


def topk_masses(g: torch.Tensor, ks: Sequence[int], select=None) -> torch.Tensor:
    """Exact sum of the k largest squared magnitudes of `g`, for each k in `ks`
    (float64, on g's device).

    One selection of the largest max(ks) entries (`select`, default a new "auto"
    selector), then for each smaller k the top k of the previous set: the sizes
    shrink geometrically, so this costs about one selection, far less than
    sorting the gradient.
    """
    check_flat(g)
    if not ks:
        return torch.zeros(0, dtype=torch.float64, device=g.device)
    kmax = max(ks)
    select = select if select is not None else make_selector("auto")
    top = (g[select(g, kmax)] if kmax < g.numel() else g).float().pow(2)
    masses: dict[int, torch.Tensor] = {}
    for k in sorted(set(ks), reverse=True):
        if k < top.numel():
            top = torch.topk(top, k, sorted=False).values
        masses[k] = top.sum(dtype=torch.float64)
    return torch.stack([masses[k] for k in ks])


class WarmFactors:
    """PowerSGD's warm start: the Q each key ended its last iteration with, so
    each iteration starts where the last one ended. The compressor keeps the
    group's Q per (bucket, rank), flat over the bucket's matrices; the probes
    (rank 0 alone, so apart from the Q every rank shares) theirs per (bucket,
    matrix, rank): one more iteration from a warm Q is what PowerSGD sends (the
    best rank-r SVD the probes read before held PowerSGD rank 1 at 0.24-0.53
    while its steps delivered 0.021-0.055). Both go into the job's checkpoint."""

    def __init__(self) -> None:
        self.q: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """The kept Q for `key` on `device`, flat; None when there is none or it no longer fits."""
        kept = self.q.get(key)
        if kept is None or kept.numel() != numel or kept.dtype != dtype:
            return None
        return kept.to(device)

    def keep(self, key: tuple, q: torch.Tensor) -> None:
        self.q[key] = q.detach().reshape(-1)

    def state_dict(self) -> dict[str, Any]:
        return {"q": {k: v.clone() for k, v in self.q.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q = {tuple(k): v.clone() for k, v in state.get("q", {}).items()}


def powersgd_mass(m: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One PowerSGD iteration on matrix `m` from `q` (cols x r): P = orth(m q),
    Q' = m^T P. Returns (||P P^T m||^2 = ||Q'||^2 as a 0-dim float64 tensor, Q').
    P is orthogonalised by PyTorch's Gram-Schmidt at every rank (its
    `_orthogonalize` takes a QR above rank 2, which on a GPU may wait for the
    host); either gives the same projection."""
    m32 = m.float()
    p = m32 @ q.float()
    _orthogonalize_gram_schmidt(p.unsqueeze(0), ORTHOGONALIZE_EPSILON)
    q_next = m32.T @ p
    return squared_norm(q_next.reshape(-1)), q_next


def powersgd_masses(g: torch.Tensor, shapes: Sequence[torch.Size], ranks: Sequence[int],
                    generator: torch.Generator, warm: WarmFactors | None = None,
                    key: object = None) -> tuple[list[torch.Tensor], Finish]:
    """For each rank, the mass PowerSGD at that rank would send of flat `g`, whose
    tensors have `shapes` in order (what does not fit a shape is sent dense):
    the device tensors to read, and the host function that finishes them. Each
    compressed matrix's mass is one PowerSGD iteration warm-started from `warm`
    (a fresh `WarmFactors` starts from random factors, as PowerSGD's first step)."""
    warm = warm if warm is not None else WarmFactors()
    tensors: list[torch.Tensor] = []
    plan: list[int | None] = []  # per tensor read: the rank's index for a factored mass, None for a whole norm
    offset = 0
    for i, shape in enumerate(shapes):
        numel = int(torch.Size(shape).numel())
        part = g[offset : offset + numel]
        offset += numel
        tensors.append(squared_norm(part))
        plan.append(None)
        if len(shape) < 2 or numel == 0:
            continue
        matrix = part.view(shape[0], -1)
        for j, rank in enumerate(ranks):
            used = powersgd_compresses(matrix.shape[0], matrix.shape[1], rank)
            if used:
                where = (key, i, rank)
                cols = matrix.shape[1]
                kept = warm.get(where, cols * used, torch.float32, matrix.device)
                q = (kept.view(cols, used) if kept is not None
                     else torch.randn(cols, used, generator=generator, device=matrix.device))
                mass, q = powersgd_mass(matrix, q)
                warm.keep(where, q)
                tensors.append(mass)
                plan.append(j)
    if offset < g.numel():
        tensors.append(squared_norm(g[offset:]))
        plan.append(None)

    def finish(host: list[torch.Tensor]) -> list[float]:
        masses = [0.0] * len(ranks)
        whole = 0.0
        for value, j in zip(host, plan, strict=True):
            if j is None:
                whole = float(value)
                masses = [acc + whole for acc in masses]
            else:  # the whole norm was added for every rank; this one sends its factors' mass instead
                masses[j] += float(value) - whole
        return masses

    return tensors, finish


class ProbedGains:
    """The gains of the probed compressions on one bucket, on their way to the
    host: a `StepStats` pending reading (ready / fold), or `get()` at once."""

    def __init__(self, tensors: list[torch.Tensor], finish: Finish) -> None:
        self.later = Later(tensors)
        self.finish = finish

    def ready(self) -> bool:
        return self.later.ready()

    def get(self) -> tuple[dict[str, float], float]:
        """(gains by name, ||g_e||^2); waits for the device if it has not finished."""
        return self.finish(self.later.get())

    def fold(self, stats: Any) -> None:
        stats.probes.append(self.get())


def probe_gains(g_e: torch.Tensor, shapes: Sequence[torch.Size], probes: Iterable[Compression], norm: torch.Tensor,
                select, generator: torch.Generator, warm: WarmFactors | None = None,
                key: object = None) -> ProbedGains:
    """The gain each probed compression would have on `g_e` (||g_e||^2 = norm, a
    0-dim tensor on its device); PowerSGD's warm-started from `warm` for `key`."""
    probes = list(probes)
    topk = [c for c in probes if c.family == TOPK]
    ranks = [c for c in probes if c.family == POWERSGD]
    tensors = [norm.reshape(1).double(), topk_masses(g_e, [k_for(g_e.numel(), c.param) for c in topk], select)]
    psgd_tensors, psgd_finish = (powersgd_masses(g_e, shapes, [c.rank for c in ranks], generator, warm, key)
                                 if ranks else ([], lambda host: []))

    def finish(host: list[torch.Tensor]) -> tuple[dict[str, float], float]:
        total = float(host[0])
        masses = dict(zip([c.name for c in topk], host[1].tolist(), strict=True))
        masses.update(zip([c.name for c in ranks], psgd_finish(host[2:]), strict=True))
        if total <= 0.0:
            return {c.name: 1.0 for c in probes}, total
        return {name: min(1.0, m / total) for name, m in masses.items()}, total

    return ProbedGains(tensors + psgd_tensors, finish)


def merge_masses(parts: Iterable[tuple[dict[str, float], float]]) -> dict[str, float]:
    """Combine per-bucket gains (each with its ||g_e||^2) into whole-gradient gains."""
    mass: dict[str, float] = {}
    total = 0.0
    for gains, norm in parts:
        total += norm
        for name, gain in gains.items():
            mass[name] = mass.get(name, 0.0) + gain * norm
    return {name: (min(1.0, m / total) if total > 0 else 1.0) for name, m in mass.items()}
