"""Compression gain: the share of a compensated gradient's squared norm an option
would send, ||g_c||^2 / ||g_e||^2, read for every candidate off one gradient.

- Top-k at CR c: the mass of the k = cM largest entries (`topk_masses`: one
  selection of the largest k, then nested top-k's of what it selected).
- PowerSGD at rank r: the mass of the best rank-r approximation of each matrix
  PowerSGD compresses at r (the sum of its r largest squared singular values,
  from a randomised range finder with one power iteration and a private
  generator, so the training's random streams are untouched), plus the tensors
  it sends dense at r whole. A warm-started PowerSGD converges to that subspace.

`probe_gains` reads them all for one flat gradient; `merge_masses` combines
per-bucket readings into whole-gradient gains.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from flexcomm.client.selection import FastSelector, check_flat, k_for
from flexcomm.policy.costmodel import powersgd_compresses
from flexcomm.policy.types import POWERSGD, TOPK, Compression

OVERSAMPLE = 4  # extra directions of the range finder beyond the largest rank


def squared_norm(x: torch.Tensor) -> float:
    """||x||^2 accumulated in float64."""
    x = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
    return float(torch.dot(x, x).double())


def topk_masses(g: torch.Tensor, ks: Sequence[int], select=None) -> list[float]:
    """Exact sum of the k largest squared magnitudes of `g`, for each k in `ks`.

    One selection of the largest max(ks) entries (`select`, default a new
    FastSelector), then for each smaller k the top k of the previous set: the
    sizes shrink geometrically, so this costs about one selection, far less than
    sorting the gradient.
    """
    check_flat(g)
    if not ks:
        return []
    kmax = max(ks)
    select = select if select is not None else FastSelector()
    idx = select(g, kmax) if kmax < g.numel() else torch.arange(g.numel(), device=g.device)
    top = g[idx].float().pow(2)
    masses: dict[int, float] = {}
    for k in sorted(set(ks), reverse=True):
        if k < top.numel():
            top = torch.topk(top, k, sorted=False).values
        masses[k] = float(top.sum(dtype=torch.float64))
    return [masses[k] for k in ks]


def top_singular_masses(m: torch.Tensor, rank: int, generator: torch.Generator) -> list[float]:
    """Approximate squared singular values s_1^2 >= ... >= s_rank^2 of matrix `m`."""
    n, cols = m.shape
    q = min(rank + OVERSAMPLE, n, cols)
    m32 = m.float()
    omega = torch.randn(cols, q, generator=generator).to(m32.device)
    basis, _ = torch.linalg.qr(m32 @ omega)
    basis, _ = torch.linalg.qr(m32 @ (m32.T @ basis))  # one power iteration
    s = torch.linalg.svdvals(basis.T @ m32)
    return [float(v) ** 2 for v in s[:rank]]


def powersgd_masses(g: torch.Tensor, shapes: Sequence[torch.Size], ranks: Sequence[int],
                    generator: torch.Generator) -> list[float]:
    """For each rank, the mass PowerSGD at that rank would send of flat `g`, whose
    tensors have `shapes` in order (what does not fit a shape is sent dense)."""
    masses = [0.0] * len(ranks)
    offset = 0
    for shape in shapes:
        numel = int(torch.Size(shape).numel())
        part = g[offset : offset + numel]
        offset += numel
        whole = squared_norm(part)
        if len(shape) < 2 or numel == 0:
            masses = [acc + whole for acc in masses]
            continue
        matrix = part.view(shape[0], -1)
        used = [powersgd_compresses(matrix.shape[0], matrix.shape[1], r) for r in ranks]
        singular = top_singular_masses(matrix, max(used), generator) if max(used) else []
        masses = [acc + (sum(singular[:r]) if r else whole) for acc, r in zip(masses, used, strict=True)]
    rest = squared_norm(g[offset:]) if offset < g.numel() else 0.0
    return [acc + rest for acc in masses]


def probe_gains(g_e: torch.Tensor, shapes: Sequence[torch.Size], probes: Iterable[Compression], norm: float,
                select, generator: torch.Generator) -> dict[str, float]:
    """The gain each probed compression would have on `g_e` (||g_e||^2 = norm)."""
    probes = list(probes)
    if norm <= 0.0:
        return {c.name: 1.0 for c in probes}
    topk = [c for c in probes if c.family == TOPK]
    ranks = [c for c in probes if c.family == POWERSGD]
    masses = dict(zip([c.name for c in topk], topk_masses(g_e, [k_for(g_e.numel(), c.param) for c in topk], select),
                      strict=True))
    if ranks:
        found = powersgd_masses(g_e, shapes, [c.rank for c in ranks], generator)
        masses.update(zip([c.name for c in ranks], found, strict=True))
    return {name: min(1.0, m / norm) for name, m in masses.items()}


def merge_masses(parts: Iterable[tuple[dict[str, float], float]]) -> dict[str, float]:
    """Combine per-bucket gains (each with its ||g_e||^2) into whole-gradient gains."""
    mass: dict[str, float] = {}
    total = 0.0
    for gains, norm in parts:
        total += norm
        for name, gain in gains.items():
            mass[name] = mass.get(name, 0.0) + gain * norm
    return {name: (min(1.0, m / total) if total > 0 else 1.0) for name, m in mass.items()}
