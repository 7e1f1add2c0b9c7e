"""What a default agent exposes: nothing on a wildcard address (iperf3 only on
the address its job's peers reach it by, metrics on loopback), every listener in
its ready line, in GetAgentInfo and `flexcomm status`, and JSON logs that stay
JSON while it forks iperf3 (gRPC's fork handlers print otherwise)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flexcomm.lab.netns import netns_pair
from flexcomm.proto import agent_pb2 as pb
from support.agent_process import AgentProcess, free_port, running, spec, wait_for
from support.names import run_prefix


def tcp_listeners(ns: str) -> set[str]:
    """Every listening TCP socket's local address in namespace `ns` (ss)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnH"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return {line.split()[3] for line in out.splitlines() if line.strip()}


def udp_sockets(ns: str) -> set[str]:
    """Every bound UDP socket's local address in namespace `ns` (ss)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-lunH"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return {line.split()[3] for line in out.splitlines() if line.strip()}


def wildcard(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return host in ("0.0.0.0", "*", "[::]", "[::ffff:0.0.0.0]")


class DefaultAgent(AgentProcess):
    """`flexcomm agent` with nothing set but where its socket and store go, in `ns`."""

    def __init__(self, workdir: Path, ns: str) -> None:
        super().__init__(workdir)
        self.ns = ns

    def argv(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns, sys.executable, "-m", "flexcomm.cli", "agent",
                "--socket", self.socket, "--db", self.db]


def test_a_default_agent_listens_on_no_wildcard_and_lists_what_it_listens_on(privileged, iperf3_binary,
                                                                              tmp_path: Path) -> None:
    with netns_pair(run_prefix("fcxp"), "10.217.0.0/24") as (here, peer):
        agent = DefaultAgent(tmp_path, here.ns).start()
        try:
            ready = next(json.loads(line) for line in agent.log.read_text().splitlines() if "agent ready" in line)
            assert ready["listening"] == [f"api unix:{agent.socket}", "metrics 127.0.0.1:9464"]
            assert tcp_listeners(here.ns) == {"127.0.0.1:9464"}

            agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec("exposed", nodes=[here.address, peer.address])),
                                   timeout=5)
            wait_for(lambda: f"{here.address}:5201" in tcp_listeners(here.ns), what="iperf3 serving")
            listening = tcp_listeners(here.ns)
            assert listening == {"127.0.0.1:9464", f"{here.address}:5201"}
            assert not [a for a in listening if wildcard(a)]
            assert udp_sockets(here.ns) == {f"{here.address}:5202"}  # the look server, beside iperf3
            info = agent.stub.GetAgentInfo(pb.GetAgentInfoRequest(), timeout=5)
            assert [(x.kind, x.address) for x in info.listeners] == [
                ("api", f"unix:{agent.socket}"), ("metrics", "127.0.0.1:9464"), ("iperf3", f"{here.address}:5201"),
                ("looks (udp)", f"{here.address}:5202")]
            status = subprocess.run([sys.executable, "-m", "flexcomm.cli", "status", "--socket", agent.socket],
                                    capture_output=True, text=True, timeout=60, check=True).stdout
            assert f"iperf3 {here.address}:5201" in status and f"looks (udp) {here.address}:5202" in status

            agent.stub.EndJob(pb.EndJobRequest(job_id="exposed"), timeout=5)  # no job: no iperf3
            wait_for(lambda: tcp_listeners(here.ns) == {"127.0.0.1:9464"}, what="iperf3 stopped")
            wait_for(lambda: udp_sockets(here.ns) == set(), what="the look server stopped")
            assert agent.terminate() == 0
            lines = agent.log.read_text().splitlines()
            assert lines and all(line.startswith("{") for line in lines), [x for x in lines if x[:1] != "{"]
        finally:
            agent.stop()


def test_logs_stay_json_while_iperf3_servers_start_and_stop(iperf3_binary, tmp_path: Path) -> None:
    with running(tmp_path, "--probe-port", str(free_port()), probe=True) as agent:
        for i in range(3):  # each registration and end forks an iperf3 server or stops one
            agent.stub.RegisterJob(pb.RegisterJobRequest(spec=spec(f"j{i}", nodes=["127.0.0.1"])), timeout=5)
            agent.stub.EndJob(pb.EndJobRequest(job_id=f"j{i}"), timeout=5)
        wait_for(lambda: agent.log.read_text().count('"iperf3 and looks serving"') >= 6,
                 what="servers started and stopped")
        assert agent.terminate() == 0
    lines = agent.log.read_text().splitlines()
    assert all(line.startswith("{") for line in lines), [x for x in lines if x[:1] != "{"]
