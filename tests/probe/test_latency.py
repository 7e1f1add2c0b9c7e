"""TCP-connect RTT on loopback (no privileges needed); the namespace cases are in
probe/test_iperf.py."""

from __future__ import annotations

import itertools
import socket
import sys
import threading

import pytest

from flexcomm.probe import latency
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


def test_a_busy_prober_process_does_not_inflate_the_rtt():
    # The agent's probing thread shares the GIL with its event loop: timed by the
    # host around connect(), half of a loopback burst's RTTs read 10-100 ms (the
    # switch interval here is 50 ms) while other threads ran; the kernel's own
    # samples of the handshake read 14-50 us.
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    interval = sys.getswitchinterval()
    spinners = [threading.Thread(target=spin) for _ in range(2)]
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        sys.setswitchinterval(0.05)
        try:
            for t in spinners:
                t.start()
            s = rtt_burst("127.0.0.1", server.getsockname()[1], count=10)
        finally:
            stop.set()
            sys.setswitchinterval(interval)
            for t in spinners:
                t.join()
    assert s.answered == 10 and 0 < s.min_s <= s.p50_s < 0.002, s


def test_a_completed_connect_is_timed_by_the_kernel_a_refused_one_by_the_host(monkeypatch) -> None:
    # The host's clock here jumps 1 s across each connect(), as for a probing
    # thread that waited that long to run again.
    ticks = itertools.count(0.0, 1.0)
    monkeypatch.setattr(latency.time, "perf_counter", lambda: next(ticks))
    with socket.socket() as server, socket.socket() as closed:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        closed.bind(("127.0.0.1", 0))  # bound, never listening: the kernel answers RST
        answered = rtt_burst("127.0.0.1", server.getsockname()[1], count=3, interval_s=0.0)
        refused = rtt_burst("127.0.0.1", closed.getsockname()[1], count=3, interval_s=0.0)
    assert 0 < answered.min_s <= answered.p99_s < 0.002, answered
    assert refused.min_s == refused.p99_s == 1.0


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
