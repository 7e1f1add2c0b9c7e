"""Sizes, rates and durations as people write them."""

from __future__ import annotations

import pytest

from flexcomm.units import parse_bytes, parse_duration, parse_fraction, parse_rate


@pytest.mark.parametrize(("text", "value"), [
    ("100MB", 100e6), ("4MiB", 4 * 1024**2), ("1.5GB", 1.5e9), (1000, 1000.0), ("512", 512.0), ("2 kib", 2048),
])
def test_bytes(text, value) -> None:
    assert parse_bytes("size", text) == value


@pytest.mark.parametrize(("text", "value"), [
    ("100Mbit", 100e6), ("100mbps", 100e6), ("1Gbit/s", 1e9), ("64kbit", 64e3), (5e6, 5e6),
])
def test_rates_are_bits_per_second(text, value) -> None:
    assert parse_rate("bandwidth", text) == value


@pytest.mark.parametrize(("text", "value"), [("10ms", 0.01), ("50us", 5e-5), ("2s", 2.0), ("1min", 60.0), (0.5, 0.5)])
def test_durations(text, value) -> None:
    assert parse_duration("latency", text) == pytest.approx(value)


@pytest.mark.parametrize(("fn", "text", "needle"), [
    (parse_bytes, "1XB", "unknown size unit"), (parse_bytes, "-5MB", "> 0"), (parse_bytes, "nanMB", "cannot read"),
    (parse_rate, "100", "needs a unit"), (parse_rate, "100Mbs", "unknown rate unit"), (parse_rate, "0Mbit", "> 0"),
    (parse_rate, "infGbit", "cannot read"), (parse_duration, "5", "needs a unit"), (parse_duration, "5parsecs", "unit"),
    (parse_duration, "-1ms", ">= 0"), (parse_fraction, "150%", "between 0 and 1"),
])
def test_errors_name_the_field(fn, text, needle) -> None:
    with pytest.raises(ValueError, match=r"^field: ") as err:
        fn("field", text)
    assert needle in str(err.value)


def test_fraction() -> None:
    assert parse_fraction("loss", "1%") == pytest.approx(0.01)
    assert parse_fraction("loss", 0.25) == 0.25


def test_errors_quote_what_was_written() -> None:
    with pytest.raises(ValueError, match="'-5Mbit'"):
        parse_rate("rate", "-5Mbit")
    with pytest.raises(ValueError, match="'-2ms'"):
        parse_duration("delay", "-2ms")
