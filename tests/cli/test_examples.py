"""Every example command in the README and in the commands' `--help` runs as
written. Each is listed once below: run as any user, run as root (network
namespaces: a peer at 10.0.0.2, an interface called eth0), or exempt with the
reason. The examples run in a scratch folder (with `examples/` in it), with
$FLEXCOMM_AGENT_SOCKET naming a real agent the test starts, and the store and
the emulation's state in the scratch folder."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flexcomm.cli import build_parser
from flexcomm.lab.netns import netns_pair
from flexcomm.probe.iperf import IperfServer
from flexcomm.store import Measurement, Store
from support.agent_process import running, wait_for
from support.names import run_prefix
from support.waiting import scaled

ROOT = Path(__file__).resolve().parents[2]
FLEXCOMM = str(Path(sys.executable).with_name("flexcomm"))

AS_USER = {
    "flexcomm model --nodes 8 --size 100MB --latency 1ms --bandwidth 1Gbit --sweep",
    "flexcomm model --nodes 4 --size 64MB --latency 100us --bandwidth 20Mbit --matrices 1024x4096*2,4096x1024"
    " --gains topk:0.011=0.4,powersgd:4=0.8,powersgd:1=0.6",
    "flexcomm status",
    "flexcomm status --json --history 20",
    "flexcomm status --all",
    "flexcomm probe history --db probes.db --since 1h",
    "flexcomm emulate validate examples/schedules/bandwidth-drop.toml",
    "flexcomm emulate run examples/schedules/bandwidth-drop.toml --dev eth0 --dry-run",
}
# Runs until stopped: started, seen serving, stopped with SIGTERM.
DAEMONS = {"flexcomm agent --socket agent.sock --db agent.db --no-probe"}
AS_ROOT = [  # in this order, in the namespace at 10.0.0.1 (eth0), its peer at 10.0.0.2
    "flexcomm probe 10.0.0.2",
    "flexcomm probe 10.0.0.2 --time 3s --reverse --db probes.db",
    "flexcomm emulate apply --dev eth0 --rate 50Mbit --db emulation.db",
    "flexcomm emulate show --dev eth0",
    "flexcomm emulate clear --dev eth0",
    "flexcomm emulate record iperf3.json --out recorded.toml",  # the log the test records first
    "flexcomm lab clean",
]
EXEMPT = {
    "flexcomm agent --config /etc/flexcomm/agent.toml":
        "reads an installed node's /etc/flexcomm; the agent runs above with its own settings, and as a "
        "process in tests/agent",
    "flexcomm lab run --out runs/lab": "the whole lab, ~5 minutes as root; tests/lab/test_run.py runs a short one",
    "flexcomm emulate record /var/lib/flexcomm/flexcomm.db --peer 10.0.0.2 --window 20s":
        "reads an installed node's store; tests/emulation/test_record.py records from an agent's store",
    "flexcomm lab calibrate --quick":
        "about 2 minutes as root; tests/lab/test_model_accuracy.py runs a smaller grid through the same code",
}


def readme_examples() -> set[str]:
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = (line.split("  #")[0].strip() for block in blocks for line in block.splitlines())
    return {line for line in lines if line.startswith("flexcomm ")}


def help_examples(parser: argparse.ArgumentParser | None = None) -> set[str]:
    parser = parser or build_parser()
    found = {line.strip() for line in (parser.epilog or "").splitlines() if line.startswith("  flexcomm ")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= help_examples(child)
    return found


def test_every_example_is_run_or_exempt() -> None:
    found = readme_examples() | help_examples()
    listed = AS_USER | DAEMONS | set(AS_ROOT) | set(EXEMPT)
    assert found - listed == set(), "examples nobody runs: list them in this test"
    assert listed - found == set(), "listed here but no longer an example"


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    with Store(tmp_path / "probes.db") as store:
        store.add_measurement(Measurement(peer="10.0.0.2", kind="latency", rtt_p50_s=2e-4))
    return tmp_path


def argv(example: str) -> list[str]:
    return [FLEXCOMM, *shlex.split(example)[1:]]


def run(example: str, cwd: Path, env: dict[str, str], prefix: list[str] | None = None) -> None:
    proc = subprocess.run([*(prefix or []), *argv(example)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=scaled(120))
    assert proc.returncode == 0, f"{example}: exit {proc.returncode}\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}"


def run_daemon(example: str, cwd: Path, env: dict[str, str]) -> None:
    with open(cwd / "daemon.log", "w") as log:
        proc = subprocess.Popen(argv(example), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "agent ready" in (cwd / "daemon.log").read_text() or proc.poll() is not None,
                 60, f"{example} serving")
        assert proc.poll() is None, (cwd / "daemon.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(30)) == 0, (cwd / "daemon.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_examples_run_as_a_user(scratch: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with running(tmp_path_factory.mktemp("agent")) as agent:
        env = dict(os.environ, FLEXCOMM_AGENT_SOCKET=agent.socket, FLEXCOMM_DB=str(scratch / "store.db"))
        for example in sorted(AS_USER):
            run(example, scratch, env)
    for example in sorted(DAEMONS):
        run_daemon(example, scratch, dict(os.environ))


@pytest.mark.privileged
def test_examples_run_as_root(privileged, iperf3_binary, scratch: Path) -> None:
    env = dict(os.environ, FLEXCOMM_DB=str(scratch / "store.db"), FLEXCOMM_STATE_DIR=str(scratch / "state"))
    with netns_pair(run_prefix("fcex"), "10.0.0.0/24") as (here, peer), IperfServer(5201, netns=peer.ns):
        assert (here.address, peer.address, here.ifname) == ("10.0.0.1", "10.0.0.2", "eth0")
        log = subprocess.run(["ip", "netns", "exec", here.ns, iperf3_binary, "-c", peer.address, "-t", "2",
                              "-i", "0.5", "--json"], capture_output=True, text=True, timeout=scaled(30))
        assert log.returncode == 0, log.stdout[-500:] + log.stderr[-500:]
        (scratch / "iperf3.json").write_text(log.stdout)
        for example in AS_ROOT:
            inside = [] if example == "flexcomm lab clean" else ["ip", "netns", "exec", here.ns]
            run(example, scratch, env, inside)
