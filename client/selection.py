"""Top-k selection: the indices of the k entries of largest magnitude.

Indices are always int32 (half the bytes of the int64 that `torch.topk` returns),
so a flat gradient must have fewer than 2**31 elements.

Selectors, each returning the indices of k distinct entries:

- `select_exact`: `torch.topk` over `|g|`.
- `FastSelector` ("fast"): a threshold from a random sample of `|g|`, set low
  enough that at least k entries pass it with overwhelming probability; then the
  exact top-k among those candidates. Whenever at least k entries pass, the result
  is the exact top-k (every top-k entry is >= the k-th largest >= the threshold);
  when fewer pass, it falls back to `select_exact`. So "fast" trades nothing but
  time, but its decisions read counts on the host: on a GPU each one waits for
  the device (2-6x slower than torch.topk on an H100).
- `SyncFreeSelector` ("sync_free"): the same idea with every decision on the
  tensor's device (sample, threshold, a candidate buffer of fixed capacity,
  counts), so nothing in it waits for a GPU; exact unless the candidates miss
  its window (see the class).
- `RadixSelector` ("radix"): radix select by Triton kernels on a GPU
  (`client/radix.py`): three reads of the tensor, nothing read back on the host,
  every entry left out at most 0.8% larger than the smallest chosen; torch.topk
  where it cannot run (no Triton, not float32).
- "auto" (the default): "fast" for tensors in host memory, "radix" on a GPU, each
  from the size where it beat torch.topk (4M values on the host and on an H100).
"""

from __future__ import annotations

import math

import torch

from flexcomm.client.candidates import INDEX_DTYPE, passing
from flexcomm.client.device import Generators
from flexcomm.client.radix import radix_available, radix_topk
from flexcomm.policy.types import check_cr

SELECTORS: tuple[str, ...] = ("auto", "exact", "fast", "sync_free", "radix")

# Below this many elements a sample buys nothing: torch.topk is already cheap.
_FAST_MIN_NUMEL = 1 << 16
# Where "auto" starts sampling on the host: on the 2-core CI machine the sampled
# selector against torch.topk (heavy-tailed input, three CRs) ran 0.7-1.2x at 1M
# values, 0.9-1.9x at 2M, 1.3-2.4x at 4M, and slower than torch.topk on the lab
# models' whole gradients (0.3 and 0.8M values).
_AUTO_HOST_MIN_NUMEL = 1 << 22
# Where "auto" starts the radix select on a GPU (torch.topk there waits for nothing
# either): on an H100 the radix pipeline against the exact one ran 0.86-0.99x at
# 1M, 0.95-0.98x at 2M, 1.06-1.14x at 4M, 1.19-1.27x at 6.25M (DDP's default
# 25 MB bucket), 1.46-1.60x at 8M and 1.68-2.05x at 16-32M; below ~12M its ~10
# launches, not its reads, set its time (0.19-0.21 ms flat).
_AUTO_DEVICE_MIN_NUMEL = 1 << 22
# Above this fraction selected, the candidate set is most of the tensor.
_FAST_MAX_CR = 0.25
_SAMPLE_SIZE = 1 << 18
# Sample order statistic margin, in standard deviations of the sampled count.
_MARGIN_SIGMAS = 4.0
# The sync-free selector cannot fall back to torch.topk when its sample misleads
# (choosing would need the host to read a count), so it keeps a wider margin.
_SYNC_FREE_SIGMAS = 6.0
_INT32_MAX = 2**31 - 1


def check_selector(name: str, field_name: str = "selector") -> str:
    if name not in SELECTORS:
        raise ValueError(f"{field_name}: unknown selector {name!r} (one of {', '.join(SELECTORS)})")
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
    return torch.topk(g.abs(), k, sorted=False).indices.to(INDEX_DTYPE)


class FastSelector:
    """Sampled-threshold Top-k; exact whenever the sample threshold admits >= k.

    Holds a scratch buffer for |g| and a private random generator (seeded, so
    runs repeat). `fallbacks` counts the calls that had to use torch.topk.
    """

    def __init__(self, seed: int = 0, sample_size: int = _SAMPLE_SIZE, min_numel: int = _FAST_MIN_NUMEL) -> None:
        self._gen = torch.Generator().manual_seed(seed)
        self._sample_size = sample_size
        self._min_numel = min_numel  # smaller tensors go to torch.topk
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
        if n < self._min_numel or k > _FAST_MAX_CR * n:
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
        return cand.to(INDEX_DTYPE)

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
        j = sample_rank(k, n, s, _MARGIN_SIGMAS)
        if j >= s:
            return None
        return torch.topk(sample, j, sorted=False).values.min()


def sample_rank(k: int, n: int, s: int, sigmas: float) -> int:
    """j such that at least k of n entries are >= the j-th largest of s samples,
    unless the sample is off by more than `sigmas` standard deviations."""
    expected = k / n * s
    return math.ceil(expected + sigmas * math.sqrt(expected) + sigmas)


def smallest_positive(dtype: torch.dtype) -> float:
    """The smallest positive (subnormal) value of a floating dtype."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


class SyncFreeSelector:
    """Sampled-threshold Top-k decided on the tensor's device: no host synchronisation.

    A sample drawn on the device with a device-side generator gives the threshold
    (the j-th largest sampled magnitude, j = `sample_rank` at 6 sigmas, never below
    the dtype's smallest positive value, so exact zeros are never candidates); the
    entries that pass it go into a buffer of fixed `capacity` (`candidates.passing`,
    6 sigmas above the expected count), and the exact top k of those are chosen.
    Whenever between k and `capacity` entries pass, that is the exact top k.

    Otherwise (a miss: about 1e-9 of calls each way for a continuous gradient, by
    a normal approximation; more with many ties at the threshold) the result is
    still k distinct entries: the top k of the first `capacity` candidates, or
    every candidate and others that did not pass (exact when those are zeros).
    Choosing torch.topk instead would need the host to read the count, which
    waits for the device; `misses` counts them on the device, to be read outside
    the step.
    """

    def __init__(self, seed: int = 0, sample_size: int = _SAMPLE_SIZE, triton: bool | None = None,
                 min_numel: int = _FAST_MIN_NUMEL) -> None:
        self._generators = Generators(seed)
        self.triton = triton  # the candidates by Triton kernels: None where installed, on a GPU
        self._sample_size = sample_size
        self._min_numel = min_numel  # smaller tensors go to torch.topk
        self._misses: dict[torch.device, torch.Tensor] = {}
        self.calls = 0

    @property
    def misses(self) -> int:
        """Calls whose candidates were not between k and the capacity (reads the
        device: not inside a step)."""
        return sum(int(m) for m in self._misses.values())

    def __call__(self, g: torch.Tensor, k: int) -> torch.Tensor:
        check_flat(g)
        n = g.numel()
        self.calls += 1
        s = min(self._sample_size, n)
        j = sample_rank(k, n, s, _SYNC_FREE_SIGMAS)
        capacity = math.ceil(n * (j + _SYNC_FREE_SIGMAS * math.sqrt(j) + _SYNC_FREE_SIGMAS) / s)
        if n < self._min_numel or k > _FAST_MAX_CR * n or j >= s or capacity >= n:
            return select_exact(g, k)
        pos = torch.randint(n, (s,), generator=self._generators.on(g.device), device=g.device)
        threshold = torch.topk(g[pos].abs(), j, sorted=False).values.min().clamp(min=smallest_positive(g.dtype))
        # One slot more than the capacity: a candidate in it means some did not fit.
        cand, magnitudes, count = passing(g, threshold, capacity + 1, self.triton)
        valid = cand >= 0
        top = torch.topk(magnitudes, k, sorted=False).indices
        chosen = torch.where(top < count, cand[top], _not_among(cand, valid, n, top - count))
        self._count_miss(g.device, (count < k) | valid[-1])
        return chosen.to(INDEX_DTYPE)

    def _count_miss(self, device: torch.device, miss: torch.Tensor) -> None:
        counter = self._misses.get(device)
        if counter is None:
            counter = self._misses[device] = torch.zeros((), dtype=torch.int64, device=device)
        counter.add_(miss)


def _not_among(cand: torch.Tensor, valid: torch.Tensor, n: int, r: torch.Tensor) -> torch.Tensor:
    """The r-th smallest index (0-based, r >= 0) of 0..n-1 that is not a valid
    entry of `cand` (valid entries first, ascending): r plus the number of valid
    entries whose gap cand[i] - i is <= r."""
    gaps = torch.where(valid, cand - torch.arange(cand.numel(), device=cand.device), n)
    r = r.clamp(min=0)
    return r + torch.searchsorted(gaps, r, right=True)


class RadixSelector:
    """Radix select on the tensor's device (`radix.radix_topk`); torch.topk below
    `min_numel` and where it cannot run (counted in `fallbacks`)."""

    def __init__(self, seed: int = 0, min_numel: int = _FAST_MIN_NUMEL) -> None:
        self._min_numel = min_numel  # deterministic: `seed` is taken for the common signature
        self.calls = 0
        self.fallbacks = 0

    def __call__(self, g: torch.Tensor, k: int) -> torch.Tensor:
        check_flat(g)
        self.calls += 1
        if g.numel() < self._min_numel:
            return select_exact(g, k)
        if not radix_available(g):
            self.fallbacks += 1
            return select_exact(g, k)
        return radix_topk(g, k)


class AutoSelector:
    """"fast" for tensors in host memory, "radix" for tensors on a device; each
    leaves tensors below its measured size to torch.topk."""

    def __init__(self, seed: int = 0) -> None:
        self.host = FastSelector(seed=seed, min_numel=_AUTO_HOST_MIN_NUMEL)
        self.device = RadixSelector(seed=seed, min_numel=_AUTO_DEVICE_MIN_NUMEL)

    def __call__(self, g: torch.Tensor, k: int) -> torch.Tensor:
        return (self.host if g.device.type == "cpu" else self.device)(g, k)

    @property
    def calls(self) -> int:
        return self.host.calls + self.device.calls

    @property
    def fallbacks(self) -> int:
        """Calls that did not end on the sampled path's exact answer (reads the device)."""
        return self.host.fallbacks + self.device.fallbacks


def make_selector(name: str, seed: int = 0):
    """A callable (g, k) -> int32 indices for selector `name` (see SELECTORS)."""
    check_selector(name)
    if name == "exact":
        return select_exact
    return {"auto": AutoSelector, "fast": FastSelector, "sync_free": SyncFreeSelector,
            "radix": RadixSelector}[name](seed=seed)
