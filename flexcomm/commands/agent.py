"""`flexcomm agent`: run the per-node policy agent (the daemon) in the foreground.

Settings: defaults < --config FILE ([agent] table) < FLEXCOMM_AGENT_* environment
< flags. See docs/CONFIGURATION.md, section Agent, and docs/DEPLOYMENT.md.
"""

from __future__ import annotations

import argparse
import os

EXAMPLES = """examples:
  flexcomm agent --config /etc/flexcomm/agent.toml
  flexcomm agent --socket agent.sock --db agent.db --no-probe
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("agent", help="run the policy agent daemon", description=__doc__,
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="TOML file with an [agent] table")
    p.add_argument("--socket", help="Unix socket path (default $RUNTIME_DIRECTORY/agent.sock)")
    p.add_argument("--socket-group", help="group allowed to connect (socket mode 0660)")
    p.add_argument("--tcp", help="also listen on host:port (TLS unless loopback)")
    p.add_argument("--tls-cert", help="server certificate (PEM)")
    p.add_argument("--tls-key", help="server private key (PEM)")
    p.add_argument("--tls-client-ca", help="require client certificates from this CA (PEM)")
    p.add_argument("--db", help="SQLite store (default $STATE_DIRECTORY/flexcomm.db)")
    p.add_argument("--move-damaged-db", dest="move_damaged_db", action="store_const", const=True,
                   help="a damaged store is moved aside (to DB.damaged-TIME) and a new one started, "
                        "instead of stopping the agent")
    p.add_argument("--metrics", help="Prometheus host:port, or '' to turn off")
    p.add_argument("--flush-interval", dest="flush_interval_s", help="e.g. 1s, 500ms")
    p.add_argument("--retention", dest="retention_s", help="prune measurements and reports older than this, e.g. 30d")
    p.add_argument("--no-probe", dest="probe", action="store_const", const=False,
                   help="do not probe the jobs' nodes")
    p.add_argument("--probe-interval", dest="probe_interval_s", help="latency probes, e.g. 10s")
    p.add_argument("--probe-bandwidth-interval", dest="probe_bandwidth_interval_s",
                   help="bandwidth tests, e.g. 5min")
    p.add_argument("--probe-port", type=int, help="iperf3 port of every node (default 5201)")
    p.add_argument("--probe-look-port", type=int, help="UDP port of every node's look server (default 5202)")
    p.add_argument("--probe-serve-bind", dest="probe_serve_bind",
                   help="serve iperf3 and looks on these addresses or networks, e.g. 10.0.0.0/24 (default: the "
                   "addresses the jobs' nodes reach this node by)")
    p.add_argument("--job-idle-expiry", dest="job_idle_expiry_s",
                   help="end jobs not heard from for this long, e.g. 10min (default 10min)")
    p.add_argument("--link-peak-over-rate", dest="link_peak_over_rate",
                   help="the paths' token bucket: peak rate over the probed rate (default 1.0, plain)")
    p.add_argument("--link-burst", dest="link_burst_s",
                   help="the paths' token bucket: credit at the rate, e.g. 5ms (default 0, plain)")
    p.add_argument("--emulation-schedule", help="epoch-keyed emulation schedule (TOML)")
    p.add_argument("--emulation-interface", help="interface the schedule shapes")
    p.add_argument("--emulation-netns", help="network namespace of that interface")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-format", choices=("json", "text"))
    p.set_defaults(func=run)


_FLAGS = ("socket", "socket_group", "tcp", "tls_cert", "tls_key", "tls_client_ca", "db", "move_damaged_db", "metrics",
          "flush_interval_s", "retention_s", "probe", "probe_interval_s", "probe_bandwidth_interval_s", "probe_port",
          "probe_look_port", "probe_serve_bind", "job_idle_expiry_s",
          "link_peak_over_rate", "link_burst_s", "emulation_schedule",
          "emulation_interface", "emulation_netns", "log_level", "log_format")


def run(args: argparse.Namespace) -> int:
    # gRPC's fork handlers print a non-JSON line to stderr at every fork (each iperf3)
    # while its threads are busy; the agent's children exec at once and need none.
    # Read when gRPC starts, so before the first import of grpc.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    import asyncio

    from flexcomm.agent.config import load_config
    from flexcomm.agent.logs import setup_logging
    from flexcomm.agent.server import serve

    config = load_config(args.config, {name: getattr(args, name) for name in _FLAGS})
    setup_logging(config.log_level, config.log_format)
    return asyncio.run(serve(config))
