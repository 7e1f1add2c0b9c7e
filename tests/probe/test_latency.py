"""TCP-connect RTT on loopback (no privileges needed); the namespace cases are in
probe/test_iperf.py."""

from __future__ import annotations

import socket

import pytest

from flexcomm.probe.latency import RttSummary, latency_measurement, percentile, rtt_burst


def test_percentile_interpolates_and_orders():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match=r"^values:"):
        percentile([], 50)


def test_listening_port_answers():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        s = rtt_burst("127.0.0.1", server.getsockname()[1], count=5, interval_s=0.0)
    assert s.answered == 5 and s.loss == 0.0
    assert 0 < s.min_s <= s.p50_s <= s.p99_s


def test_refused_connect_is_a_round_trip():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the kernel answers RST
        summary = rtt_burst("127.0.0.1", port, count=3, interval_s=0.0)
    assert summary.answered == 3 and summary.min_s > 0


def test_no_answer_is_a_failed_measurement():
    lost = RttSummary("10.9.9.9", 80, sent=3, answered=0, min_s=None, p50_s=None, p99_s=None,
                      error="no answer within 1 s")
    m = latency_measurement(lost)
    assert not m.ok and m.loss == 1.0 and "10.9.9.9:80: no answer" in m.error
    partial = RttSummary("p", 80, sent=4, answered=3, min_s=1e-4, p50_s=4e-4, p99_s=9e-4)
    m = latency_measurement(partial)
    assert m.ok and m.loss == 0.25 and m.alpha_s == pytest.approx(0.5e-4)  # half the min, not the queued median
