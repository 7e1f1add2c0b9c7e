"""`flexcomm status`: what the local agent knows — jobs, their network and their
current decisions (`--json` for scripts)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("status", help="show the agent's jobs, network and decisions",
                              description=__doc__.splitlines()[0])
    p.add_argument("--socket", help="agent socket (default: the agent's configured socket)")
    p.add_argument("--target", help="host:port of an agent instead of a socket (loopback, no TLS)")
    p.add_argument("--timeout", default="5s", help="RPC timeout (default 5s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _decision(d: Any) -> dict[str, Any]:
    from flexcomm.proto.convert import decision_from_proto

    out = decision_from_proto(d).to_dict()
    out["decided_unix"] = d.decided_unix
    return out


def _network(state: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    peers = [MessageToDict(p, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
             for p in state.peers]
    b = state.bottleneck
    bottleneck = ({"alpha_s": b.alpha_s, "beta_s_per_byte": b.beta_s_per_byte,
                   "bandwidth_bps": b.bandwidth_bps, "nodes": b.nodes,
                   "peak_over_rate": b.peak_over_rate, "burst_s": b.burst_s} if b.known else None)
    return {"peers": peers, "bottleneck": bottleneck}


def collect(stub: Any, timeout_s: float) -> dict[str, Any]:
    """The agent's state as plain data."""
    from google.protobuf.json_format import MessageToDict

    from flexcomm.proto import agent_pb2 as pb

    jobs = []
    for info in stub.ListJobs(pb.ListJobsRequest(), timeout=timeout_s).jobs:
        net = stub.GetNetwork(pb.GetNetworkRequest(job_id=info.spec.job_id), timeout=timeout_s)
        jobs.append({
            "job_id": info.spec.job_id, "world_size": info.spec.world_size,
            "grad_bytes": info.spec.grad_bytes, "nodes": list(info.spec.nodes),
            "policy": info.spec.policy, "options": MessageToDict(info.spec.options),
            "decision": _decision(info.decision), "last_step": info.last_step,
            "last_epoch": info.last_epoch, "reports": info.reports,
            "registered_unix": info.registered_unix, "last_report_unix": info.last_report_unix,
            "network": _network(net),
        })
    peers = _network(stub.GetNetwork(pb.GetNetworkRequest(), timeout=timeout_s))["peers"]
    return {"jobs": jobs, "peers": peers}


def render(data: dict[str, Any], target: str) -> str:
    from flexcomm.policy.types import Compression
    from flexcomm.units import format_bytes, format_rate, format_seconds

    lines = [f"agent {target}: {len(data['jobs'])} job(s), {len(data['peers'])} peer(s)"]
    now = time.time()
    for j in data["jobs"]:
        d = j["decision"]
        what = Compression(d["family"], d["param"]).name
        lines.append(f"\njob {j['job_id']}  policy={j['policy']}  ranks={j['world_size']}  "
                     f"gradient={format_bytes(j['grad_bytes'])}  step={j['last_step']}  "
                     f"epoch={j['last_epoch']}  reports={j['reports']}")
        age = format_seconds(max(0.0, now - d["decided_unix"])) if d["decided_unix"] else "?"
        lines.append(f"  decision v{d['version']}: {what} over {d['collective']} (root {d['root']}), "
                     f"{age} ago — {d['reason']}")
        b = j["network"]["bottleneck"]
        if b:
            bucket = (f", token bucket {b['peak_over_rate']:g}x for {format_seconds(b['burst_s'])}"
                      if b["peak_over_rate"] > 1 and b["burst_s"] > 0 else "")
            lines.append(f"  bottleneck: {format_rate(b['bandwidth_bps'])}, alpha "
                         f"{format_seconds(b['alpha_s'])}, {b['nodes']} workers{bucket}")
        else:
            lines.append("  bottleneck: not measured yet")
        for p in j["network"]["peers"]:
            bw = format_rate(p["bandwidth_bps"]) if p["bandwidth_bps"] else "-"
            rtt = format_seconds(p["rtt_s"]) if p["rtt_s"] else "-"
            lines.append(f"    {p['address']:<24} {bw:>12}  rtt {rtt:>9}  source {p['source']}  "
                         f"probe failures {p['probe_failures']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import grpc

    from flexcomm.proto import agent_pb2_grpc as pb_grpc
    from flexcomm.units import parse_duration

    timeout_s = parse_duration("timeout", args.timeout, allow_zero=False)
    if args.target:
        target = args.target
    else:
        from flexcomm.agent.config import load_config

        target = f"unix:{args.socket or load_config().socket}"
    with grpc.insecure_channel(target) as channel:
        try:
            data = collect(pb_grpc.AgentStub(channel), timeout_s)
        except grpc.RpcError as exc:
            print(f"flexcomm status: cannot reach the agent at {target}: {exc.code().name} "
                  f"{exc.details() or ''}".rstrip(), file=sys.stderr)
            return 1
    print(json.dumps(data, indent=2) if args.json else render(data, target))
    return 0
