"""The agent's configuration: defaults, then a TOML file, then environment
variables, then command-line flags (each overriding the one before).

The file has one `[agent]` table whose keys are the fields of `AgentConfig`;
the environment variable for a key is FLEXCOMM_AGENT_<KEY> (upper case), e.g.
FLEXCOMM_AGENT_SOCKET=/tmp/a.sock. Under systemd, $RUNTIME_DIRECTORY and
$STATE_DIRECTORY set the default socket and database locations.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from flexcomm.files import read_text
from flexcomm.policy.types import LinkBucket
from flexcomm.probe.addresses import parse_networks
from flexcomm.probe.iperf import ClientAuth, ServerAuth
from flexcomm.probe.scheduler import DUTY_CYCLE, LOOK_DUTY_CYCLE
from flexcomm.probe.train import DEFAULT_LOOK_PORT
from flexcomm.units import parse_duration, require_finite_positive

ENV_PREFIX = "FLEXCOMM_AGENT_"
LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_SOCKET_PATH_BYTES = 107  # Linux's sun_path holds 108 bytes, the last a NUL


def _runtime_dir(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("RUNTIME_DIRECTORY", "/run/flexcomm").split(":")[0]


def _state_dir(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("STATE_DIRECTORY", "/var/lib/flexcomm").split(":")[0]


@dataclass(frozen=True)
class AgentConfig:
    """Every setting of `flexcomm agent` (docs/CONFIGURATION.md, section Agent)."""

    # Unix socket the API listens on; mode 0600 (owner only), or 0660 with socket_group.
    socket: str = ""
    socket_group: str = ""
    # Optional TCP listener "host:port" for peer agents; needs TLS unless on loopback.
    tcp: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # CA that client certificates must chain to (mutual TLS when set).
    tls_client_ca: str = ""
    db: str = ""
    # A store that fails its check at start (damaged) is renamed to
    # <db>.damaged-<time> and a new one started; false: the agent stops.
    move_damaged_db: bool = False
    # Prometheus /metrics "host:port"; "" turns it off.
    metrics: str = "127.0.0.1:9464"
    # How often aggregated step reports and dirty policy state are written.
    flush_interval_s: float = 1.0
    # Measurements, decisions, step reports and emulation steps older than this are
    # pruned (hourly); jobs and their policy state are kept.
    retention_s: float = 30 * 86400.0
    # Probe the nodes of registered jobs (iperf3 and TCP RTT).
    probe: bool = True
    # Latency probes every probe_interval_s; bandwidth tests (iperf3, within a 1%
    # duty cycle) every probe_bandwidth_interval_s, and at once when a job's own
    # sync times move. A test is sized to take probe_sized_test_s at the rate a
    # 256 KB pilot reads; with probe_sized_test_s 0 each runs probe_test_duration_s.
    probe_interval_s: float = 10.0
    probe_bandwidth_interval_s: float = 300.0
    probe_test_duration_s: float = 1.0
    probe_sized_test_s: float = 0.15
    # Looks (short packet trains: has the path moved?) for jobs whose syncs cannot
    # show it take at most this share of wall time; 0: none.
    probe_look_duty_cycle: float = LOOK_DUTY_CYCLE
    # A job's first estimate may start from a probe of its peers at most this old.
    max_probe_age_s: float = 60.0
    probe_port: int = 5201
    # UDP port of every node's look server (packet trains).
    probe_look_port: int = DEFAULT_LOOK_PORT
    # Run iperf3 servers on probe_port, and look servers on probe_look_port, for the
    # other nodes' agents.
    probe_serve: bool = True
    # Where they listen: comma-separated addresses or networks of this node ("10.0.0.0/24"),
    # one server per matching address; "" = the addresses the jobs' nodes reach this node by.
    probe_serve_bind: str = ""
    # iperf3's own authentication of the tests this node serves: RSA private key (PEM)
    # and authorized users file, given together.
    probe_auth_private_key: str = ""
    probe_auth_users: str = ""
    # ... and of the tests this node runs against its peers: user name, the peers' RSA
    # public key (PEM), a file holding the password; given together.
    probe_auth_username: str = ""
    probe_auth_public_key: str = ""
    probe_auth_password_file: str = ""
    # The paths' token bucket, when they have one (a policed cloud NIC, tc shaping):
    # after idle a link runs at link_peak_over_rate times its probed rate until
    # link_burst_s of that rate is spent. 1.0 and 0: a plain link. Links shaped by
    # flexcomm (emulate, the lab) have 1.2 and 5ms.
    link_peak_over_rate: float = 1.0
    link_burst_s: float = 0.0
    # An epoch-keyed emulation schedule (TOML) advanced by the jobs' reported epochs.
    emulation_schedule: str = ""
    emulation_interface: str = ""
    emulation_netns: str = ""
    max_jobs: int = 1024
    # A job the agent has not heard from for this long (its process died without
    # ending it) is ended as expired: it leaves the agent, its history stays.
    job_idle_expiry_s: float = 600.0
    log_level: str = "info"
    log_format: str = "json"

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: fill in the location defaults once
        if not self.socket:
            set_(self, "socket", str(Path(_runtime_dir()) / "agent.sock"))
        if not self.db:
            set_(self, "db", str(Path(_state_dir()) / "flexcomm.db"))
        self.validate()

    def validate(self) -> None:
        socket_bytes = len(os.fsencode(self.socket))
        if socket_bytes > MAX_SOCKET_PATH_BYTES:
            raise ValueError(f"socket: {self.socket[:40]}... is {socket_bytes} bytes long; a Unix socket "
                             f"path holds at most {MAX_SOCKET_PATH_BYTES}")
        require_finite_positive("flush_interval_s", self.flush_interval_s)
        require_finite_positive("retention_s", self.retention_s)
        require_finite_positive("probe_interval_s", self.probe_interval_s)
        require_finite_positive("probe_bandwidth_interval_s", self.probe_bandwidth_interval_s)
        require_finite_positive("max_probe_age_s", self.max_probe_age_s)
        require_finite_positive("job_idle_expiry_s", self.job_idle_expiry_s)
        parse_networks("probe_serve_bind", self.probe_serve_bind)
        self.server_auth()
        self.client_auth()
        if self.probe_test_duration_s < 1 or not float(self.probe_test_duration_s).is_integer():
            raise ValueError(f"probe_test_duration_s: iperf3 runs whole seconds >= 1, "
                             f"got {self.probe_test_duration_s!r}")
        if not (math.isfinite(self.probe_look_duty_cycle) and 0 <= self.probe_look_duty_cycle <= DUTY_CYCLE):
            raise ValueError(f"probe_look_duty_cycle: must be in [0, {DUTY_CYCLE:g}] (the probes' whole "
                             f"duty cycle), got {self.probe_look_duty_cycle!r}")
        if not (math.isfinite(self.probe_sized_test_s) and 0 <= self.probe_sized_test_s <= self.probe_test_duration_s):
            raise ValueError(f"probe_sized_test_s: must be in [0, probe_test_duration_s], "
                             f"got {self.probe_sized_test_s!r}")
        for name in ("probe_port", "probe_look_port"):
            if not 0 < getattr(self, name) < 65536:
                raise ValueError(f"{name}: must be in 1..65535, got {getattr(self, name)}")
        self.link_bucket()
        if self.max_jobs < 1:
            raise ValueError(f"max_jobs: must be >= 1, got {self.max_jobs}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level: must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format: must be json or text, got {self.log_format!r}")
        if self.metrics:
            split_host_port("metrics", self.metrics)
        if self.tcp:
            host, _ = split_host_port("tcp", self.tcp)
            if not (self.tls_cert and self.tls_key) and not _is_loopback(host):
                raise ValueError(f"tcp: {self.tcp} is not loopback; set tls_cert and tls_key")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_key: tls_cert and tls_key must be given together")
        if self.emulation_schedule and not self.emulation_interface:
            raise ValueError("emulation_interface: needed with emulation_schedule")

    def server_auth(self) -> ServerAuth | None:
        """iperf3 authentication of served tests, or None (ValueError naming the key)."""
        given = _given(self, "probe_auth_private_key", "probe_auth_users")
        _readable(self, "probe_auth_private_key", "probe_auth_users")
        return ServerAuth(*given) if given else None

    def client_auth(self) -> ClientAuth | None:
        """iperf3 authentication of this node's own tests, or None."""
        given = _given(self, "probe_auth_username", "probe_auth_public_key", "probe_auth_password_file")
        _readable(self, "probe_auth_public_key", "probe_auth_password_file")
        return ClientAuth(*given) if given else None

    def link_bucket(self) -> LinkBucket:
        """The token bucket the cost model gives every path (ValueError naming the key)."""
        return LinkBucket.checked(self.link_peak_over_rate, self.link_burst_s,
                                  ("link_peak_over_rate", "link_burst_s"))


def _given(config: AgentConfig, *keys: str) -> tuple[str, ...]:
    """The values of `keys`, all set, or () when none is; ValueError naming the first missing."""
    values = tuple(getattr(config, k) for k in keys)
    if not any(values):
        return ()
    missing = [k for k, v in zip(keys, values, strict=True) if not v]
    if missing:
        raise ValueError(f"{missing[0]}: needed with {', '.join(k for k in keys if k not in missing)} "
                         f"(give {', '.join(keys)} together)")
    return values


def _readable(config: AgentConfig, *keys: str) -> None:
    for key in keys:
        path = getattr(config, key)
        if path and not os.access(path, os.R_OK):
            raise ValueError(f"{key}: cannot read {path}")


def split_host_port(field: str, text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{field}: expected host:port, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _coerce(name: str, kind: Any, value: Any) -> Any:
    """A value from TOML or the environment as the field's type, or ValueError."""
    kind = {"str": str, "int": int, "float": float, "bool": bool}.get(kind, kind)
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    if kind is float:
        if name.lower().endswith("_s") and isinstance(value, str):  # FLEXCOMM_AGENT_..._S too
            return parse_duration(name, value)
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected an integer, got {value!r}") from None
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a string, got {value!r}")
    return value


def _field_types() -> dict[str, Any]:
    return {f.name: f.type for f in fields(AgentConfig)}


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The `[agent]` table of a TOML file, with unknown keys refused."""
    try:
        text = read_text(path)
    except ValueError as exc:
        raise ValueError(f"config: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config: {path}: not valid TOML: {exc}") from None
    table = data.get("agent", {})
    if not isinstance(table, dict):
        raise ValueError(f"config: {path}: agent must be a table ([agent]), got {table!r:.40}")
    unknown = (set(data) - {"agent"}) | (set(table) - set(_field_types()))
    if unknown:
        raise ValueError(f"config: unknown key(s) in {path}: {', '.join(sorted(unknown))}")
    return {k: _coerce(f"{path}: agent.{k}", _field_types()[k], v) for k, v in table.items()}


def read_env(environ: Mapping[str, str]) -> dict[str, Any]:
    types = _field_types()
    out = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in types:
            raise ValueError(f"{key}: not an agent setting (known: {', '.join(sorted(types))})")
        out[name] = _coerce(key, types[name], value)
    return out


def load_config(path: str | None = None, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Defaults < file < environment < `overrides` (flags; None values ignored)."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {"socket": str(Path(_runtime_dir(env)) / "agent.sock"),
                              "db": str(Path(_state_dir(env)) / "flexcomm.db")}
    if path:
        values.update(read_file(path))
    values.update(read_env(env))
    types = _field_types()
    for k, v in (overrides or {}).items():
        if v is not None:
            values[k] = _coerce(k, types[k], v)
    return AgentConfig(**values)


def as_dict(config: AgentConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)
