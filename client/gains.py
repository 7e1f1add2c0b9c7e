"""Compression gain: the share of a compensated gradient's squared norm an option
would send, ||g_c||^2 / ||g_e||^2, read for every candidate off one gradient.

- Top-k at CR c: the mass of the k = cM largest entries (`topk_masses`: one
  selection of the largest k, then nested top-k's of what it selected).
- PowerSGD at rank r: the mass of the best rank-r approximation of each matrix
  PowerSGD compresses at r (the sum of its r largest squared singular values,
  from a randomised range finder with one power iteration and a private
  generator, so the training's random streams are untouched), plus the tensors
  it sends dense at r whole. A warm-started PowerSGD converges to that subspace.

Everything is computed on the gradient's device without reading a number back:
`probe_gains` returns a `ProbedGains` whose tensors travel to the host with no
one waiting (client/device.py); the host finishes there (the small q x q
eigenvalue problems of the range finder: an SVD on a GPU checks its result on
the host, which waits). `merge_masses` combines per-bucket readings into
whole-gradient gains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from flexcomm.client.device import Later
from flexcomm.client.selection import check_flat, k_for, make_selector
from flexcomm.policy.costmodel import powersgd_compresses
from flexcomm.policy.types import POWERSGD, TOPK, Compression

OVERSAMPLE = 4  # extra directions of the range finder beyond the largest rank

Finish = Callable[[list[torch.Tensor]], Any]  # host tensors -> what they mean


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


def range_gram(m: torch.Tensor, rank: int, generator: torch.Generator) -> torch.Tensor:
    """B B^T (float64, q x q) for B = Q^T m, Q an orthonormal basis of m's
    leading q >= rank directions: its eigenvalues approximate the squared
    singular values of m from the largest down."""
    n, cols = m.shape
    q = min(rank + OVERSAMPLE, n, cols)
    m32 = m.float()
    omega = torch.randn(cols, q, generator=generator, device=m.device)
    basis, _ = torch.linalg.qr(m32 @ omega)
    basis, _ = torch.linalg.qr(m32 @ (m32.T @ basis))  # one power iteration
    b = (basis.T @ m32).double()
    return b @ b.T


def top_eigenvalues(gram: torch.Tensor, count: int) -> list[float]:
    """The `count` largest eigenvalues of a symmetric PSD host matrix, largest first."""
    values = torch.linalg.eigvalsh(gram.double()).clamp(min=0.0).flip(0)
    return values[:count].tolist()


def powersgd_masses(g: torch.Tensor, shapes: Sequence[torch.Size], ranks: Sequence[int],
                    generator: torch.Generator) -> tuple[list[torch.Tensor], Finish]:
    """For each rank, the mass PowerSGD at that rank would send of flat `g`, whose
    tensors have `shapes` in order (what does not fit a shape is sent dense):
    the device tensors to read, and the host function that finishes them."""
    tensors: list[torch.Tensor] = []
    plan: list[list[int] | None] = []  # per tensor read: ranks used on a matrix's gram, None for a whole norm
    offset = 0
    for shape in shapes:
        numel = int(torch.Size(shape).numel())
        part = g[offset : offset + numel]
        offset += numel
        tensors.append(squared_norm(part))
        plan.append(None)
        if len(shape) < 2 or numel == 0:
            continue
        matrix = part.view(shape[0], -1)
        used = [powersgd_compresses(matrix.shape[0], matrix.shape[1], r) for r in ranks]
        if max(used):
            tensors.append(range_gram(matrix, max(used), generator))
            plan.append(used)
    if offset < g.numel():
        tensors.append(squared_norm(g[offset:]))
        plan.append(None)

    def finish(host: list[torch.Tensor]) -> list[float]:
        masses = [0.0] * len(ranks)
        whole = 0.0
        for value, used in zip(host, plan, strict=True):
            if used is None:
                whole = float(value)
                masses = [acc + whole for acc in masses]
                continue
            singular = top_eigenvalues(value, max(used))
            # The whole norm was added for every rank; a rank that factors this matrix sends its top r instead.
            masses = [acc - whole + sum(singular[:r]) if r else acc for acc, r in zip(masses, used, strict=True)]
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
                select, generator: torch.Generator) -> ProbedGains:
    """The gain each probed compression would have on `g_e` (||g_e||^2 = norm, a
    0-dim tensor on its device)."""
    probes = list(probes)
    topk = [c for c in probes if c.family == TOPK]
    ranks = [c for c in probes if c.family == POWERSGD]
    tensors = [norm.reshape(1).double(), topk_masses(g_e, [k_for(g_e.numel(), c.param) for c in topk], select)]
    psgd_tensors, psgd_finish = powersgd_masses(g_e, shapes, [c.rank for c in ranks], generator) if ranks else (
        [], lambda host: [])

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
