"""Recorded networks as time-keyed schedules.

    samples = iperf3_samples(text)                  # an `iperf3 --json` log
    samples = mahimahi_samples(text)                # a mahimahi-style trace
    text = schedule_text(samples, window_s=10.0, source="iperf3 log x.json")

A sample is (start s, end s, rate in bit/s) of what was measured. Goodput
samples (iperf3, an agent's probes) are TCP payload, so a step's `rate` is the
goodput divided by `payload_share` (what HTB must pass for TCP to carry that
goodput at MTU 1500); a mahimahi trace gives delivery opportunities of whole
1500-byte packets, the link's own rate, and is taken as it is.

The samples are averaged over windows of `window_s` (time-weighted), and
neighbouring windows whose rates differ by less than `merge` are one step, so a
step lasts at least one window: a network changes at the pace it was measured,
not at the pace of one noisy sample.

Every reader raises `RecordError` with one line naming the file and what is
wrong with it.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass

from flexcomm.units import format_rate

# At MTU 1500 a full frame is 1514 bytes on the wire and carries 1448 of TCP
# payload (20 bytes of IP, 20 of TCP, 12 of timestamps, 14 of Ethernet).
TCP_PAYLOAD_SHARE = 1448 / 1514
MAHIMAHI_PACKET_BITS = 1500 * 8  # one delivery opportunity: one MTU-sized packet
MIN_RATE_BPS = 8_000  # a window that carried less is written as this (HTB needs a rate)


class RecordError(ValueError):
    """A recording that cannot be read; the message is one line."""


@dataclass(frozen=True)
class Sample:
    start_s: float
    end_s: float
    rate_bps: float


def iperf3_samples(text: str, where: str = "iperf3 log") -> list[Sample]:
    """The per-interval goodput of an `iperf3 --json` log (the sum over streams)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{where}: not JSON (iperf3 --json writes JSON): {exc.msg} at line "
                          f"{exc.lineno}") from None
    if not isinstance(data, dict):
        raise RecordError(f"{where}: not an iperf3 --json log (no top-level object)")
    if data.get("error"):
        raise RecordError(f"{where}: iperf3 reported an error: {data['error']}")
    intervals = data.get("intervals")
    if not isinstance(intervals, list) or not intervals:
        raise RecordError(f"{where}: no intervals (an iperf3 --json log lists them under "
                          "\"intervals\")")
    samples = []
    for i, interval in enumerate(intervals, start=1):
        total = interval.get("sum") if isinstance(interval, dict) else None
        try:
            start, end, bps = (float(total[k]) for k in ("start", "end", "bits_per_second"))
        except (TypeError, KeyError, ValueError):
            raise RecordError(f"{where}: interval {i}: no sum with start, end and "
                              "bits_per_second") from None
        if end > start and bps >= 0 and math.isfinite(bps):
            samples.append(Sample(start, end, bps))
    return _checked(samples, where)


def mahimahi_samples(text: str, where: str = "trace", bin_s: float = 1.0) -> list[Sample]:
    """A mahimahi trace (one delivery time in ms per line, each one 1500-byte
    packet; the trace repeats) as the rate of each `bin_s` interval."""
    times = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if not line.isdigit():
            raise RecordError(f"{where}: line {number}: {line[:40]!r} is not a whole number of "
                              "milliseconds (a mahimahi trace has one per line)")
        times.append(int(line))
    if not times:
        raise RecordError(f"{where}: empty: a mahimahi trace lists delivery times in ms")
    if any(b < a for a, b in itertools.pairwise(times)):
        raise RecordError(f"{where}: delivery times go backwards; a mahimahi trace is sorted")
    end_ms = max(times[-1], 1)
    bins = max(1, math.ceil(end_ms / (bin_s * 1000)))
    counts = [0] * bins
    for t in times:
        counts[min(int(t / (bin_s * 1000)), bins - 1)] += 1
    return _checked([Sample(i * bin_s, (i + 1) * bin_s, c * MAHIMAHI_PACKET_BITS / bin_s)
                     for i, c in enumerate(counts)], where)


def measurement_samples(rows: list[tuple[float, float]], where: str) -> list[Sample]:
    """An agent's bandwidth measurements of one peer, (ts, goodput bit/s) oldest
    first: each holds until the next one (the last for the median interval)."""
    if not rows:
        raise RecordError(f"{where}: no successful bandwidth measurement of that peer")
    start = rows[0][0]
    gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(rows))
    last_gap = gaps[len(gaps) // 2] if gaps else 10.0
    samples = []
    for i, (ts, bps) in enumerate(rows):
        end = rows[i + 1][0] if i + 1 < len(rows) else ts + last_gap
        if end > ts:
            samples.append(Sample(ts - start, end - start, bps))
    return _checked(samples, where)


def _checked(samples: list[Sample], where: str) -> list[Sample]:
    if not samples:
        raise RecordError(f"{where}: no interval with a measured rate")
    return samples


def windows(samples: list[Sample], window_s: float) -> list[tuple[float, float]]:
    """(duration s, time-weighted mean rate) of consecutive `window_s` windows
    from the first sample's start to the last one's end (the last window may be
    shorter). A window no sample covers keeps the rate before it."""
    if window_s <= 0:
        raise RecordError(f"window: must be > 0 s, got {window_s:g}")
    origin, end = samples[0].start_s, samples[-1].end_s
    out: list[tuple[float, float]] = []
    lo = origin
    while lo < end - 1e-9:
        hi = min(lo + window_s, end)
        covered = weighted = 0.0
        for s in samples:
            overlap = min(hi, s.end_s) - max(lo, s.start_s)
            if overlap > 0:
                covered += overlap
                weighted += overlap * s.rate_bps
        rate = weighted / covered if covered else (out[-1][1] if out else 0.0)
        out.append((hi - lo, rate))
        lo = hi
    return out


def merged(steps: list[tuple[float, float]], merge: float) -> list[tuple[float, float]]:
    """Neighbouring (duration, rate) steps whose rates differ by less than the
    share `merge` of the larger joined into one (time-weighted rate)."""
    out: list[tuple[float, float]] = []
    for duration, rate in steps:
        if out:
            d0, r0 = out[-1]
            if abs(rate - r0) < merge * max(rate, r0):
                out[-1] = (d0 + duration, (d0 * r0 + duration * rate) / (d0 + duration))
                continue
        out.append((duration, rate))
    return out


def schedule_text(samples: list[Sample], *, window_s: float, merge: float, payload_share: float,
                  name: str, provenance: str) -> str:
    """A time-keyed schedule (TOML) of the samples: `payload_share` < 1 turns
    goodput into the shaper's rate (1.0 for a link rate)."""
    steps = merged(windows(samples, window_s), merge)
    lines = [f"# {line}".rstrip() for line in provenance.splitlines()]
    lines += [f"name = {json.dumps(name)}",
              f"description = {json.dumps(f'{len(steps)} steps recorded over {sum(d for d, _ in steps):.0f} s')}",
              ""]
    for duration, rate in steps:
        shaped = max(rate / payload_share, MIN_RATE_BPS)
        lines += ["[[step]]", f'duration = "{_seconds(duration)}"',
                  f'rate = "{_rate(shaped)}"  # recorded {format_rate(rate)}', ""]
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") + "s"


def _rate(bps: float) -> str:
    """A rate the schedule parser reads back to within 0.1%."""
    return f"{bps / 1e3:.0f}kbit" if bps < 10e6 else f"{bps / 1e6:.2f}".rstrip("0").rstrip(".") + "Mbit"
