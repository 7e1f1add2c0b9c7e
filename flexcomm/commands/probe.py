"""`flexcomm probe`: measure the network to a peer, or read what was measured.

    flexcomm probe PEER [--time 2s] [--streams N] [--reverse] [--json] [--db PATH]
    flexcomm probe history [--db PATH] [--table measurements] [--peer P] [--since 1h] [--json]

`probe PEER` runs one iperf3 test against the iperf3 server on PEER (--port) and
a burst of TCP-connect RTT samples (--latency-port, default the same port), and
prints bandwidth, RTT min/p50/p99/loss, alpha (half the smallest RTT) and beta
(seconds per byte). With --db the measurements are also stored. `probe history`
reads the store (--db, default $FLEXCOMM_DB or /var/lib/flexcomm/flexcomm.db),
newest first. Exit code 1 when a measurement failed.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from typing import Any

from flexcomm.units import format_rate, format_seconds, parse_duration

TABLES = ("measurements", "decisions", "step_reports", "emulation_steps")
EXAMPLES = """examples:
  flexcomm probe 10.0.0.2
  flexcomm probe 10.0.0.2 --time 3s --reverse --db probes.db
  flexcomm probe history --db probes.db --since 1h
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "probe", help="measure bandwidth, RTT, alpha and beta to a peer; or show the history",
        description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("peer", metavar="PEER|history", help="address of a peer running iperf3 -s, or `history`")
    p.add_argument("--db", help="store to record to (PEER) or read (history)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    m = p.add_argument_group("measuring (PEER)")
    m.add_argument("--port", type=int, default=5201, help="the peer's iperf3 port (default 5201)")
    m.add_argument("--latency-port", type=int, help="port for TCP-connect RTT (default: --port)")
    m.add_argument("--time", default="2s", help="iperf3 test length, whole seconds (default 2s)")
    m.add_argument("--streams", "-P", type=int, default=1, help="parallel TCP streams (default 1)")
    m.add_argument("--reverse", "-R", action="store_true", help="measure PEER -> here")
    m.add_argument("--count", type=int, default=10, help="RTT samples (default 10)")
    m.add_argument("--netns", help="measure from inside this network namespace (lab)")
    h = p.add_argument_group("reading (history)")
    h.add_argument("--table", choices=TABLES, default="measurements", help="what to list")
    h.add_argument("--peer", dest="peer_filter", help="only this peer (measurements)")
    h.add_argument("--job", help="only this job (decisions, step_reports)")
    h.add_argument("--since", help="only rows newer than this, e.g. 1h, 30min")
    h.add_argument("--limit", type=int, default=50, help="at most this many rows (default 50)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.peer == "history":
        return history(args)
    return measure(args)


def measure(args: argparse.Namespace) -> int:
    from flexcomm.probe.iperf import IperfError, bandwidth_measurement, run_test
    from flexcomm.probe.latency import latency_measurement, rtt_burst
    from flexcomm.store import Measurement

    duration = parse_duration("time", args.time)
    if duration < 1 or duration != int(duration):
        raise ValueError(f"time: iperf3 runs whole seconds >= 1, got {args.time!r}")
    for name in ("streams", "count"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}: must be >= 1, got {getattr(args, name)}")
    latency = latency_measurement(rtt_burst(args.peer, args.latency_port or args.port,
                                            count=args.count, netns=args.netns))
    try:
        bandwidth = bandwidth_measurement(run_test(
            args.peer, port=args.port, duration_s=duration, streams=args.streams,
            reverse=args.reverse, netns=args.netns))
    except IperfError as exc:
        bandwidth = Measurement(peer=args.peer, kind="bandwidth", ok=False, error=str(exc))
    if args.db:
        from flexcomm.store import Store

        with Store(args.db) as store:
            latency, bandwidth = store.add_measurement(latency), store.add_measurement(bandwidth)
    result = summary(args.peer, bandwidth, latency)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0 if result["ok"] else 1


def summary(peer: str, bandwidth: Any, latency: Any) -> dict[str, Any]:
    return {
        "peer": peer,
        "ok": bandwidth.ok and latency.ok,
        "bandwidth_bps": bandwidth.bandwidth_bps,
        "streams": bandwidth.streams,
        "reverse": bandwidth.reverse,
        "rtt": {"min_s": latency.rtt_min_s, "p50_s": latency.rtt_p50_s,
                "p99_s": latency.rtt_p99_s, "loss": latency.loss},
        "alpha_s": latency.alpha_s,
        "beta_s_per_byte": bandwidth.beta_s_per_byte,
        "errors": [m.error for m in (bandwidth, latency) if not m.ok],
    }


def _maybe(value: float | None, fmt: Any) -> str:
    return "?" if value is None else fmt(value)


def render(r: dict[str, Any]) -> str:
    rtt = r["rtt"]
    direction = " (reverse)" if r["reverse"] else ""
    lines = [
        f"peer {r['peer']}",
        f"  bandwidth  {_maybe(r['bandwidth_bps'], format_rate)}{direction}",
        f"  rtt        min {_maybe(rtt['min_s'], format_seconds)}  p50 {_maybe(rtt['p50_s'], format_seconds)}"
        f"  p99 {_maybe(rtt['p99_s'], format_seconds)}  loss {_maybe(rtt['loss'], '{:.0%}'.format)}",
        f"  alpha      {_maybe(r['alpha_s'], format_seconds)}",
        f"  beta       {_maybe(r['beta_s_per_byte'], '{:.4g} s/B'.format)}",
    ]
    lines += [f"  error      {e}" for e in r["errors"]]
    return "\n".join(lines)


def history(args: argparse.Namespace) -> int:
    from flexcomm.store import Store, default_path

    since = None if args.since is None else time.time() - parse_duration("since", args.since)
    if args.limit < 1:
        raise ValueError(f"limit: must be >= 1, got {args.limit}")
    filters: dict[str, Any] = {}
    if args.peer_filter is not None:
        filters["peer"] = args.peer_filter
    if args.job is not None:
        filters["job_id"] = args.job
    with Store(args.db or default_path(), create=False) as store:
        rows = store.history(args.table, since=since, limit=args.limit, **filters)
    if args.json:
        print(json.dumps({"table": args.table, "rows": rows}, indent=2))
    else:
        print(render_rows(args.table, rows))
    return 0


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def render_rows(table: str, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"no {table} recorded"
    if table != "measurements":
        keys = [k for k in rows[0] if k not in ("id", "ts")]
        return "\n".join(f"{_when(r['ts'])}  " + "  ".join(f"{k}={r[k]}" for k in keys if r[k] is not None)
                         for r in rows)
    from flexcomm.store import LATENCY, TEST_KINDS

    out = []
    beta_fmt = "{:.4g} s/B".format
    for r in rows:
        if not r["ok"]:
            what = f"FAILED: {r['error']}"
        elif r["kind"] == LATENCY:
            what = (f"rtt p50 {_maybe(r['rtt_p50_s'], format_seconds)} p99 {_maybe(r['rtt_p99_s'], format_seconds)} "
                    f"loss {_maybe(r['loss'], '{:.0%}'.format)}  alpha {_maybe(r['alpha_s'], format_seconds)}")
        elif r["kind"] in TEST_KINDS:
            what = f"{_maybe(r['bandwidth_bps'], format_rate)}  beta {_maybe(r['beta_s_per_byte'], beta_fmt)}"
        else:
            what = (f"alpha {_maybe(r['alpha_s'], format_seconds)}  "
                    f"beta {_maybe(r['beta_s_per_byte'], beta_fmt)}")
        out.append(f"{_when(r['ts'])}  {r['peer']:<15} {r['kind']:<9} {what}")
    return "\n".join(out)

