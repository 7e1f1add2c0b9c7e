"""Load on a real agent process: 64 concurrent clients, each its own job and channel.

The agent runs as deployed: MOO jobs, probes on. It runs in a network
namespace on a bridge with four peer namespaces, each serving iperf3 behind a
link shaped (HTB) to 50, 200, 500 or 1,000 Mbit/s; job i spans the agent's
node and peer i % 4, so the agent probes all four (latency and bandwidth tests
on their own schedule and duty budget). Each job's reports follow its
decisions as rank 0's would: the family, parameter and collective of the latest
decision the client got, a sync time for that option on the job's own link
(the model's time at the peer's rate, +-5% noise per step), the probes' gains
on every 10th report (once per control interval), and the job's own network
estimate with every message (its peer's rate, +-2%). Needs root (the
namespaces; iperf3 installed).

Phases (each client a task in one of two load-generator processes, so the
generator is not one GIL):
1. warm-up (mixed load);
2. get-decision latency at a fixed total rate (default 2,000 calls/s, open loop:
   each client sends on its own schedule whatever the answers do);
3. report ingest: every client streams batches of such reports as fast as it
   can; the figure is reports accepted by the agent per second;
4. the mixed load for 10 s (get-decision plus 64 x 100 reports/s), the agent's
   RSS, a soak (default 60 s) of that same load, whose get-decision latency is
   the mixed-load figure, and the RSS again: a leak shows as growth; the ingest
   burst's high-water mark does not count;
5. for comparison, ingest of reports that follow nothing, the form earlier
   figures were taken with: identical dense reports (the dense sync time of the
   job's link), every gain on each, no estimate
   (detail.ingest_identical_dense_reports_per_s);
6. ingest per message form, 8 clients (detail.ingest_forms: reports/s for one
   report a message, 256 x 8 messages a stream, one 4,096-report message a
   stream), and get-decision latency at the full rate from 8 clients that each
   stream 4,096-report messages (detail.large_messages_p99_ms: a large message
   must not hold the loop).
With --agent-cpus the agent (every thread, and the probes it starts) runs on
those cores and the load generators on the rest, as on a node whose training
processes run beside it; by default all share every core.
The same latency at a quarter of the rate is reported too (detail.light_*), and
the time inside the agent's handler from its own histogram (detail.handler_*:
the upper bound of the bucket holding p50/p99), to tell the agent's own cost
from queueing on a saturated machine.

Goals: get-decision p99 <= 5 ms alone and under the mixed load, >= 25,000
reports/s, RSS growth < 10%. The agent, the load generators, the probes and
whatever else runs on the machine share its cores: say so with the figures.
Last line: one JSON object with p50_ms, p99_ms, mixed_p99_ms, reports_per_s,
rss_growth (a fraction), the goals, which were met, and the details.

    python bench/agent_load.py [--clients 64] [--rate 2000] [--soak-s 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import grpc

from flexcomm.emulation.shaping import LinkState, Shaper
from flexcomm.lab.cluster import can_use_namespaces
from flexcomm.lab.netns import Node, cluster
from flexcomm.policy.costmodel import option_sync_time
from flexcomm.policy.types import DENSE_FP32, DENSE_RING, Compression, GradientLayout, NetworkObservation
from flexcomm.probe.iperf import IperfServer
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc
from flexcomm.proto.convert import collective_from_enum
from flexcomm.store import Store
from support.agent_process import AgentProcess, free_port, in_namespace, metrics_text, spec

PREFIX, SUBNET = "fcbal", "10.243.0.0/24"
GENERATORS = 2
GRAD_BYTES = 100_000_000
LAYOUT = GradientLayout.flat(GRAD_BYTES)
ALPHA_S = 1e-4  # the latency the jobs report (the veths' own is below it)
PEER_RATES_BPS = (50e6, 200e6, 500e6, 1e9)  # job i's link: to peer i % 4, at its rate
GAINS_EVERY = 10  # reports between two that carry the probes' gains (the control interval)


# Message forms of the ingest figures: (reports a message, messages a stream).
INGEST_FORMS = {"1x1": (1, 1), "256x8": (256, 8), "4096x1": (4096, 1)}
FORM_CLIENTS = 8
CALL_TIMEOUT_S = 5.0


def job_id(i: int) -> str:
    return f"load-{i:03d}"


def job_network(job: str) -> tuple[float, float]:
    return ALPHA_S, PEER_RATES_BPS[int(job.rsplit("-", 1)[1]) % len(PEER_RATES_BPS)]


def link_sync_s(c: Compression, collective: str, network: tuple[float, float]) -> float:
    """The model's sync time of an option on a job's two-node link (alpha, bits/s)."""
    return option_sync_time(c, collective, LAYOUT, NetworkObservation.from_link(*network, 2))


def following_batch(d: pb.Decision, network: tuple[float, float], size: int, first_step: int,
                    rng: random.Random) -> pb.ReportStepsRequest:
    """`size` reports of a job running decision `d` on `network`, as rank 0 sends them."""
    c = Compression(d.family, d.param)
    t_sync = link_sync_s(c, collective_from_enum(d.collective), network)
    gains = [pb.Gain(compression=name, gain=min(1.0, Compression.parse(name).cr ** 0.15)) for name in d.probes]
    gain = next((g.gain for g in gains if g.compression == c.name), 1.0)
    return pb.ReportStepsRequest(reports=[
        pb.StepReport(step=first_step + k, epoch=0, family=d.family, param=d.param, collective=d.collective,
                      t_comp_s=0.01 if c.lossy else 0.0, t_sync_s=t_sync * rng.uniform(0.95, 1.05),
                      t_compute_s=0.1, gain=gain, bytes_sent=int(GRAD_BYTES * c.cr),
                      gains=gains if (first_step + k) % GAINS_EVERY == 0 else [])
        for k in range(size)])


def identical_dense_batch(network: tuple[float, float], size: int) -> pb.ReportStepsRequest:
    """Identical dense reports (the dense sync time of the job's link) with every
    gain and no network estimate, whatever the decision."""
    gains = [pb.Gain(compression=f"topk:{c!r}", gain=min(1.0, c ** 0.15)) for c in (0.1, 0.033, 0.011, 0.004, 0.001)]
    t_sync = link_sync_s(DENSE_FP32, DENSE_RING, network)
    return pb.ReportStepsRequest(reports=[
        pb.StepReport(step=k, epoch=0, family="dense", collective=pb.COLLECTIVE_DENSE_RING, t_comp_s=0.0,
                      t_sync_s=t_sync, t_compute_s=0.1, gain=1.0, bytes_sent=GRAD_BYTES, gains=gains)
        for k in range(size)])


async def _decisions(stub, job: str, interval_s: float, deadline: float, out: list[float]) -> None:
    request = pb.JobRef(job_id=job)
    next_t = time.perf_counter() + random.uniform(0, interval_s)
    while next_t < deadline:
        await asyncio.sleep(max(0.0, next_t - time.perf_counter()))
        t0 = time.perf_counter()
        try:
            await stub.GetDecision(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:  # counted as the timeout: a miss, not a crash of the bench
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        out.append(time.perf_counter() - t0)
        next_t += interval_s


async def _reports(stub, job: str, batch: int, per_rpc: int, pause_s: float, deadline: float,
                   out: list[int], identical: bool) -> None:
    """Stream reports; unless `identical`, each message follows the decision the
    last answer carried (a message is built once per decision: building one
    per call would make the generators, not the agent, the bottleneck)."""
    rng = random.Random(job)
    alpha, bandwidth = job_network(job)
    decision = await stub.GetDecision(pb.JobRef(job_id=job), timeout=30)
    built: dict[int, pb.ReportStepsRequest] = {}
    step = 0
    while time.perf_counter() < deadline:
        if identical:
            message = built.setdefault(0, identical_dense_batch((alpha, bandwidth), batch))
        else:
            if decision.version not in built:
                built = {decision.version: following_batch(decision, (alpha, bandwidth), batch, step, rng)}
            message = built[decision.version]
            message.network.alpha_s = alpha
            message.network.bandwidth_bps = bandwidth * rng.uniform(0.98, 1.02)
        message.job_id = job
        try:
            response = await stub.ReportSteps(iter([message] * per_rpc), timeout=30)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            return  # not acknowledged within 30 s: nothing of it counts
        out.append(response.accepted)
        decision = response.decision
        step += batch * per_rpc
        if pause_s:
            await asyncio.sleep(pause_s)


async def _generator(socket: str, jobs: list[str], phase: dict) -> dict:
    channels = [grpc.aio.insecure_channel(f"unix:{socket}") for _ in jobs]
    stubs = [pb_grpc.AgentStub(ch) for ch in channels]
    latencies: list[float] = []
    accepted: list[int] = []
    deadline = time.perf_counter() + phase["duration_s"]
    tasks = []
    for stub, job in zip(stubs, jobs, strict=True):
        if phase.get("rate"):
            interval = phase["clients"] / phase["rate"]
            tasks.append(_decisions(stub, job, interval, deadline, latencies))
        if phase.get("report_batch"):
            tasks.append(_reports(stub, job, phase["report_batch"], phase["per_rpc"],
                                  phase.get("report_pause_s", 0.0), deadline, accepted,
                                  phase.get("identical", False)))
    start = time.perf_counter()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    for ch in channels:
        await ch.close()
    return {"latencies": latencies, "accepted": sum(accepted), "elapsed": elapsed}


def run_generator(args: tuple[str, list[str], dict]) -> dict:
    return asyncio.run(_generator(*args))


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` onto `cpus` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def cpu_split(agent_cpus: str | None) -> tuple[set[int], set[int]] | None:
    """(the agent's cores, the generators') for --agent-cpus "0" or "0,1", or None."""
    if agent_cpus is None:
        return None
    mine = os.sched_getaffinity(0)
    try:
        agent = {int(c) for c in agent_cpus.split(",")}
    except ValueError:
        raise SystemExit(f"agent_load: --agent-cpus: not a list of core numbers: {agent_cpus!r}") from None
    rest = mine - agent
    if not agent <= mine or not rest:
        raise SystemExit(f"agent_load: --agent-cpus: {sorted(agent)} must be some, not all, of the cores "
                         f"this process may use ({sorted(mine)})")
    return agent, rest


def run_phase(pool: ProcessPoolExecutor, socket: str, clients: int, phase: dict) -> dict:
    phase = {**phase, "clients": clients}
    shards = [[job_id(i) for i in range(clients) if i % GENERATORS == g] for g in range(GENERATORS)]
    parts = list(pool.map(run_generator, [(socket, shard, phase) for shard in shards]))
    latencies = sorted(x for p in parts for x in p["latencies"])
    elapsed = max(p["elapsed"] for p in parts)
    return {"latencies": latencies, "accepted": sum(p["accepted"] for p in parts), "elapsed": elapsed}


def handler_buckets(metrics: str, method: str = "GetDecision") -> dict[float, float]:
    """The agent's own histogram of time inside the handler (no transport), cumulative."""
    pattern = re.compile(r'flexcomm_agent_rpc_latency_seconds_bucket\{le="([^"]+)",method="'
                         + method + r'"\} ([0-9.e+]+)')
    return {float(le): float(n) for le, n in pattern.findall(metrics)}


def counter(metrics: str, name: str) -> float:
    """The sum of a counter's samples, all labels."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", metrics, re.M))


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """Upper bound (s) of the bucket holding quantile q of the calls between two reads."""
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts[math.inf]
    return next(le for le, n in counts.items() if n >= q * total)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def probed_peers(nodes: list[Node], port: int, stack: ExitStack) -> list[str]:
    """Peers 1.. serving iperf3 on `port`, each behind its PEER_RATES_BPS link
    (shaped on the bridge's side: what the peer receives, as a bandwidth test sends)."""
    for node, rate in zip(nodes, PEER_RATES_BPS, strict=True):
        Shaper(node.peer_ifname, netns=node.peer_ns).apply(LinkState(rate))
        stack.enter_context(IperfServer(port, bind=node.address, netns=node.ns))
    return [node.address for node in nodes]


def probes_run(db: Path, since: float) -> dict[str, int]:
    """The probes the agent ran since `since`, by kind, from its store."""
    with Store(db, create=False) as store:
        found = store.measurements(since=since, limit=10**6)
    return {kind: sum(m.kind == kind for m in found) for kind in sorted({m.kind for m in found})}


def peer_figures(agent: AgentProcess, peers: list[str]) -> list[dict]:
    """What the agent knows of each peer (rate probed against the shaped one) and
    the bottleneck of the first job on it."""
    rows = []
    for i, (address, rate) in enumerate(zip(peers, PEER_RATES_BPS, strict=True)):
        state = agent.stub.GetNetwork(pb.GetNetworkRequest(job_id=job_id(i)), timeout=10)
        peer = next(p for p in state.peers if p.address == address)
        rows.append({"address": address, "shaped_bps": rate, "probed_bps": round(peer.bandwidth_bps),
                     "rtt_s": peer.rtt_s, "failures": peer.probe_failures,
                     "bottleneck_bps": round(state.bottleneck.bandwidth_bps),
                     "evidence": state.bottleneck.evidence})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rate", type=float, default=2000.0, help="get-decision calls/s in all")
    parser.add_argument("--latency-s", type=float, default=20.0)
    parser.add_argument("--ingest-s", type=float, default=15.0)
    parser.add_argument("--soak-s", type=float, default=60.0)
    parser.add_argument("--policy", default="moo")
    parser.add_argument("--agent-cpus", help='cores for the agent alone, e.g. "0"; the load generators '
                        "get the rest (default: all share every core)")
    parser.add_argument("--prefix", default=PREFIX, help="namespace name prefix")
    parser.add_argument("--subnet", default=SUBNET, help="the namespaces' subnet")
    args = parser.parse_args()
    usable, why = can_use_namespaces()
    if not usable:
        raise SystemExit(f"agent_load: needs network namespaces for the peers it probes: {why}")
    port = free_port()
    with cluster(args.prefix, 1 + len(PEER_RATES_BPS), args.subnet) as nodes, ExitStack() as stack:
        result = measure(args, nodes[0], probed_peers(nodes[1:], port, stack), port)
    print(f"get-decision at {result['detail']['achieved_rate']}/s: p50 {result['p50_ms']} ms, "
          f"p99 {result['p99_ms']} ms; with reports alongside (mixed) p99 {result['mixed_p99_ms']} ms; "
          f"ingest {result['reports_per_s']} reports/s following decisions "
          f"({result['detail']['ingest_identical_dense_reports_per_s']} of identical dense ones); "
          f"RSS {result['detail']['rss_before_mb']} -> {result['detail']['rss_after_mb']} MB "
          f"({result['rss_growth']:+.1%}) over a {args.soak_s:.0f} s soak; probes {result['detail']['probes']}")
    print(json.dumps(result))


def measure(args: argparse.Namespace, here: Node, peers: list[str], port: int) -> dict:
    """The phases against an agent in `here`'s namespace whose jobs span `peers`."""
    workdir = Path(tempfile.mkdtemp(prefix="fca-bench-"))
    agent = AgentProcess(workdir, "--log-level", "warning", "--flush-interval", "1s",
                         "--probe-port", str(port), probe=True)
    in_namespace(agent, here, probe=True)
    started = time.time()
    agent.start()
    split = cpu_split(args.agent_cpus)
    try:
        if split:
            pin(agent.proc.pid, split[0])
        for i in range(args.clients):
            agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec(
                job_id(i), policy=args.policy, grad_bytes=GRAD_BYTES,
                nodes=[here.address, peers[i % len(peers)]])), timeout=10)
        on_rest = {"initializer": os.sched_setaffinity, "initargs": (0, split[1])} if split else {}
        with ProcessPoolExecutor(GENERATORS, **on_rest) as pool:
            steady_reports = {"report_batch": 100, "per_rpc": 1, "report_pause_s": 1.0}

            def phase(**kw: object) -> dict:
                return run_phase(pool, agent.socket, args.clients, kw)

            phase(duration_s=5, rate=args.rate, **steady_reports)
            seen = {"buckets_before": handler_buckets(metrics_text(agent, here))}
            seen["lat"] = phase(duration_s=args.latency_s, rate=args.rate)
            seen["buckets_after"] = handler_buckets(metrics_text(agent, here))
            seen["light"] = phase(duration_s=args.latency_s / 2, rate=args.rate / 4)
            seen["ingest"] = phase(duration_s=args.ingest_s, report_batch=256, per_rpc=8)
            phase(duration_s=10, rate=args.rate, **steady_reports)  # back to steady state
            seen["rss_before"] = rss_bytes(agent.proc.pid)
            seen["soak"] = phase(duration_s=args.soak_s, rate=args.rate, **steady_reports)
            time.sleep(2)  # let the last flush happen
            seen["rss_after"] = rss_bytes(agent.proc.pid)
            seen["metrics"] = metrics_text(agent, here)
            seen["peers"] = peer_figures(agent, peers)
            seen["jobs"] = agent.stub.ListJobs(pb.ListJobsRequest(), timeout=10).jobs
            seen["identical"] = phase(duration_s=args.ingest_s / 3, report_batch=256, per_rpc=8, identical=True)
            # 8 clients: 64 streams of 4,096-report messages are more than a 30 s deadline holds here
            seen["forms"] = {name: run_phase(pool, agent.socket, FORM_CLIENTS, {
                "duration_s": args.ingest_s / 3, "report_batch": batch, "per_rpc": per_rpc})
                for name, (batch, per_rpc) in INGEST_FORMS.items()}
            seen["large"] = run_phase(pool, agent.socket, FORM_CLIENTS, {
                "duration_s": args.latency_s / 2, "rate": args.rate, "report_batch": 4096, "per_rpc": 1})
        assert agent.health() == 1
    finally:
        agent.stop()
    seen["probes"] = probes_run(Path(agent.db), started)
    return summarise(args, seen)


def summarise(args: argparse.Namespace, seen: dict) -> dict:
    """The figures, goals and details from what `measure` saw."""
    lat, light, ingest, soak, identical = (seen[k] for k in ("lat", "light", "ingest", "soak", "identical"))
    rss_before, rss_after, jobs = seen["rss_before"], seen["rss_after"], seen["jobs"]
    calls = lat["latencies"]
    soak_calls = soak["latencies"]
    figures = {
        "p50_ms": round(percentile(calls, 0.50) * 1e3, 3),
        "p99_ms": round(percentile(calls, 0.99) * 1e3, 3),
        "mixed_p99_ms": round(percentile(soak_calls, 0.99) * 1e3, 3),
        "reports_per_s": round(ingest["accepted"] / ingest["elapsed"]),
        "rss_growth": round((rss_after - rss_before) / rss_before, 4),
    }
    goals = {"p99_ms": 5.0, "mixed_p99_ms": 5.0, "reports_per_s": 25000, "rss_growth": 0.10}
    met = {k: figures[k] >= goal if k == "reports_per_s" else figures[k] < goal for k, goal in goals.items()}
    return {
        **figures, "goals": goals, "goals_met": met,
        "detail": {
            "clients": args.clients, "policy": args.policy, "target_rate": args.rate,
            "achieved_rate": round(len(calls) / lat["elapsed"]),
            "latency_calls": len(calls),
            "handler_p50_le_ms": bucket_quantile(seen["buckets_before"], seen["buckets_after"], 0.5) * 1e3,
            "handler_p99_le_ms": bucket_quantile(seen["buckets_before"], seen["buckets_after"], 0.99) * 1e3,
            "max_ms": round(calls[-1] * 1e3, 3),
            "mean_ms": round(statistics.fmean(calls) * 1e3, 3),
            "light_rate": round(len(light["latencies"]) / light["elapsed"]),
            "light_p50_ms": round(percentile(light["latencies"], 0.5) * 1e3, 3),
            "light_p99_ms": round(percentile(light["latencies"], 0.99) * 1e3, 3),
            "soak_s": args.soak_s, "mixed_p50_ms": round(percentile(soak_calls, 0.5) * 1e3, 3),
            "mixed_rate": round(len(soak_calls) / soak["elapsed"]), "soak_reports": soak["accepted"],
            "ingest_identical_dense_reports_per_s": round(identical["accepted"] / identical["elapsed"]),
            "ingest_forms": {name: round(f["accepted"] / f["elapsed"]) for name, f in seen["forms"].items()},
            "large_messages_p99_ms": round(percentile(seen["large"]["latencies"], 0.99) * 1e3, 3),
            "large_messages_reports_per_s": round(seen["large"]["accepted"] / seen["large"]["elapsed"]),
            "decision_versions_median": statistics.median(j.decision.version for j in jobs),
            "decisions_at_end": dict(sorted(Counter(
                f"{j.decision.family}:{j.decision.param:g}" for j in jobs).items())),
            "policy_errors": counter(seen["metrics"], "flexcomm_agent_policy_errors_total"),
            "probes": seen["probes"], "peers": seen["peers"],
            "rss_before_mb": round(rss_before / 1e6, 1), "rss_after_mb": round(rss_after / 1e6, 1),
            "cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
            "agent_cpus": args.agent_cpus,
            "note": ("agent, load generators and probes share this machine's cores with other work"
                     if args.agent_cpus is None else
                     f"the agent and its probes on cores {args.agent_cpus}, the load generators on the rest"),
        },
    }


if __name__ == "__main__":
    main()
