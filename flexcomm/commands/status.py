"""`flexcomm status`: what the local agent knows and does.

Everything it listens on; each running job with its current decision and why,
its recent decisions, its bottleneck, and each peer's bandwidth and RTT with
their recent history as a sparkline (oldest to newest). `--all` adds the newest
ended and expired jobs (when and how each ended, its last decision, its
reports; their full history: `flexcomm probe history --table decisions --job ID`).
`--json` prints the same as one JSON object, every figure a number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

EXAMPLES = """examples:
  flexcomm status
  flexcomm status --json --history 20
  flexcomm status --all
"""
SPARK = "▁▂▃▄▅▆▇█"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("status", help="show the agent's listeners, jobs, network and decisions",
                              description=__doc__, epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", help="agent socket (default: the agent's configured socket)")
    p.add_argument("--target", help="host:port of an agent instead of a socket (loopback, no TLS)")
    p.add_argument("--timeout", default="5s", help="RPC timeout (default 5s)")
    p.add_argument("--history", type=int, default=10,
                   help="decisions and probes per peer to show (default 10, at most 1000)")
    p.add_argument("--all", action="store_true", help="also the jobs that ended or expired (the newest 100)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _decision(d: Any) -> dict[str, Any]:
    from flexcomm.proto.convert import decision_from_proto

    out = decision_from_proto(d).to_dict()
    out["decided_unix"] = d.decided_unix
    return out


def _peer(p: Any) -> dict[str, Any]:
    return {"address": p.address, "bandwidth_bps": p.bandwidth_bps, "rtt_s": p.rtt_s,
            "rtt_p99_s": p.rtt_p99_s, "loss": p.loss, "alpha_s": p.alpha_s,
            "beta_s_per_byte": p.beta_s_per_byte, "source": p.source, "updated_unix": p.updated_unix,
            "probe_failures": int(p.probe_failures)}


def _network(state: Any) -> dict[str, Any]:
    b = state.bottleneck
    bottleneck = ({"alpha_s": b.alpha_s, "beta_s_per_byte": b.beta_s_per_byte,
                   "bandwidth_bps": b.bandwidth_bps, "nodes": b.nodes,
                   "peak_over_rate": b.peak_over_rate, "burst_s": b.burst_s, "evidence": b.evidence}
                  if b.known else None)
    return {"peers": [_peer(p) for p in state.peers], "bottleneck": bottleneck}


def _series(samples: Any) -> list[list[float]]:
    return [[s.ts_unix, s.value] for s in samples]


def _job(stub: Any, info: Any, history: int, timeout_s: float) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    from flexcomm.proto import agent_pb2 as pb

    job_id = info.spec.job_id
    net = stub.GetNetwork(pb.GetNetworkRequest(job_id=job_id), timeout=timeout_s)
    past = stub.GetHistory(pb.GetHistoryRequest(job_id=job_id, limit=history), timeout=timeout_s)
    return {
        "job_id": job_id, "world_size": info.spec.world_size, "grad_bytes": info.spec.grad_bytes,
        "nodes": list(info.spec.nodes), "policy": info.spec.policy,
        "options": MessageToDict(info.spec.options), "decision": _decision(info.decision),
        "last_step": info.last_step, "last_epoch": info.last_epoch, "reports": info.reports,
        "registered_unix": info.registered_unix, "last_report_unix": info.last_report_unix,
        "network": _network(net),
        "recent_decisions": [_decision(d) for d in past.decisions],
        "peer_history": {p.address: {"bandwidth_bps": _series(p.bandwidth_bps), "rtt_s": _series(p.rtt_s)}
                         for p in past.peers},
    }


def _ended_job(info: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return {"job_id": info.spec.job_id, "world_size": info.spec.world_size, "grad_bytes": info.spec.grad_bytes,
            "nodes": list(info.spec.nodes), "policy": info.spec.policy,
            "options": MessageToDict(info.spec.options),
            "decision": _decision(info.decision) if info.HasField("decision") else None,
            "last_step": info.last_step, "last_epoch": info.last_epoch, "reports": info.reports,
            "registered_unix": info.registered_unix, "ended_unix": info.ended_unix,
            "end_reason": info.end_reason}


def collect(stub: Any, timeout_s: float, history: int = 10, ended: bool = False) -> dict[str, Any]:
    """The agent's state as plain data (numbers as numbers); `ended`: with the
    jobs that ended ("ended_jobs")."""
    from flexcomm.proto import agent_pb2 as pb

    info = stub.GetAgentInfo(pb.GetAgentInfoRequest(), timeout=timeout_s)
    listed = stub.ListJobs(pb.ListJobsRequest(include_ended=ended), timeout=timeout_s).jobs
    jobs = [_job(stub, j, history, timeout_s) for j in listed if not j.end_reason]
    peers = _network(stub.GetNetwork(pb.GetNetworkRequest(), timeout=timeout_s))["peers"]
    data = {"agent": {"pid": info.pid, "version": info.version, "max_jobs": info.max_jobs,
                      "job_idle_expiry_s": info.job_idle_expiry_s,
                      "listening": [{"kind": x.kind, "address": x.address} for x in info.listeners]},
            "jobs": jobs, "peers": peers}
    if ended:
        data["ended_jobs"] = [_ended_job(j) for j in listed if j.end_reason]
    return data


def sparkline(values: list[float]) -> str:
    """One block character per value, scaled between the series' min and max."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    return "".join(SPARK[0 if span <= 0 else round((v - low) / span * (len(SPARK) - 1))] for v in values)


def _ago(now: float, ts: float) -> str:
    from flexcomm.units import format_seconds

    return f"{format_seconds(max(0.0, now - ts))} ago" if ts else "?"


def _what(d: dict[str, Any]) -> str:
    from flexcomm.policy.types import Compression

    return Compression(d["family"], d["param"]).name


def _render_job(j: dict[str, Any], now: float) -> list[str]:
    from flexcomm.units import format_bytes, format_rate, format_seconds

    d = j["decision"]
    lines = [f"\njob {j['job_id']}  policy={j['policy']}  ranks={j['world_size']}  "
             f"gradient={format_bytes(j['grad_bytes'])}  step={j['last_step']}  "
             f"epoch={j['last_epoch']}  reports={j['reports']}",
             f"  decision v{d['version']}: {_what(d)} over {d['collective']} (root {d['root']}), "
             f"{_ago(now, d['decided_unix'])} — {d['reason']}"]
    earlier = [r for r in j["recent_decisions"]
               if (r["version"], r["decided_unix"]) != (d["version"], d["decided_unix"])]
    if earlier:
        lines.append("  earlier decisions:")
        lines += [f"    v{r['version']:<4} {_ago(now, r['decided_unix']):>12}  {_what(r)} over "
                  f"{r['collective']} — {r['reason']}" for r in earlier]
    b = j["network"]["bottleneck"]
    if b:
        bucket = (f", token bucket {b['peak_over_rate']:g}x for {format_seconds(b['burst_s'])}"
                  if b["peak_over_rate"] > 1 and b["burst_s"] > 0 else "")
        seen = f" (last moved on: {b['evidence']})" if b.get("evidence") else ""
        lines.append(f"  bottleneck: {format_rate(b['bandwidth_bps'])}, alpha "
                     f"{format_seconds(b['alpha_s'])}, {b['nodes']} workers{bucket}{seen}")
    else:
        lines.append("  bottleneck: not measured yet")
    for p in j["network"]["peers"]:
        past = j["peer_history"].get(p["address"], {"bandwidth_bps": [], "rtt_s": []})
        bw = format_rate(p["bandwidth_bps"]) if p["bandwidth_bps"] else "-"
        rtt = format_seconds(p["rtt_s"]) if p["rtt_s"] else "-"
        bw_line = sparkline([v for _, v in past["bandwidth_bps"]])
        rtt_line = sparkline([v for _, v in past["rtt_s"]])
        lines.append(f"    {p['address']:<24} {bw:>12} {bw_line:<10}  rtt {rtt:>9} {rtt_line:<10}  "
                     f"source {p['source']}  probe failures {p['probe_failures']}")
    return lines


def render(data: dict[str, Any], target: str) -> str:
    from flexcomm.units import format_seconds

    a = data["agent"]
    lines = [f"agent {target} (pid {a['pid']}, flexcomm {a['version']}): {len(data['jobs'])} running "
             f"job(s) of at most {a['max_jobs']}, {len(data['peers'])} peer(s); jobs idle for "
             f"{format_seconds(a['job_idle_expiry_s'])} expire",
             "  listening: " + ", ".join(f"{x['kind']} {x['address']}" for x in a["listening"])]
    now = time.time()
    for j in data["jobs"]:
        lines += _render_job(j, now)
    if "ended_jobs" in data:
        lines.append(f"\n{len(data['ended_jobs'])} ended job(s), newest first:")
        lines += [_render_ended(j, now) for j in data["ended_jobs"]]
    return "\n".join(lines)


def _render_ended(j: dict[str, Any], now: float) -> str:
    d = j["decision"]
    last = f"last decision v{d['version']}: {_what(d)} over {d['collective']}" if d else "no decision stored"
    return (f"  {j['job_id']}  {j['end_reason']} {_ago(now, j['ended_unix'])}  policy={j['policy']}  "
            f"ranks={j['world_size']}  step={j['last_step']}  reports={j['reports']}  {last}")


def run(args: argparse.Namespace) -> int:
    import grpc

    from flexcomm.proto import agent_pb2_grpc as pb_grpc
    from flexcomm.proto.validate import MAX_HISTORY
    from flexcomm.units import parse_duration

    timeout_s = parse_duration("timeout", args.timeout, allow_zero=False)
    if not 1 <= args.history <= MAX_HISTORY:
        raise ValueError(f"history: must be in 1..{MAX_HISTORY}, got {args.history}")
    if args.target:
        target = args.target
    else:
        from flexcomm.agent.config import load_config

        target = f"unix:{args.socket or load_config().socket}"
    with grpc.insecure_channel(target) as channel:
        try:
            data = collect(pb_grpc.AgentStub(channel), timeout_s, args.history, ended=args.all)
        except grpc.RpcError as exc:
            print(f"flexcomm status: cannot reach the agent at {target}: {exc.code().name} "
                  f"{exc.details() or ''}".rstrip(), file=sys.stderr)
            return 1
    print(json.dumps(data, indent=2) if args.json else render(data, target))
    return 0
