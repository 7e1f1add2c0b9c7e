"""Looks by packet train: a real look server answers a real train over UDP with
the kernel's receive stamps; the rate read from them survives a sender stalled
part-way; what is not a look is dropped, counted and named once; a look nobody
answers fails in its timeout, saying why."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from flexcomm.probe.train import DATAGRAM_BYTES, TrainLookError, TrainServer, train_look, train_rate
from flexcomm.store.records import LOOK
from support.agent_process import free_port
from support.privilege import skip_or_fail


def evenly(count: int, rate_bytes_s: float, start_ns: int = 0) -> list[tuple[int, int]]:
    gap_ns = DATAGRAM_BYTES / rate_bytes_s * 1e9
    return [(seq, start_ns + int(seq * gap_ns)) for seq in range(count)]


def test_the_rate_is_the_spacing_of_the_arrivals() -> None:
    assert train_rate(evenly(180, 20e6)) == pytest.approx(20e6, rel=1e-3)
    assert train_rate(list(reversed(evenly(45, 1e8)))) == pytest.approx(1e8, rel=1e-3)  # by seq, not order


def test_a_sender_stalled_part_way_does_not_move_the_rate() -> None:
    # A descheduled sender leaves a gap in one third of the train: that third reads
    # slow; the median of the thirds does not (read end to end it would be 0.29x).
    stamps = [(seq, ns + (5_000_000 if seq >= 30 else 0)) for seq, ns in evenly(180, 1.2e8)]
    assert train_rate(stamps) == pytest.approx(1.2e8, rel=1e-3)


# The receive stamps (us after the first) of a 45-datagram train through the
# tests' 100 Mbit/s HTB link beside the test suite: the ceil's opening burst, the
# shaper's timer 5 ms late after datagram 27, then the credit it saved in a clump.
# Every unheld gap is 96 us, the ceil's 1.167x of the rate in UDP payload.
HELD_TRAIN_US = [0, 12, 16, 100, 189, 291, 387, 488, 584, 669, 775, 885, 973, 1059, 1158, 1254, 1350, 1446,
                 1541, 1638, 1733, 1830, 1928, 2022, 2119, 2218, 2309, 2398, 7415, 7486, 7679, 7698, 7711,
                 7777, 7871, 7969, 8065, 8159, 8255, 8352, 8449, 8544, 8643, 8738, 8830]


def test_a_late_shaper_and_the_clump_after_it_do_not_move_the_rate() -> None:
    # Read by thirds, the burst and the clump each compressed one: 1.354x.
    stamps = [(seq, us * 1000) for seq, us in enumerate(HELD_TRAIN_US)]
    assert train_rate(stamps) == pytest.approx(DATAGRAM_BYTES / 96e-6, rel=0.05)


def test_too_few_datagrams_or_one_instant_read_nothing() -> None:
    with pytest.raises(TrainLookError, match="only 5 datagrams"):
        train_rate(evenly(5, 1e8))
    with pytest.raises(TrainLookError, match="one instant"):
        train_rate([(seq, 7) for seq in range(40)])


@pytest.fixture
def server() -> TrainServer:
    look_server = TrainServer(free_port(socket.SOCK_DGRAM), bind="127.0.0.1").start()
    yield look_server
    look_server.stop()


def test_a_look_at_a_real_server_reads_the_path_and_how_long_it_held_it(server: TrainServer) -> None:
    m = train_look("127.0.0.1", server.port, 256 << 10)
    assert m.ok and m.kind == LOOK and m.peer == "127.0.0.1"
    assert m.bandwidth_bps > 100e6  # loopback: far faster than any link it stands for
    assert m.beta_s_per_byte == pytest.approx(8 / m.bandwidth_bps)
    assert 0 < m.duration_s < 0.5  # the train's own time, not the wait for the answer
    assert 0 <= m.rtt_min_s < 0.5  # the answer's wait, less the train's own time
    assert server.answered == 1 and server.ignored == 0


def test_what_is_not_a_look_is_dropped_counted_and_named_once(server: TrainServer,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "flexcomm.probe.train"), \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stray:
        for datagram in (b"hello", b"FCT1" + bytes(40), b"x" * 1400):
            stray.sendto(datagram, ("127.0.0.1", server.port))
        deadline = time.monotonic() + 5
        while server.ignored < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert server.ignored == 3 and server.answered == 0
    named = [r for r in caplog.records if "not a flexcomm look" in r.getMessage()]
    assert len(named) == 1 and "127.0.0.1" in named[0].getMessage()
    assert train_look("127.0.0.1", server.port, 64 << 10).ok  # and it serves on


def test_a_look_nobody_answers_fails_in_its_timeout_saying_why() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never answers
        silent.bind(("127.0.0.1", 0))
        started = time.monotonic()
        with pytest.raises(TrainLookError, match=r"no answer to the look within 0\.3 s"):
            train_look("127.0.0.1", silent.getsockname()[1], 64 << 10, timeout_s=0.3)
        assert time.monotonic() - started < 2
    with pytest.raises(TrainLookError, match="refused the look: nothing serves looks there"):
        train_look("127.0.0.1", free_port(socket.SOCK_DGRAM), 64 << 10)


def test_a_server_that_cannot_bind_names_its_address() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        with pytest.raises(OSError, match=r"look server: cannot bind 127\.0\.0\.1 port \d+/udp"):
            TrainServer(taken.getsockname()[1], bind="127.0.0.1").start()


def test_a_look_over_ipv6() -> None:
    if not socket.has_ipv6:
        skip_or_fail("this host has no IPv6")
    server = TrainServer(free_port(socket.SOCK_DGRAM), bind="::1").start()
    try:
        assert train_look("::1", server.port, 64 << 10).ok and server.answered == 1
    finally:
        server.stop()
