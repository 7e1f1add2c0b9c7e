"""Agent configuration (defaults < TOML file < environment < flags, every bad
value named), sd_notify's datagrams, and the optional TCP listener with TLS."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexcomm.agent import sdnotify
from flexcomm.agent.config import AgentConfig, load_config
from flexcomm.policy.types import LinkBucket
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc
from support.agent_process import AgentProcess, free_port, spec
from support.privilege import skip_or_fail


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    cfg = write(tmp_path / "a.toml", '[agent]\nsocket = "/tmp/file.sock"\nflush_interval_s = "2s"\n'
                                     'max_jobs = 7\nmetrics = ""\n')
    env = {"FLEXCOMM_AGENT_SOCKET": "/tmp/env.sock", "FLEXCOMM_AGENT_PROBE": "off"}
    c = load_config(cfg, {"socket": "/tmp/flag.sock", "db": None}, environ=env)
    assert (c.socket, c.flush_interval_s, c.max_jobs, c.probe, c.metrics) == (
        "/tmp/flag.sock", 2.0, 7, False, "")
    assert load_config(cfg, {}, environ=env).socket == "/tmp/env.sock"
    assert load_config(cfg, {}, environ={}).socket == "/tmp/file.sock"
    bucketed = write(tmp_path / "b.toml", '[agent]\nlink_peak_over_rate = 1.2\nlink_burst_s = "5ms"\n')
    assert load_config(bucketed, {}, environ={}).link_bucket() == LinkBucket(1.2, 0.005)
    assert load_config(None, {}, environ={}).link_bucket().plain
    defaults = load_config(None, {}, environ={"RUNTIME_DIRECTORY": "/run/x", "STATE_DIRECTORY": "/var/y"})
    assert (defaults.socket, defaults.db) == ("/run/x/agent.sock", "/var/y/flexcomm.db")


@pytest.mark.parametrize(("text", "env", "flags", "field"), [
    ('[agent]\nbogus = 1\n', {}, {}, "config: unknown key(s)"),
    ('[agent]\nmax_jobs = "many"\n', {}, {}, "agent.max_jobs: expected an integer"),
    ('[agent\n', {}, {}, "config: "),
    ("", {"FLEXCOMM_AGENT_NOPE": "1"}, {}, "FLEXCOMM_AGENT_NOPE: not an agent setting"),
    ("", {"FLEXCOMM_AGENT_PROBE": "maybe"}, {}, "FLEXCOMM_AGENT_PROBE: expected true or false"),
    ("", {}, {"flush_interval_s": "5"}, "flush_interval_s: duration '5' needs a unit"),
    ("", {}, {"flush_interval_s": "-1s"}, "flush_interval_s: "),
    ("", {}, {"tcp": "10.204.0.1:7070"}, "tcp: 10.204.0.1:7070 is not loopback; set tls_cert"),
    ("", {}, {"tcp": "nonsense"}, "tcp: expected host:port"),
    ("", {}, {"tls_cert": "/x.pem"}, "tls_key: "),
    ("", {}, {"log_level": "loud"}, "log_level: "),
    ("", {}, {"emulation_schedule": "/x.toml"}, "emulation_interface: needed"),
    ("", {}, {"probe_test_duration_s": "1.5s"}, "probe_test_duration_s: "),
    ("", {}, {"probe_sized_test_s": "2s"}, "probe_sized_test_s: must be in [0, probe_test_duration_s]"),
    ("", {}, {"link_peak_over_rate": "0.8"}, "link_peak_over_rate: must be in [1.0, 16.0]"),
    ('[agent]\nlink_burst_s = "-5ms"\n', {}, {}, "agent.link_burst_s: "),
    ("", {"FLEXCOMM_AGENT_LINK_BURST_S": "5"}, {}, "FLEXCOMM_AGENT_LINK_BURST_S: duration '5' needs a unit"),
    ("", {}, {"link_burst_s": "20s"}, "link_burst_s: must be in [0.0, 10.0]"),
    ("", {}, {"link_peak_over_rate": "1.2"}, "link_burst_s: needed with link_peak_over_rate"),
])
def test_bad_settings_are_named(tmp_path: Path, text: str, env: dict, flags: dict, field: str) -> None:
    path = write(tmp_path / "c.toml", text) if text else None
    with pytest.raises(ValueError) as info:
        load_config(path, flags, environ=env)
    assert field in str(info.value)


def test_the_command_refuses_bad_flags_with_exit_2(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "flexcomm.cli", "agent", "--socket", str(tmp_path / "s"),
                          "--db", str(tmp_path / "d.db"), "--flush-interval", "5"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "flush_interval_s: duration '5' needs a unit" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "s").exists()


def test_sd_notify_datagrams(tmp_path: Path) -> None:
    path = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(path)
        assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": path})
        assert listener.recv(100) == b"READY=1"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(f"\0fca-notify-test-{os.getpid()}")  # this run's own abstract name
        assert sdnotify.notify("WATCHDOG=1", {"NOTIFY_SOCKET": f"@fca-notify-test-{os.getpid()}"})
        assert listener.recv(100) == b"WATCHDOG=1"
    assert not sdnotify.notify("READY=1", {})
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval_s({}) is None


@pytest.mark.timeout(60)
def test_a_notify_socket_nobody_reads_never_blocks(tmp_path: Path) -> None:
    """A full receive queue drops the ping instead of blocking the agent's loop
    (a blocked one answered no health check: the agent looked hung)."""
    path = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(path)
        sent = [sdnotify.notify("WATCHDOG=1", {"NOTIFY_SOCKET": path}) for _ in range(50)]
        assert sent[0] and not sent[-1]
        assert listener.recv(100) == b"WATCHDOG=1"


def test_tcp_with_tls(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        skip_or_fail("needs the openssl binary to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=fca-agent",
                    "-addext", "subjectAltName=DNS:fca-agent"], check=True, capture_output=True, timeout=60)
    port = free_port()
    agent = AgentProcess(tmp_path, "--tcp", f"127.0.0.1:{port}", "--tls-cert", str(cert),
                         "--tls-key", str(key)).start()
    try:
        agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("tls-job", policy="dense")), timeout=5)
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        options = [("grpc.ssl_target_name_override", "fca-agent")]
        with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options) as channel:
            d = pb_grpc.AgentStub(channel).GetDecision(pb.JobRef(job_id="tls-job"), timeout=10)
            assert d.collective == pb.COLLECTIVE_DENSE_RING
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError):
            pb_grpc.AgentStub(channel).GetDecision(pb.JobRef(job_id="tls-job"), timeout=3)
    finally:
        agent.stop()


@pytest.mark.parametrize("ceil_over_rate", [1.2, 1.0])
def test_the_lab_tells_its_agents_the_shapers_bucket(tmp_path: Path, ceil_over_rate: float) -> None:
    from flexcomm.cli import build_parser
    from flexcomm.commands.agent import _FLAGS
    from flexcomm.emulation.shaping import RATE_BUCKET_SECONDS, Shaper
    from flexcomm.lab.agents import agent_command

    bucket = Shaper("eth0", ceil_over_rate=ceil_over_rate).bucket
    expected = LinkBucket(1.2, RATE_BUCKET_SECONDS) if ceil_over_rate > 1 else LinkBucket()
    assert bucket == expected
    argv = agent_command(tmp_path / "s.sock", tmp_path / "d.db", probe=False, bucket=bucket)
    args = build_parser().parse_args(argv[argv.index("agent"):])
    config = load_config(None, {name: getattr(args, name) for name in _FLAGS}, environ={})
    assert config.link_bucket() == expected


# -- every key's type, by property ------------------------------------------------
# A TOML value of each kind, as the file would hold it.
TOML_VALUES = {
    "bool": st.booleans().map(lambda b: "true" if b else "false"),
    "int": st.integers(-10**6, 10**6).map(str),
    "float": st.floats(-1e6, 1e6, allow_nan=False).filter(lambda v: not v.is_integer()).map(repr),
    "str": st.text(alphabet="abcxyz:/._-", max_size=10).map(lambda t: f'"{t}"'),
    "list": st.lists(st.integers(0, 9), max_size=3).map(lambda xs: f"[{', '.join(map(str, xs))}]"),
    "table": st.just("{ a = 1 }"),
}


def toml_kinds(kind: str, name: str) -> set[str]:
    """The TOML kinds a setting of annotated type `kind` takes."""
    return {"bool": {"bool"}, "int": {"int"}, "str": {"str"},
            "float": {"int", "float"} | ({"str"} if name.endswith("_s") else set())}[kind]


SETTINGS = [(f.name, f.type) for f in dataclasses.fields(AgentConfig)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(setting=st.sampled_from(SETTINGS), data=st.data())
def test_a_setting_of_the_wrong_type_is_named(tmp_path_factory, setting: tuple[str, str], data) -> None:
    name, kind = setting
    wrong = data.draw(st.sampled_from(sorted(set(TOML_VALUES) - toml_kinds(kind, name))))
    path = tmp_path_factory.mktemp("cfg") / "agent.toml"
    path.write_text(f"[agent]\n{name} = {data.draw(TOML_VALUES[wrong])}\n")
    with pytest.raises(ValueError) as err:
        load_config(str(path), {}, environ={})
    assert str(err.value).startswith(f"{path}: agent.{name}: "), str(err.value)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(setting=st.sampled_from([s for s in SETTINGS if s[1] != "str"]),
       text=st.text(alphabet="abcxyz!%# ", min_size=1, max_size=8))
def test_an_environment_value_that_is_not_of_its_type_is_named(setting: tuple[str, str], text: str) -> None:
    variable = f"FLEXCOMM_AGENT_{setting[0].upper()}"
    with pytest.raises(ValueError) as err:
        load_config(None, {}, environ={variable: text})
    assert str(err.value).startswith(f"{variable}: "), str(err.value)
