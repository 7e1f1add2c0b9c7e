"""Top-k selection: the indices of the k entries of largest magnitude.

Indices are always int32 (half the bytes of the int64 that `torch.topk` returns),
so a flat gradient must have fewer than 2**31 elements.

Two selectors, both returning the indices of exactly k entries of largest
magnitude:

- `select_exact`: `torch.topk` over `|g|`.
- `select_fast`: a threshold from a random sample of `|g|`, set low enough that at
  least k entries pass it with overwhelming probability; then the exact top-k among
  those candidates. Whenever at least k entries pass, the result is the exact
  top-k (every top-k entry is >= the k-th largest >= the threshold); when fewer
  pass, it falls back to `select_exact`. So "fast" trades nothing but time.
"""

from __future__ import annotations

import math

import torch

from flexcomm.policy.types import check_cr

SELECTORS: tuple[str, ...] = ("exact", "fast")

# Below this many elements a sample buys nothing: torch.topk is already cheap.
_FAST_MIN_NUMEL = 1 << 16
# Above this fraction selected, the candidate set is most of the tensor.
_FAST_MAX_CR = 0.25
_SAMPLE_SIZE = 1 << 18
# Sample order statistic margin, in standard deviations of the sampled count.
_MARGIN_SIGMAS = 4.0
_INT32_MAX = 2**31 - 1


def check_selector(name: str, field_name: str = "selector") -> str:
    if name not in SELECTORS:
        raise ValueError(f"{field_name}: unknown selector {name!r} (one of exact, fast)")
    return name


def k_for(numel: int, cr: float) -> int:
    """How many entries a CR keeps of `numel`: round(cr * numel), at least 1."""
    check_cr(cr)
    return min(numel, max(1, round(cr * numel)))


def check_flat(g: torch.Tensor) -> None:
    if g.dim() != 1:
        raise ValueError(f"gradient: expected a flat (1-D) tensor, got shape {tuple(g.shape)}")
    if g.numel() > _INT32_MAX:
        raise ValueError(f"gradient: {g.numel()} elements do not fit int32 indices")


def select_exact(g: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int32) of the k entries of largest magnitude, via torch.topk."""
    check_flat(g)
    return torch.topk(g.abs(), k, sorted=False).indices.to(torch.int32)


class FastSelector:
    """Sampled-threshold Top-k; exact whenever the sample threshold admits >= k.

    Holds a scratch buffer for |g| and a private random generator (seeded, so
    runs repeat). `fallbacks` counts the calls that had to use torch.topk.
    """

    def __init__(self, seed: int = 0, sample_size: int = _SAMPLE_SIZE) -> None:
        self._gen = torch.Generator().manual_seed(seed)
        self._sample_size = sample_size
        self._abs: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self.calls = 0
        self.fallbacks = 0

    def _scratch(self, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = g.numel()
        if self._abs is None or self._abs.numel() < n or self._abs.dtype != g.dtype or (
            self._abs.device != g.device
        ):
            self._abs = torch.empty(n, dtype=g.dtype, device=g.device)
            self._mask = torch.empty(n, dtype=torch.bool, device=g.device)
        assert self._mask is not None
        return self._abs[:n], self._mask[:n]

    def __call__(self, g: torch.Tensor, k: int) -> torch.Tensor:
        check_flat(g)
        n = g.numel()
        self.calls += 1
        if n < _FAST_MIN_NUMEL or k > _FAST_MAX_CR * n:
            return select_exact(g, k)
        threshold = self._sample_threshold(g, k)
        if threshold is None:
            self.fallbacks += 1
            return select_exact(g, k)
        absg, mask = self._scratch(g)
        torch.abs(g, out=absg)
        torch.ge(absg, threshold, out=mask)
        cand = mask.nonzero().squeeze(1)
        if cand.numel() < k:
            self.fallbacks += 1
            return select_exact(g, k)
        if cand.numel() > k:
            cand = cand[self._keep_largest(absg[cand], k)]
        return cand.to(torch.int32)

    def _keep_largest(self, values: torch.Tensor, k: int) -> torch.Tensor:
        """A mask of exactly the k largest `values`: drop the few smallest.

        Two sampled bounds around the drop boundary: everything below the lower
        one is dropped outright (all of it lies among the smallest), and only the
        narrow band between the bounds is ranked. Falls back to ranking all.
        """
        n, drop = values.numel(), values.numel() - k
        s = min(self._sample_size // 4, n)
        sample = values[torch.randint(n, (s,), generator=self._gen).to(values.device)]
        expected = drop / n * s
        spread = _MARGIN_SIGMAS * math.sqrt(expected) + _MARGIN_SIGMAS
        lo, hi = math.floor(expected - spread), math.ceil(expected + spread)
        if lo >= 1 and hi < s:
            ordered = torch.sort(sample).values
            low = values < ordered[lo - 1]
            band = (values < ordered[hi]).logical_xor_(low).nonzero().squeeze(1)
            need = drop - int(low.sum())
            if 0 <= need <= band.numel():
                keep = low.logical_not_()
                smallest = torch.topk(values[band], need, largest=False, sorted=False).indices
                keep[band[smallest]] = False
                return keep
        keep = torch.ones(n, dtype=torch.bool, device=values.device)
        keep[torch.topk(values, drop, largest=False, sorted=False).indices] = False
        return keep

    def _sample_threshold(self, g: torch.Tensor, k: int) -> torch.Tensor | None:
        n = g.numel()
        s = min(self._sample_size, n)
        pos = torch.randint(n, (s,), generator=self._gen).to(g.device)
        sample = g[pos].abs()
        expected = k / n * s
        j = math.ceil(expected + _MARGIN_SIGMAS * math.sqrt(expected) + _MARGIN_SIGMAS)
        if j >= s:
            return None
        return torch.topk(sample, j, sorted=False).values.min()


def make_selector(name: str, seed: int = 0):
    """A callable (g, k) -> int32 indices for selector `name` ("exact" or "fast")."""
    check_selector(name)
    return select_exact if name == "exact" else FastSelector(seed=seed)
