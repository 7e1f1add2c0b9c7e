"""Malformed and odd requests against a real agent: none may stall it or crash it.

10,000 requests (default) from 4 client threads, each drawn at random (seeded):
registrations with every policy option of every policy at values of every kind
(wrong types, numbers at the edges such as a factor of 1.0000001, repeated
collectives), report streams from empty to thousands of reports with up to 64
gains each, at odd CRs, times and enums, and decision, network, watch and list
calls for known, unknown and malformed job ids. Meanwhile a heartbeat asks for a
canary job's decision every 50 ms: an answer later than 1 s is a stall.

Goals: 0 stalls over 1 s, 0 crashes (the agent answers its health check at the
end and its store passes its check), every rejected request names its field
(INVALID_ARGUMENT or NOT_FOUND; ALREADY_EXISTS and RESOURCE_EXHAUSTED are counted
apart), 0 INTERNAL. The agent and the clients share this machine's cores: say
how loaded it was. Last line: one JSON object.

    python bench/agent_fuzz.py [--requests 10000] [--threads 4] [--seed 16]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import grpc

from flexcomm.policy.gravac import GravacConfig
from flexcomm.policy.moo import MooConfig
from flexcomm.policy.static import StaticConfig
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Store
from support.agent_process import AgentProcess, spec

STALL_S = 1.0
HEARTBEAT_S = 0.05
FIELD_FIRST = re.compile(r"^(spec|job_id|reports|network)[\w\[\].]*: ")
NAMED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
OPTION_NAMES = sorted({f.name for c in (MooConfig, GravacConfig, StaticConfig) for f in fields(c)} | {"bogus"})
JOB_POOL = [f"fz-{i}" for i in range(150)]
COLLECTIVE_NAMES = ["ag_topk", "art_ring", "art_tree", "dense_ring", "dense_tree", "ps", "bogus"]


class Draw:
    """Random request parts, from one seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def number(self) -> float:
        return self.r.choice([
            self.r.uniform(-1, 2), self.r.uniform(0, 1e-3), 10 ** self.r.uniform(-320, 308),
            1.0000001, 1.001, 5e-324, -0.0, math.nan, math.inf, -math.inf, 0.0, 1.0, 2**53,
        ])

    def value(self) -> object:
        kind = self.r.randrange(7)
        if kind == 0:
            n = self.number()
            return n if math.isfinite(n) else 0.5
        if kind == 1:
            return self.r.randint(-10, 10**6)
        if kind == 2:
            return self.r.choice(["0.5", "asf", "progress", "star", "var", "paper", "ring", "ag_topk,ag_topk", ""])
        if kind == 3:
            return self.r.random() < 0.5
        if kind == 4:
            return [self.r.choice(COLLECTIVE_NAMES) for _ in range(self.r.randrange(5))]
        if kind == 5:
            return {"x": self.r.randint(0, 9)}
        return "x" * self.r.choice([1, 100, 5000])

    def job_id(self) -> str:
        return self.r.choice([*JOB_POOL, "canary", "ghost", "", "bad id", "x" * 200, "é"])

    def options(self) -> dict:
        return {self.r.choice(OPTION_NAMES): self.value() for _ in range(self.r.randrange(5))}

    def registration(self) -> pb.RegisterJobRequest:
        """A valid registration, most often with one or two fields made bad or odd."""
        r = self.r
        fields_ = {"job_id": r.choice(JOB_POOL), "policy": r.choice(["moo", "moo", "gravac", "static", "dense"]),
                   "world_size": r.choice([2, 4, 8]), "grad_bytes": r.choice([4_000_000, 100_000_000]),
                   "nodes": ["10.0.0.1", "10.0.0.2"][:r.randint(1, 2)]}
        bad = {"job_id": ["", "bad id", "x" * 200], "policy": ["x", ""], "world_size": [0, 1, 2**20 + 1, 2**32 - 1],
               "grad_bytes": [0, 2**40 + 1, 2**64 - 1], "nodes": [["h!"], [""], ["10.0.0.1", "10.0.0.1"]]}
        for name in r.sample(sorted(bad), r.choice([0, 0, 1, 2])):
            fields_[name] = r.choice(bad[name])
        message = spec(fields_.pop("job_id"), **fields_)
        if message.policy in ("moo", "gravac"):
            message.options.update({"c_low": 0.001, "c_high": 0.1, "factor": r.choice([1.5, 2.0, 3.0])})
        elif message.policy == "static" and r.random() < 0.5:
            message.options.update({"compression": "topk:0.1", "collective": "ag_topk"})
        if r.random() < 0.6:
            message.options.update(self.options())
        return pb.RegisterJobRequest(spec=message, replace=r.random() < 0.2)

    def report(self, step: int, odd: bool) -> pb.StepReport:
        r = self.r
        cr = r.choice([1.0, 0.1, 0.033, 0.011, 0.004, 0.001])
        report = pb.StepReport(step=step, epoch=step // 100, cr=cr,
                               collective=pb.COLLECTIVE_DENSE_RING if cr == 1.0 else r.randint(4, 6),
                               t_comp_s=r.uniform(0, 0.1), t_sync_s=r.uniform(0, 1), t_compute_s=r.uniform(0, 1),
                               gain=1.0 if cr == 1.0 else r.uniform(0, 1),
                               gains=[pb.GainAt(cr=c, gain=r.uniform(0, 1)) for c in (0.1, 0.033, 0.011)])
        if odd:  # one field odd or bad: an unknown CR, an edge number, a bad enum, too many gains
            field = r.choice(["cr", "t_sync_s", "gain", "step", "collective", "gains"])
            if field == "collective":
                report.collective = r.randint(-2, 9)
            elif field == "step":
                report.step = r.choice([2**53 + 1, 2**60])
            elif field == "gains":
                report.gains.extend(pb.GainAt(cr=r.uniform(1e-6, 1), gain=r.uniform(0, 1))
                                    for _ in range(r.choice([61, 62])))
            else:
                setattr(report, field, self.number())
        return report

    def report_stream(self) -> list[pb.ReportStepsRequest]:
        job = self.r.choice(["canary-moo", "canary-moo", *JOB_POOL[:20], "ghost", "", "bad id"])
        messages = []
        for _ in range(self.r.randrange(1, 4)):
            size = self.r.choices([0, 1, 10, 100, 1000, 4096], weights=[5, 30, 30, 25, 8, 2])[0]
            odd = self.r.random() < 0.3
            message = pb.ReportStepsRequest(job_id=job, reports=[
                self.report(k, odd and k == size - 1) for k in range(size)])
            if self.r.random() < 0.3:
                message.network.CopyFrom(pb.NetworkEstimate(alpha_s=self.number(), bandwidth_bps=self.number()))
            messages.append(message)
        return messages


def call(stub: object, draw: Draw) -> tuple[str, grpc.StatusCode, str]:
    kind = draw.r.choices(["RegisterJob", "ReportSteps", "GetDecision", "GetNetwork", "WatchDecisions",
                           "ListJobs"], weights=[30, 40, 10, 10, 5, 5])[0]
    try:
        if kind == "RegisterJob":
            stub.RegisterJob(draw.registration(), timeout=30)
        elif kind == "ReportSteps":
            stub.ReportSteps(iter(draw.report_stream()), timeout=30)
        elif kind == "GetDecision":
            stub.GetDecision(pb.JobRef(job_id=draw.job_id()), timeout=30)
        elif kind == "GetNetwork":
            stub.GetNetwork(pb.GetNetworkRequest(job_id=draw.job_id()), timeout=30)
        elif kind == "WatchDecisions":
            stream = stub.WatchDecisions(pb.WatchDecisionsRequest(job_id=draw.job_id(), after_version=0), timeout=30)
            next(stream)
            stream.cancel()
        else:
            stub.ListJobs(pb.ListJobsRequest(), timeout=30)
    except grpc.RpcError as exc:
        return kind, exc.code(), exc.details() or ""
    return kind, grpc.StatusCode.OK, ""


class Heartbeat(threading.Thread):
    """GetDecision of the canary every HEARTBEAT_S; the latencies of its answers."""

    def __init__(self, agent: AgentProcess) -> None:
        super().__init__(daemon=True)
        self.agent = agent
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        stub = self.agent.stub
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                stub.GetDecision(pb.JobRef(job_id="canary"), timeout=30)
            except grpc.RpcError:
                self.failures += 1
            self.latencies.append(time.perf_counter() - t0)
            self.stop.wait(HEARTBEAT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fca-fuzz-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, workdir: Path) -> None:

    agent = AgentProcess(workdir, "--log-level", "error")
    agent.start()
    load_before = os.getloadavg()
    outcomes: collections.Counter[str] = collections.Counter()
    unnamed: list[str] = []
    internal: list[str] = []
    slowest = [0.0, ""]
    lock = threading.Lock()
    per_thread = args.requests // args.threads

    def client(index: int) -> None:
        draw = Draw(random.Random(args.seed * 1000 + index))
        stub = agent.stub
        for _ in range(per_thread):
            t0 = time.perf_counter()
            kind, code, details = call(stub, draw)
            took = time.perf_counter() - t0
            with lock:
                outcomes[f"{kind} {code.name}"] += 1
                if took > slowest[0]:
                    slowest[:] = [took, kind]
                if code in NAMED and not FIELD_FIRST.match(details):
                    unnamed.append(f"{kind}: {details[:120]}")
                if code not in NAMED | {grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS,
                                        grpc.StatusCode.RESOURCE_EXHAUSTED}:
                    internal.append(f"{kind} {code.name}: {details[:120]}")

    try:
        agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("canary", policy="static")), timeout=10)
        agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("canary-moo")), timeout=10)
        heartbeat = Heartbeat(agent)
        heartbeat.start()
        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        heartbeat.stop.set()
        heartbeat.join()
        alive = agent.proc is not None and agent.proc.poll() is None and agent.health() == 1
        agent.terminate()
        with Store(agent.db) as store:
            store.check()  # raises if the store was damaged
            stored_jobs = len(store.jobs())
    finally:
        agent.stop()

    beats = sorted(heartbeat.latencies)
    sent = per_thread * args.threads
    result = {
        "requests": sent,
        "stalls_over_1s": sum(1 for x in beats if x > STALL_S),
        "crashed": not alive,
        "unnamed_rejections": len(unnamed),
        "internal": len(internal),
        "goals": {"stalls_over_1s": 0, "crashed": False, "unnamed_rejections": 0, "internal": 0},
        "detail": {
            "elapsed_s": round(elapsed, 1), "threads": args.threads, "seed": args.seed,
            "heartbeats": len(beats), "heartbeat_failures": heartbeat.failures,
            "heartbeat_p50_ms": round(beats[len(beats) // 2] * 1e3, 2),
            "heartbeat_p99_ms": round(beats[int(0.99 * (len(beats) - 1))] * 1e3, 2),
            "heartbeat_max_ms": round(beats[-1] * 1e3, 2),
            "slowest_request_s": round(slowest[0], 3), "slowest_kind": slowest[1],
            "outcomes": dict(sorted(outcomes.items())), "stored_jobs": stored_jobs,
            "unnamed_examples": unnamed[:5], "internal_examples": internal[:5],
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
        },
    }
    print(f"{sent} requests in {elapsed:.0f} s: {result['stalls_over_1s']} heartbeat(s) over 1 s "
          f"(max {result['detail']['heartbeat_max_ms']} ms), crashed: {result['crashed']}, "
          f"unnamed rejections: {len(unnamed)}, INTERNAL or other: {len(internal)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
