"""torchrun jobs with real agents, started as the docs say: the README's command
on this machine, and the two-node form of docs/DEPLOYMENT.md on two namespaces
joined by a 20 Mbit/s link. No address is typed: the nodes come from the process
group. The first agreement carries the agent's decision; on the slow link the
job runs compressed once the MOO has measured; it ends at the agent on exit."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from flexcomm.emulation.shaping import LinkState
from flexcomm.lab.agents import running_agents
from flexcomm.lab.cluster import LabCluster
from flexcomm.store import Measurement, Store
from support.agent_process import job_ids, running, wait_for
from support.names import run_prefix
from support.waiting import scaled

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
ADOPTED = re.compile(r"step (\d+): adopted decision v(\d+): (\S+) over (\w+)")


def readme_torchrun_with_agent() -> list[str]:
    lines = [line.split("  #")[0].strip() for line in (ROOT / "README.md").read_text().splitlines()]
    command = next(line for line in lines if line.startswith("torchrun ") and "--agent" in line)
    return [TORCHRUN, *shlex.split(command)[1:]]


def adopted(log: str) -> list[tuple[int, int, str, str]]:
    """(step, version, compression, collective) of each decision rank 0 adopted."""
    return [(int(s), int(v), compression, collective) for s, v, compression, collective in ADOPTED.findall(log)]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_readme_torchrun_command_runs_with_the_agent(tmp_path: Path) -> None:
    with running(tmp_path) as agent:
        env = dict(os.environ, FLEXCOMM_AGENT_SOCKET=agent.socket, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        proc = subprocess.run(readme_torchrun_with_agent(), cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=scaled(200))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert "nodes: 127.0.0.1" in out  # gathered, not typed
        decisions = adopted(out)
        assert decisions[0][:2] == (0, 1), "the first agreement carries the agent's first decision"
        assert any(compression != "dense" for _, _, compression, _ in decisions), "the MOO explores compression"
        assert job_ids(agent) == set()  # the job ended when its processes exited
        with Store(agent.db, create=False) as store:
            (job,) = store.jobs()
            assert job.end_reason == "ended" and job.spec["nodes"] == ["127.0.0.1"]


@pytest.mark.slow
@pytest.mark.privileged
@pytest.mark.timeout(300)
def test_a_two_node_torchrun_job_gathers_its_nodes_probes_them_and_runs_compressed(
        privileged, iperf3_binary, tmp_path: Path) -> None:
    with LabCluster.open(prefix=run_prefix("fctr"), n=2, subnet="10.216.0.0/24", run_dir=tmp_path,
                         namespaces=True) as lab:
        lab.links.apply(LinkState(20e6))
        lab.links.cap_segments(20e6)
        with running_agents(lab, tmp_path / "sockets", tmp_path / "agents") as agents:
            procs = []
            for i, node in enumerate(lab.nodes):
                # docs/DEPLOYMENT.md's command with a static rendezvous: the namespaces share one
                # host name, which the c10d rendezvous would take as every node's address.
                cmd = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(i),
                       "--master-addr", lab.nodes[0].address, "--master-port", "29400", "--rdzv-id", "two-nodes",
                       str(ROOT / "examples" / "train_ddp.py"), "--agent"]
                env = {"FLEXCOMM_AGENT_SOCKET": str(agents[i].socket), "GLOO_SOCKET_IFNAME": node.ifname,
                       "OMP_NUM_THREADS": "1"}
                procs.append(lab.spawn(i, cmd, log=tmp_path / f"node{i}.log", env=env))
            for proc in procs:
                assert proc.wait(scaled(200)) == 0, (tmp_path / "node0.log").read_text()[-3000:]
            out = (tmp_path / "node0.log").read_text()
            addresses = [n.address for n in lab.nodes]
            assert f"nodes: {', '.join(addresses)}" in out
            decisions = adopted(out)
            assert decisions[0][:2] == (0, 1)
            assert decisions[-1][2] != "dense", f"the MOO settled on dense over 20 Mbit/s: {decisions[-3:]}"
            assert not re.search(r"step  299 loss [0-9.]+ dense@", out), "the last step ran compressed"
            assert re.search(r"step  299 loss ", out)
            with Store(agents[0].db, create=False) as store:
                (job,) = store.jobs()  # its id from the rendezvous: the run id, master address and port, start
                assert job.job_id.startswith(f"two-nodes-{addresses[0]}-29400-") and job.end_reason == "ended"
                # a look, or a test where looks did not answer what the job's syncs asked
                def measured() -> list[Measurement]:
                    return [*store.measurements(peer=addresses[1], kind="bandwidth"),
                            *store.measurements(peer=addresses[1], kind="look")]
                wait_for(measured, 30, "a bandwidth test or look")
                probe = measured()[0]
            # The shaped 20 Mbit/s path, not an unshaped one (the veth unshaped: over 1 Gbit/s);
            # a test shares the link with the job's syncs, which can take half of it (a run
            # read 9.97 Mbit/s), and a first look of 12 datagrams crosses at the shaper's 1.2x
            # ceil, its receive stamps bunched beside two CPU hogs (a CI run read 30.7 Mbit/s).
            assert probe.ok and 5e6 < probe.bandwidth_bps < 40e6, probe
            assert f"iperf3 {addresses[1]}:5201" in agents[1].log.read_text()
