"""The agent's bandwidth estimate beside the shaped rate, per phase of a lab run.

While a policy trains through the agent, `polling(socket, job_id, pdir)` asks the
agent for the job's network (GetNetwork) every POLL_S and appends each answer to
the policy's estimates.jsonl: the wall time, the bottleneck bandwidth, and the
evidence it last moved on.

`summarize(out, run)` gives, for each phase of the run (one applied link step):
shaped_bps; goodput_bps, what iperf3 gets through such a link (TCP's payload
share of it, which the shaper delivers: bench/shaper_fidelity.py);
estimated_bps, the median of the phase's estimates; seconds_to_within_10pct,
from the step's application (or the job's first step, in the phase it began:
the job's start is no change of the link) to the first estimate within 10% of
goodput (null if none in the phase); deadline_s, 5 s or the phase's first 10
steps, whichever is later (syncs show the link only as steps run); and
reached. `probe_share(out, runs)` is the share of the runs' wall time node 0's
agents spent in bandwidth tests. `plot(ax, out, run)` draws the estimate on
network.png.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flexcomm.lab.fidelity import TCP_PAYLOAD_SHARE
from flexcomm.lab.plan import agent_store, policy_dir
from flexcomm.store import TEST_KINDS, Store

ESTIMATES = "estimates.jsonl"
POLL_S = 0.2
WITHIN = 0.10
DEADLINE_S = 5.0
DEADLINE_STEPS = 10


@contextlib.contextmanager
def polling(agent_socket: str, job_id: str, pdir: Path) -> Iterator[None]:
    """Record the agent's estimate for `job_id` while the block runs (nothing
    without an agent)."""
    if not agent_socket:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(target=_poll, args=(agent_socket, job_id, pdir / ESTIMATES, stop),
                              name="estimate-poller", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _poll(agent_socket: str, job_id: str, path: Path, stop: threading.Event) -> None:
    import grpc

    from flexcomm.proto import agent_pb2 as pb
    from flexcomm.proto import agent_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"unix:{agent_socket}") as channel, open(path, "a") as out:
        stub = pb_grpc.AgentStub(channel)
        while not stop.wait(POLL_S):
            try:
                b = stub.GetNetwork(pb.GetNetworkRequest(job_id=job_id), timeout=1.0).bottleneck
            except grpc.RpcError:  # not registered yet, or the agent is busy: the next poll
                continue
            if b.known:
                out.write(json.dumps({"wall": time.time(), "bandwidth_bps": b.bandwidth_bps,
                                      "evidence": b.evidence}) + "\n")
                out.flush()


def read_estimates(out: Path, label: str, repeat: int = 0) -> list[dict[str, Any]]:
    path = policy_dir(out, label, repeat) / ESTIMATES
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(out: Path, run: Any) -> list[dict[str, Any]]:
    """One entry per phase of `run` (a lab.report.PolicyRun) that had estimates."""
    return score(run, read_estimates(out, run.label, run.repeat))


def score(run: Any, estimates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`summarize`'s entries for `estimates` (estimates.jsonl's records) of `run`."""
    if not estimates or not run.links:
        return []
    began = run.steps[0].get("wall", -math.inf) if run.steps else -math.inf
    entries = []
    for i, link in enumerate(run.links):
        start = link["applied_at"]
        stop = run.links[i + 1]["applied_at"] if i + 1 < len(run.links) else math.inf
        seen = [e for e in estimates if start <= e["wall"] < stop]
        if link.get("rate_bps") and seen and stop > began:  # a phase over before the job began is none of its
            steps = [s for s in run.steps if start <= s.get("wall", 0.0) < stop]
            entries.append(_phase(link, max(start, began), seen, steps))
    return entries


def _phase(link: dict[str, Any], start: float, seen: list[dict[str, Any]],
           steps: list[dict[str, Any]]) -> dict[str, Any]:
    goodput = link["rate_bps"] * TCP_PAYLOAD_SHARE
    first = next((max(0.0, e["wall"] - start) for e in seen
                  if abs(e["bandwidth_bps"] - goodput) <= WITHIN * goodput), None)
    tenth_step = steps[DEADLINE_STEPS - 1]["wall"] - start if len(steps) >= DEADLINE_STEPS else None
    deadline = max(DEADLINE_S, tenth_step or 0.0)
    return {"phase": [link["step_index"], link["round"]], "shaped_bps": link["rate_bps"],
            "goodput_bps": goodput, "estimated_bps": statistics.median(e["bandwidth_bps"] for e in seen),
            "seconds_to_within_10pct": first, "deadline_s": deadline,
            "reached": first is not None and first <= deadline,
            "evidence": sorted({e["evidence"] for e in seen if e["evidence"]})}


def probe_share(out: Path, runs: list[Any]) -> float | None:
    """Seconds node 0's agents spent in bandwidth tests and looks over the wall time of the
    runs they served (each from its first link step applied to its last step
    trained); None where no run had agents."""
    spent = wall = 0.0
    for run in runs:
        db = agent_store(out, run.label, run.repeat)
        if not db.exists() or not run.links or not run.steps or "wall" not in run.steps[-1]:
            continue
        start, end = run.links[0]["applied_at"], run.steps[-1]["wall"]
        with Store(db, create=False) as store:
            tests = [m for kind in TEST_KINDS for m in store.measurements(kind=kind, limit=10**6)]
        spent += sum(m.duration_s or 0.0 for m in tests if m.ts is not None and start <= m.ts <= end)
        wall += end - start
    return spent / wall if wall > 0 else None


def summary_of(every_repeat: list[list[dict[str, Any]]], first_repeat: list[list[dict[str, Any]]],
               share: float | None) -> dict[str, Any]:
    """The goal's figures: phases and how many reached, over every run of every
    policy (`every_repeat`: each run's summarize entries) and over the first
    repeat's runs alone (the per-phase table's and the plots'), and the probe share."""
    def counts(runs: list[list[dict[str, Any]]]) -> tuple[int, int]:
        entries = [e for phases in runs for e in phases]
        return len(entries), sum(e["reached"] for e in entries)

    phases, reached = counts(every_repeat)
    first_phases, first_reached = counts(first_repeat)
    return {"phases": phases, "reached": reached, "first_repeat_phases": first_phases,
            "first_repeat_reached": first_reached, "bandwidth_probe_share_of_wall": share}


def table_lines(per_policy: dict[str, list[dict[str, Any]]], track: dict[str, Any]) -> list[str]:
    """summary.txt's lines: per policy, each phase's estimate against goodput
    (`per_policy`: label -> its summarize entries), then `track` (summary_of's)."""
    lines = [f"  {label}: " + " | ".join(_phase_text(e) for e in phases)
             for label, phases in per_policy.items() if phases]
    if track and track["phases"]:
        share = track["bandwidth_probe_share_of_wall"]
        first = (f" (the first repeat, above: {track['first_repeat_reached']} of {track['first_repeat_phases']})"
                 if track.get("first_repeat_phases", track["phases"]) != track["phases"] else "")
        lines.append(f"  within 10% in time: {track['reached']} of {track['phases']} phases over every "
                     f"repeat{first}; bandwidth probes: {'n/a' if share is None else f'{100 * share:.2f}%'} "
                     "of wall time")
    if not lines:
        return []
    return ["", "agent's bandwidth estimate per phase (first repeat): median / goodput, seconds to within 10%",
            *lines]


def _phase_text(e: dict[str, Any]) -> str:
    seconds = e["seconds_to_within_10pct"]
    return (f"{e['shaped_bps'] / 1e6:g} Mbit/s: {e['estimated_bps'] / 1e6:.4g}/{e['goodput_bps'] / 1e6:.4g}, "
            + ("never" if seconds is None else f"{seconds:.1f} s"))


def plot(ax: Any, out: Path, run: Any) -> None:
    """The estimate (Mbit/s) against the run's training time, on the rate's axis."""
    estimates = read_estimates(out, run.label, run.repeat)
    walls = [s["wall"] for s in run.steps if "wall" in s]
    if not estimates or not walls:
        return
    ts = [s["t"] for s in run.steps if "wall" in s]
    xs, ys = [], []
    for e in estimates:
        i = max(0, bisect.bisect_right(walls, e["wall"]) - 1)  # the step running then
        xs.append(ts[i])
        ys.append(e["bandwidth_bps"] / 1e6)
    ax.step(xs, ys, where="post", color="black", linewidth=1.0, label="agent's estimate")
    ax.legend(loc="upper right", fontsize=7)
