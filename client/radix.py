"""Top-k by radix select on the device: three reads of the tensor, no sort, no
sample, nothing read back on the host.

A float32's magnitude orders like its bits with the sign cleared (an int32 key),
so the k largest |g| are the k largest keys. LEVELS histograms of BITS bits each
find the key prefix P (by default 15 bits: the exponent and the mantissa's top 7)
at which the count from the top reaches k:

1. histogram of every key's top BITS; the boundary digit is where the count of
   keys at or above it first reaches k;
2. each further level: histogram of the next BITS of the keys under the prefix
   so far, and its boundary for what k leaves after the keys above that prefix.
   At the last level each span of the tensor keeps its own histogram and its
   count of keys above the prefix, which give its count of keys above P and at
   P; a cumulative sum gives each span its first slots;
3. each span writes its keys above P in index order, then, after all of those,
   its keys at P while slots remain: exactly k indices.

Every entry above P is chosen and every entry below it is not; of the entries at
P (a bin at most 2^-7 of its magnitude wide) the lowest-indexed are taken. So an
entry left out is at most 0.8% larger than the smallest entry chosen, and the
chosen squared mass is at least 0.984 of the exact top k's whatever the input (a
tie-break within the bin, not a miss: it holds on every call; on the benchmark's
gradients it was 0.9999997 or more).

LEVELS + 4 launches: a zeroed histogram, the histogram passes, the spans'
counts, a cumulative sum, the write. On an H200 (25M and 100M values) three
levels of 5 bits took 0.31 and 1.06 ms, against 0.37-0.46 and 1.17-1.47 ms for
3 x 6, 4 x 4 and 2 x 8 bits: a 32-bin histogram costs Triton far less work per
entry than 64 or 256 bins.

Triton kernels, for CUDA tensors where Triton is installed; `TRITON_INTERPRET=1`
runs them on the host (numpy), which is how the test suite checks them.
"""

from __future__ import annotations

import functools

import torch

from flexcomm.client.candidates import INDEX_DTYPE, triton_available, use_triton

# The key's top LEVELS * BITS bits, BITS at a time (see the module docstring).
LEVELS = 3
BITS = 5
# A span of HIST_BLOCK * HIST_ITERS entries per program (one atomic add of its
# histogram each), written WRITE_BLOCK at a time: the fastest on an H200 of spans
# of 8-64K entries with 8 warps; on an H100 writes of 1K entries with 4 warps
# beat 2-8K with 4-16.
HIST_BLOCK = 8192
HIST_ITERS = 2
NUM_WARPS = 8
WRITE_BLOCK = 1024
WRITE_WARPS = 4


@functools.cache
def _kernels():
    """The Triton kernels, or None where Triton is not installed."""
    if not triton_available():
        return None
    from flexcomm.client import radix_kernels

    return radix_kernels


def radix_available(g: torch.Tensor) -> bool:
    """Whether `radix_topk` runs for `g`: float32, on a CUDA device with Triton (or
    under TRITON_INTERPRET=1)."""
    return g.dtype == torch.float32 and use_triton(g)


def radix_topk(g: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int32, k of them, distinct) of the k largest |g| of a flat float32
    tensor, to within the last bin (see the module docstring); 1 <= k <= numel."""
    kernels = _kernels()
    n, bins = g.numel(), 1 << BITS
    span = HIST_BLOCK * HIST_ITERS
    programs = -(-n // span)
    hist = torch.zeros(LEVELS, bins, dtype=torch.int32, device=g.device)
    local = torch.empty(programs, bins, dtype=torch.int32, device=g.device)
    above = torch.empty(programs, dtype=torch.int32, device=g.device)
    for level in range(LEVELS):
        kernels.histogram[(programs,)](g, hist, local, above, n, k, LEVEL=level, LEVELS=LEVELS, BITS=BITS,
                                       BLOCK=HIST_BLOCK, ITERS=HIST_ITERS, MASK=kernels.HISTOGRAM_MASK,
                                       num_warps=NUM_WARPS)
    counts = torch.empty(2, programs, dtype=torch.int32, device=g.device)
    kernels.spans[(programs,)](hist, local, above, counts, k, programs, LEVELS=LEVELS, BITS=BITS)
    ends = torch.cumsum(counts, 1, dtype=torch.int32)
    out = torch.empty(k, dtype=INDEX_DTYPE, device=g.device)
    kernels.write[(programs,)](g, hist, ends, out, n, k, programs, LEVELS=LEVELS, BITS=BITS, BLOCK=WRITE_BLOCK,
                               ITERS=span // WRITE_BLOCK, num_warps=WRITE_WARPS)
    return out
