"""The agent's bandwidth estimate, replayed from a lab run's records: every run's
node-0 store (its bandwidth tests, looks and step reports, in the order their
times put them) fed through the estimator the agent runs (`probe.estimate`'s
Estimator, the job's `SyncReader`), sampled every 0.2 s as the lab polls the live
one, and scored as the lab scores that (`lab.estimate_tracking`: per phase, within
10% of the link's goodput by the deadline; and how many phases' median estimate is
within 10%; and the moves it counted, each a changed network to the policy), beside
the live score. For judging a
change to the estimator on the same records without running a lab again.

What a replay cannot be: the policy's decisions stay as recorded (the options the
job ran, and so the syncs, are the live estimate's consequences), the store keeps
a message's reports per option as their means where the agent took medians, and
steps that overlapped a bandwidth test are not marked (the agent left them out).
The live and replayed scores of the code that ran agree only that far; compare
two replays, not a replay with the live score. The last printed line is one JSON object.

    .venv/bin/python bench/estimate_replay.py runs/lab-XXXX [runs/lab-YYYY ...]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flexcomm.emulation.shaping import CEIL_OVER_RATE, RATE_BUCKET_SECONDS
from flexcomm.lab import estimate_tracking
from flexcomm.lab.plan import agent_store
from flexcomm.lab.report import PolicyRun, load_runs
from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.linkestimate import LinkEstimateConfig, SyncReader
from flexcomm.policy.types import PLAIN_LINK, GradientLayout, LinkBucket, StepReport
from flexcomm.probe.estimate import EstimateConfig, Estimator
from flexcomm.store import Store
from flexcomm.store.records import Measurement, StepAggregate


def reports_of(aggregate: StepAggregate) -> list[StepReport]:
    """The steps a stored row stands for, each at the row's means."""
    return [StepReport(step=aggregate.step_first + i, family=aggregate.family, param=aggregate.param,
                       collective=aggregate.collective, t_comp_s=aggregate.mean_t_comp_s,
                       t_sync_s=aggregate.mean_t_sync_s, gain=min(1.0, aggregate.mean_gain),
                       t_compute_s=aggregate.mean_t_compute_s, epoch=aggregate.epoch)
            for i in range(aggregate.count)]


def events(store: Store, job_id: str) -> Iterator[tuple[float, Measurement | StepAggregate]]:
    """The store's measurements and the job's report rows, by time (measurements first at a tie)."""
    rows: list[tuple[float, int, Measurement | StepAggregate]] = []
    rows += [(m.ts or 0.0, 0, m) for m in store.measurements(limit=10**7)]
    rows += [(a.ts or 0.0, 1, a) for a in store.step_reports(job_id, limit=10**7)]
    for ts, _, row in sorted(rows, key=lambda r: (r[0], r[1], r[2].id or 0)):
        yield ts, row


def replay(db: Path, own: str, bucket: LinkBucket, poll_s: float = estimate_tracking.POLL_S
           ) -> tuple[list[dict[str, Any]], int]:
    """The estimate of the store's first job, as the lab's poller would have recorded it,
    and the moves it counted (each one a policy takes as a changed network)."""
    with Store(db, create=False) as store:
        records = store.jobs()
        if not records:
            return [], 0
        spec = JobSpec.from_dict(records[0].spec)
        estimator = Estimator(bucket, EstimateConfig(link=LinkEstimateConfig()))
        estimate = estimator.add_job(spec.job_id, [n for n in spec.nodes if n != own], records[0].created)
        reader = SyncReader(spec.layout or GradientLayout.flat(spec.grad_bytes), spec.world_size)
        samples: list[dict[str, Any]] = []
        next_poll = -math.inf
        for ts, row in events(store, spec.job_id):
            if isinstance(row, Measurement):
                estimator.observe(row, ts)
            else:
                reports = reports_of(row)
                reader.observe(estimate, reports, estimate.advance(reports))
            if estimate.bandwidth_bps and ts >= next_poll:
                samples.append({"wall": ts, "bandwidth_bps": estimate.bandwidth_bps, "evidence": estimate.evidence})
                next_poll = ts + poll_s
    return samples, estimate.moves


def lab_bucket(out: Path) -> LinkBucket:
    """The token bucket the run's agents were told of: the lab's shaped links', or none on loopback."""
    cluster = json.loads((out / "cluster.json").read_text())
    return LinkBucket(CEIL_OVER_RATE, RATE_BUCKET_SECONDS) if cluster.get("shaped") else PLAIN_LINK


def node0_address(out: Path) -> str:
    return json.loads((out / "cluster.json").read_text())["nodes"][0]["address"]


def score_run(out: Path, run: PolicyRun) -> dict[str, Any] | None:
    db = agent_store(out, run.label, run.repeat)
    if not db.exists():
        return None
    live = estimate_tracking.summarize(out, run)
    samples, moves = replay(db, node0_address(out), lab_bucket(out))
    return {"run": f"{run.label}#{run.repeat}", "live": live, "replayed": estimate_tracking.score(run, samples),
            "moves": moves}


def _median_within(entry: dict[str, Any]) -> bool:
    """Whether the phase's median estimate is within the lab's 10% of goodput (tracking,
    where `reached` is only the first arrival)."""
    return abs(entry["estimated_bps"] / entry["goodput_bps"] - 1) <= estimate_tracking.WITHIN


def _line(result: dict[str, Any]) -> str:
    def phases(entries: list[dict[str, Any]]) -> str:
        return " ".join(f"{e['estimated_bps'] / e['goodput_bps']:.2f}{'' if e['reached'] else '!'}" for e in entries)
    return (f"{result['run']:28s} live {phases(result['live'])} | replayed {phases(result['replayed'])}"
            f" ({result['moves']} moves)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="lab run directories")
    args = parser.parse_args()
    results = [r for out in args.runs for run in load_runs(out) if (r := score_run(out, run))]
    print("per run, each phase's median estimate over goodput ('!': not within 10% by the deadline)")
    for result in results:
        print(_line(result))
    totals = {kind: {"phases": sum(len(r[kind]) for r in results),
                     "reached": sum(e["reached"] for r in results for e in r[kind]),
                     "median_within_10pct": sum(_median_within(e) for r in results for e in r[kind])}
              for kind in ("live", "replayed")}
    print(json.dumps({"runs": len(results), **totals, "replayed_moves": sum(r["moves"] for r in results)}))


if __name__ == "__main__":
    main()
