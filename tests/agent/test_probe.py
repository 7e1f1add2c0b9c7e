"""The agent probes its jobs' nodes for real (iperf3 and TCP-connect RTT over
loopback) and serves iperf3 for other nodes: figures reach GetNetwork, the
metrics, the store and the job's bottleneck; a peer that does not answer is
counted as a probe failure and the agent goes on."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Store
from support.agent_process import AgentProcess, free_port, spec


def peers_of(agent: AgentProcess, job_id: str) -> dict[str, pb.PeerState]:
    state = agent.stub.GetNetwork(pb.GetNetworkRequest(job_id=job_id), timeout=5)
    return {p.address: p for p in state.peers}


def test_probes_feed_the_network_view_metrics_and_store(tmp_path: Path, iperf3_binary: str) -> None:
    port = free_port()
    agent = AgentProcess(tmp_path)
    # Probing on (the helper turns it off), over loopback; the iperf3 server this
    # agent runs is bound to 127.0.0.1 only, so 127.0.0.2 answers nobody.
    agent.extra = ["--probe-port", str(port), "--probe-interval", "300ms"]
    argv = agent.argv
    agent.argv = lambda: [a for a in argv() if a != "--no-probe"]
    agent.env["FLEXCOMM_AGENT_PROBE_SERVE_BIND"] = "127.0.0.1"
    agent.env["FLEXCOMM_AGENT_PROBE_TEST_DURATION_S"] = "1s"
    agent.start()
    try:
        stub = agent.stub
        stub.RegisterJob(pb.RegisterJobRequest(spec=spec("probed", nodes=["127.0.0.1"])), timeout=5)
        stub.RegisterJob(pb.RegisterJobRequest(spec=spec("unlucky", nodes=["127.0.0.2"])), timeout=5)
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            good, bad = peers_of(agent, "probed")["127.0.0.1"], peers_of(agent, "unlucky")["127.0.0.2"]
            if good.bandwidth_bps > 0 and good.rtt_s > 0 and bad.probe_failures > 0:
                break
            time.sleep(0.2)
        assert good.rtt_s > 0 and good.rtt_p99_s >= good.rtt_s and good.source == "probe"
        assert good.bandwidth_bps > 1e8, "loopback iperf3 measured less than 100 Mbit/s"
        assert bad.probe_failures > 0 and bad.bandwidth_bps == 0
        net = stub.GetNetwork(pb.GetNetworkRequest(job_id="probed"), timeout=5)
        assert net.bottleneck.known and net.bottleneck.bandwidth_bps == good.bandwidth_bps
        assert not stub.GetNetwork(pb.GetNetworkRequest(job_id="unlucky"), timeout=5).bottleneck.known
        body = urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics",
                                      timeout=5).read().decode()
        assert 'flexcomm_agent_peer_rtt_seconds{peer="127.0.0.1"}' in body
        assert 'flexcomm_agent_peer_bandwidth_bps{peer="127.0.0.1"}' in body
        assert re.search(r"flexcomm_agent_probe_failures_total{kind=\"\w+\",peer=\"127.0.0.2\"} [1-9]", body)
        assert agent.health() == 1
        assert agent.terminate() == 0
        # A restarted agent (probing off now) knows the figures from its store: the
        # newest measurement of each kind, as it was measured.
        with Store(agent.db) as store:
            kinds = {m.kind: m for m in store.latest_measurements("127.0.0.1")}
        agent.argv = argv
        agent.start()
        restored = peers_of(agent, "probed")["127.0.0.1"]
        bandwidth, latency = kinds["bandwidth"], kinds["latency"]
        assert restored.bandwidth_bps == bandwidth.bandwidth_bps
        assert (restored.rtt_s, restored.rtt_p99_s, restored.alpha_s) == (
            latency.rtt_p50_s, latency.rtt_p99_s, latency.alpha_s)
        assert agent.terminate() == 0
    finally:
        agent.stop()
    with Store(agent.db) as store:
        kinds = {m.kind: m for m in store.latest_measurements("127.0.0.1")}
        assert kinds["bandwidth"].ok and kinds["latency"].ok
        assert not store.latest_measurements("127.0.0.2")[0].ok
