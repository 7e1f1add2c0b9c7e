"""The Triton kernels of `client/radix.py` (imported only where Triton is installed).

The key's top LEVELS * BITS bits are found BITS at a time (LEVELS histograms of
2**BITS bins). Programs of the histogram and write passes each take a span of
BLOCK * ITERS entries, so the last histogram pass can leave each span's own
histogram behind, and the counts the write pass needs come from those (`spans`)
instead of another read of the tensor. Every program finds the boundaries of the
levels before its own again from the global histograms (`_boundaries`: a few
hundred loads from the cache), which saves a launch per level.
"""

import inspect

import triton
import triton.language as tl

# Triton 3.3 and later take a mask (on an H100 the last level ran 18% quicker with
# it than counting the left-out entries into bin 0 and taking them off again).
HISTOGRAM_MASK = "mask" in inspect.signature(tl.histogram).parameters


@triton.jit
def _key(x):
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _boundary(hist_ptr, need, BINS: tl.constexpr):
    """The bin b where the count from the top first reaches `need`, and the
    count strictly above it."""
    bins = tl.arange(0, BINS)
    h = tl.load(hist_ptr + bins)
    at_or_above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h
    b = tl.max(tl.where(at_or_above >= need, bins, -1), axis=0)
    return b, tl.sum(tl.where(bins > b, h, 0), axis=0)


@triton.jit
def _boundaries(hist_ptr, k, UPTO: tl.constexpr, BITS: tl.constexpr):
    """The key prefix (UPTO * BITS bits) the first UPTO levels settled, and what
    of k is left to find below it."""
    prefix = 0
    need = k
    for level in tl.static_range(UPTO):
        b, above = _boundary(hist_ptr + level * (1 << BITS), need, 1 << BITS)
        prefix = prefix * (1 << BITS) + b
        need -= above
    return prefix, need


@triton.jit
def histogram(g_ptr, hist_ptr, local_ptr, above_ptr, n, k, LEVEL: tl.constexpr, LEVELS: tl.constexpr,
              BITS: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr, MASK: tl.constexpr):
    """Level LEVEL's digit of the keys under the prefix the levels before settled,
    into hist[LEVEL]; at the last level also this span's own histogram (local)
    and its count of keys above that prefix (above)."""
    pid = tl.program_id(0)
    start = pid * BLOCK * ITERS
    prefix, _ = _boundaries(hist_ptr, k, LEVEL, BITS)
    above = 0
    local = tl.zeros((1 << BITS,), dtype=tl.int32)
    for i in range(ITERS):
        offsets = start + i * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        key = _key(tl.load(g_ptr + offsets, mask=inside, other=0.0))
        member = inside
        if LEVEL > 0:
            member = inside & ((key >> (31 - BITS * LEVEL)) == prefix)
        if LEVEL == LEVELS - 1:
            above += tl.sum((inside & ((key >> (31 - BITS * LEVEL)) > prefix)).to(tl.int32), axis=0)
        digit = (key >> (31 - BITS * (LEVEL + 1))) & ((1 << BITS) - 1)
        if MASK:
            local += tl.histogram(digit, 1 << BITS, mask=member)
        else:  # entries not counted go to bin 0 and are taken off it again
            local += tl.histogram(tl.where(member, digit, 0), 1 << BITS)
            local -= tl.where(tl.arange(0, 1 << BITS) == 0, tl.sum((~member).to(tl.int32), axis=0), 0)
    tl.atomic_add(hist_ptr + LEVEL * (1 << BITS) + tl.arange(0, 1 << BITS), local, mask=local > 0)
    if LEVEL == LEVELS - 1:
        tl.store(local_ptr + pid * (1 << BITS) + tl.arange(0, 1 << BITS), local)
        tl.store(above_ptr + pid, above)


@triton.jit
def spans(hist_ptr, local_ptr, above_ptr, counts_ptr, k, programs, LEVELS: tl.constexpr, BITS: tl.constexpr):
    """Each span's count of keys above the final prefix and at it, from its histogram."""
    pid = tl.program_id(0)
    _, need = _boundaries(hist_ptr, k, LEVELS - 1, BITS)
    last, _ = _boundary(hist_ptr + (LEVELS - 1) * (1 << BITS), need, 1 << BITS)
    bins = tl.arange(0, 1 << BITS)
    local = tl.load(local_ptr + pid * (1 << BITS) + bins)
    tl.store(counts_ptr + pid, tl.load(above_ptr + pid) + tl.sum(tl.where(bins > last, local, 0), axis=0))
    tl.store(counts_ptr + programs + pid, tl.sum(tl.where(bins == last, local, 0), axis=0))


@triton.jit
def write(g_ptr, hist_ptr, ends_ptr, out_ptr, n, k, programs, LEVELS: tl.constexpr, BITS: tl.constexpr,
          BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """The span's keys above the final prefix at their slots, then those at it
    while slots remain (ends: inclusive cumulative counts per span, above then at).
    A block with nothing to write skips the scan, most of the pass's work."""
    pid = tl.program_id(0)
    p, _ = _boundaries(hist_ptr, k, LEVELS, BITS)
    slot_above = tl.load(ends_ptr + pid - 1, mask=pid > 0, other=0)
    slot_at = tl.load(ends_ptr + programs - 1) + tl.load(ends_ptr + programs + pid - 1, mask=pid > 0, other=0)
    start = pid * BLOCK * ITERS
    for i in range(ITERS):
        offsets = start + i * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        prefix = _key(tl.load(g_ptr + offsets, mask=inside, other=0.0)) >> (31 - BITS * LEVELS)
        above = (inside & (prefix > p)).to(tl.int32)
        at = (inside & (prefix == p)).to(tl.int32)
        # one scan for both: BLOCK < 2**16, so the low half counts those above
        both = above + at * 65536
        total = tl.sum(both, axis=0)
        if total > 0:
            ranks = tl.cumsum(both, axis=0)
            tl.store(out_ptr + slot_above + (ranks & 0xFFFF) - 1, offsets, mask=above > 0)
            slot = slot_at + (ranks >> 16) - 1
            tl.store(out_ptr + slot, offsets, mask=(at > 0) & (slot < k))
        slot_above += total & 0xFFFF
        slot_at += total >> 16
