"""Every start-up failure a user can cause or fix ends the same way: exit 2 and
one line naming the setting or file and what is wrong, no traceback, and
nothing left behind (no socket file)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexcomm.store import Store
from support.cli import assert_one_line_error, flexcomm


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def agent(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    defaults = {"--socket": str(tmp_path / "agent.sock"), "--db": str(tmp_path / "agent.db"), "--metrics": ""}
    given = dict(zip(flags[::2], flags[1::2], strict=True))
    argv = [f"{k}={v}" for k, v in {**defaults, **given}.items()]
    return flexcomm(["agent", "--no-probe", *argv])


def test_a_scalar_where_the_agent_table_belongs(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("agent = 5\n")
    line = assert_one_line_error(agent(tmp_path, "--config", str(config)), "agent", f"config: {config}: ")
    assert "agent must be a table" in line


def test_a_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_bytes(b'[agent]\nsocket = "/tmp/\xff\xfe.sock"\n')
    line = assert_one_line_error(agent(tmp_path, "--config", str(config)), "agent", f"config: {config}: ")
    assert "not UTF-8 text (byte 0xff at offset 23)" in line


def test_a_schedule_that_is_not_utf8(tmp_path: Path) -> None:
    schedule = tmp_path / "schedule.toml"
    schedule.write_bytes(b'[[step]]\nepoch = 0\nrate = "10Mbit\xe9"\n')
    proc = agent(tmp_path, "--emulation-schedule", str(schedule), "--emulation-interface", "lo")
    assert "not UTF-8 text" in assert_one_line_error(proc, "agent", f"{schedule}: ")
    validate = flexcomm(["emulate", "validate", str(schedule)])
    assert "not UTF-8 text" in assert_one_line_error(validate, "emulate", f"{schedule}: ")


def test_a_socket_directory_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("")
    proc = agent(tmp_path, "--socket", str(tmp_path / "plain-file" / "run" / "agent.sock"))
    line = assert_one_line_error(proc, "agent", f"socket: cannot create the directory {tmp_path}/plain-file/run: ")
    assert line.endswith("Not a directory")


def test_a_socket_path_too_long_for_a_unix_socket(tmp_path: Path) -> None:
    long_path = tmp_path / ("s" * 120) / "agent.sock"
    line = assert_one_line_error(agent(tmp_path, "--socket", str(long_path)), "agent", "socket: ")
    assert "a Unix socket path holds at most 107" in line
    assert not long_path.parent.exists()


def test_a_tcp_port_in_use(tmp_path: Path, busy_port: int) -> None:
    proc = agent(tmp_path, "--tcp", f"127.0.0.1:{busy_port}")
    assert_one_line_error(proc, "agent", f"tcp: cannot listen on 127.0.0.1:{busy_port}: Address already in use")
    assert not (tmp_path / "agent.sock").exists()


def test_a_metrics_port_in_use(tmp_path: Path, busy_port: int) -> None:
    proc = agent(tmp_path, "--metrics", f"127.0.0.1:{busy_port}")
    assert_one_line_error(proc, "agent", f"metrics: cannot listen on 127.0.0.1:{busy_port}: Address already in use")
    assert not (tmp_path / "agent.sock").exists()


def test_a_store_path_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "store-dir").mkdir()
    proc = agent(tmp_path, "--db", str(tmp_path / "store-dir"))
    assert_one_line_error(proc, "agent", f"db: {tmp_path}/store-dir is a directory")


def test_a_store_on_a_read_only_file_system(tmp_path: Path, privileged: None) -> None:
    mount = tmp_path / "ro"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        Store(mount / "agent.db").close()  # an existing store, then its file system turns read-only
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        proc = agent(tmp_path, "--db", str(mount / "agent.db"))
        assert_one_line_error(proc, "agent", f"db: {mount}/agent.db is on a read-only file system")
        proc = agent(tmp_path, "--db", str(mount / "new" / "agent.db"))
        assert_one_line_error(proc, "agent", f"db: cannot create the directory {mount}/new: Read-only file system")
    finally:
        subprocess.run(["umount", str(mount)], check=True)
