"""`flexcomm status` against a real agent: what it listens on, each running job's
recent decisions and its peers' history, `--json` with numbers as numbers,
`--all` with the jobs that ended; and
the command line's manners: a closed pipe ends a command quietly, and no help
text is cut short or speaks of the code's insides."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from flexcomm.cli import build_parser
from flexcomm.commands.status import sparkline
from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Measurement, Store
from support.agent_process import running, spec, wait_for

CLI = [sys.executable, "-m", "flexcomm.cli"]


def decide_twice(stub, job_id: str) -> None:
    """A static job, then the same id replaced with another CR: two decisions."""
    for compression in ("topk:0.1", "topk:0.01"):
        request = pb.RegisterJobRequest(spec=spec(job_id, policy="static", nodes=["10.9.0.2"]), replace=True)
        request.spec.options.update({"compression": compression, "collective": "ag_topk"})
        stub.RegisterJob(request, timeout=5)


def test_status_shows_listeners_recent_decisions_and_peer_history(tmp_path: Path) -> None:
    with running(tmp_path) as agent:
        decide_twice(agent.stub, "seen")
        with Store(agent.db, create=False) as store:
            for i, bw in enumerate((9e8, 4e8, 1e8)):
                store.add_measurement(Measurement(peer="10.9.0.2", kind="bandwidth", bandwidth_bps=bw, ts=10.0 + i))
        wait_for(lambda: len(agent.stub.GetHistory(pb.GetHistoryRequest(job_id="seen"), timeout=5).decisions) == 2,
                 what="both decisions stored")
        cmd = [*CLI, "status", "--socket", agent.socket]
        data = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60,
                                         check=True).stdout)
        listening = {(x["kind"], x["address"]) for x in data["agent"]["listening"]}
        assert listening == {("api", f"unix:{agent.socket}"), ("metrics", f"127.0.0.1:{agent.metrics_port}")}
        job = data["jobs"][0]
        assert [(d["family"], d["param"]) for d in job["recent_decisions"]] == [("topk", 0.01), ("topk", 0.1)]
        assert job["peer_history"]["10.9.0.2"]["bandwidth_bps"] == [[10.0, 9e8], [11.0, 4e8], [12.0, 1e8]]
        peer = job["network"]["peers"][0]
        assert isinstance(peer["probe_failures"], int) and isinstance(peer["bandwidth_bps"], float)
        assert isinstance(job["last_step"], int) and isinstance(data["agent"]["pid"], int)

        text = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
        assert f"listening: api unix:{agent.socket}, metrics 127.0.0.1:{agent.metrics_port}" in text
        assert "earlier decisions:" in text and "topk:0.1 over ag_topk" in text
        assert "█▄▁" in text  # the peer's bandwidth, falling

        line, stderr, _ = first_line_then_close(cmd)
        assert "Traceback" not in stderr and line.startswith("agent unix:")


def test_status_all_lists_the_jobs_that_ended(tmp_path: Path) -> None:
    with running(tmp_path) as agent:
        decide_twice(agent.stub, "finished")
        agent.stub.ReportSteps(iter([pb.ReportStepsRequest(job_id="finished", reports=[
            pb.StepReport(step=s, family="topk", param=0.01, collective=pb.COLLECTIVE_AG_TOPK, t_sync_s=0.01,
                          gain=0.5, bytes_sent=1000) for s in range(7)])]), timeout=5)
        agent.stub.EndJob(pb.EndJobRequest(job_id="finished"), timeout=5)
        agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("still-running")), timeout=5)
        cmd = [*CLI, "status", "--socket", agent.socket]
        plain = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60,
                                          check=True).stdout)
        assert [j["job_id"] for j in plain["jobs"]] == ["still-running"] and "ended_jobs" not in plain
        data = json.loads(subprocess.run([*cmd, "--all", "--json"], capture_output=True, text=True, timeout=60,
                                         check=True).stdout)
        assert [j["job_id"] for j in data["jobs"]] == ["still-running"]
        (ended,) = data["ended_jobs"]
        assert (ended["job_id"], ended["end_reason"], ended["reports"], ended["last_step"]) == ("finished", "ended",
                                                                                                7, 6)
        assert (ended["decision"]["family"], ended["decision"]["param"]) == ("topk", 0.01)
        text = subprocess.run([*cmd, "--all"], capture_output=True, text=True, timeout=60, check=True).stdout
        assert "1 ended job(s), newest first:" in text
        assert "finished  ended " in text and "last decision v" in text and "topk:0.01 over ag_topk" in text


def first_line_then_close(argv: list[str]) -> tuple[str, str, int]:
    """What `argv | head -n 1` does to argv: its first line, then the pipe closed;
    its stderr and exit status."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    return line, stderr, proc.wait(timeout=60)


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5]) == "▁▁" and sparkline([]) == ""


def test_a_closed_pipe_ends_a_command_quietly(tmp_path: Path) -> None:
    db = tmp_path / "many.db"
    with Store(db) as store:
        for i in range(3000):
            store.add_measurement(Measurement(peer=f"10.0.{i // 250}.{i % 250}", kind="latency", rtt_p50_s=1e-3))
    line, stderr, status = first_line_then_close([*CLI, "probe", "history", "--db", str(db), "--limit", "3000"])
    assert stderr == "" and status == 141, (line, stderr, status)


def parsers(parser: argparse.ArgumentParser, path: str = "flexcomm"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def test_no_help_is_cut_short_or_speaks_of_the_code() -> None:
    for path, parser in parsers(build_parser()):
        description = (parser.description or "").strip()
        assert not description or description[-1] in ".:)`", f"{path}: description cut: {description[-60:]!r}"
        for word in ("add_parser", "Not a top-level command", "bench/"):
            assert word not in (parser.format_help()), f"{path}: help speaks of {word!r}"


def test_lab_calibrate_needs_no_out() -> None:
    args = build_parser().parse_args(["lab", "calibrate", "--quick"])
    assert args.out is None  # run() picks runs/calibrate-<time> and says so
