"""What a killed lab command leaves is found and removed: by `flexcomm lab clean`
(both commands' default prefixes) and by the next cluster with the same prefix,
before it starts. Processes are found by the prefix mark in their environment,
wherever they run (a namespace, or this one on loopback). A live command's
prefix is left alone, and no second command takes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flexcomm.lab.cleanup import CLAIMS_DIR, LabBusy, marked_pids, namespace_pids
from flexcomm.lab.cluster import LabCluster
from flexcomm.lab.netns import list_namespaces
from support.agent_process import wait_for
from support.cli import flexcomm
from support.names import run_prefix
from support.processes import alive
from support.waiting import scaled

PREFIX = run_prefix("fclclean")  # the calibration test uses calibrate's default, its subject

LEAVE_A_PROCESS = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from flexcomm.lab.cluster import LabCluster
    with LabCluster.open(prefix=sys.argv[1], n=2, subnet="10.203.9.0/24", run_dir=Path(sys.argv[2]),
                         namespaces=False) as lab:
        lab.spawn(1, ["sleep", "300"], log=Path(sys.argv[2]) / "sleep.log")
        print("ready", flush=True)
        time.sleep(300)
""")


def live_lab(tmp_path: Path) -> subprocess.Popen:
    """A lab process that started a node's process and runs on."""
    proc = subprocess.Popen([sys.executable, "-c", LEAVE_A_PROCESS, PREFIX, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def killed_lab(tmp_path: Path) -> list[int]:
    """A lab process killed with SIGKILL after starting a node's process: that process's pid."""
    proc = live_lab(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(scaled(10))
    left = marked_pids(PREFIX)
    assert len(left) == 1
    return left


def test_lab_clean_stops_the_processes_a_killed_loopback_run_left(tmp_path: Path) -> None:
    (pid,) = killed_lab(tmp_path)
    claim = CLAIMS_DIR / f"flexcomm-lab-{PREFIX}.claim"
    assert claim.exists()  # a killed command's claim stays, held by nobody
    done = flexcomm(["lab", "clean", "--prefix", PREFIX])
    assert done.returncode == 0, done.stderr
    assert f"{PREFIX}: removed 0 namespace(s) ; stopped 1 process(es)" in done.stdout
    wait_for(lambda: not alive(pid), 10, "the left process to die")
    assert not claim.exists()


def test_a_live_labs_prefix_is_left_alone_and_not_taken_twice(tmp_path: Path) -> None:
    # The suite's own `flexcomm lab clean` once tore down a lab running beside it.
    proc = live_lab(tmp_path)
    try:
        done = flexcomm(["lab", "clean", "--prefix", PREFIX])
        assert done.returncode == 0, done.stderr
        assert (f"{PREFIX}: left alone: a lab command with prefix {PREFIX!r} is running "
                f"(pid {proc.pid})") in done.stdout
        with pytest.raises(LabBusy, match=rf"prefix {PREFIX!r} is running \(pid {proc.pid}\)"), \
                LabCluster.open(prefix=PREFIX, n=2, subnet="10.203.9.0/24", run_dir=tmp_path, namespaces=False):
            pass
        assert proc.poll() is None and len(marked_pids(PREFIX)) == 1  # its node's process runs on
    finally:
        proc.kill()
        proc.wait(scaled(10))
        flexcomm(["lab", "clean", "--prefix", PREFIX])
    assert marked_pids(PREFIX) == []


def test_a_new_cluster_removes_its_prefixs_leftovers_first(tmp_path: Path) -> None:
    (pid,) = killed_lab(tmp_path)
    with LabCluster.open(prefix=PREFIX, n=2, subnet="10.203.9.0/24", run_dir=tmp_path, namespaces=False):
        wait_for(lambda: not alive(pid), 10, "the left process to die")
        assert marked_pids(PREFIX) == []


@pytest.mark.privileged
def test_lab_clean_removes_a_killed_calibrations_namespaces(privileged: None, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "flexcomm.cli", "lab", "calibrate", "--quick",
                             "--out", str(tmp_path / "cal")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:  # killed while it measures its links (a process runs in flexcal1)
        wait_for(lambda: "flexcal1" in list_namespaces() and namespace_pids("flexcal1"), 60, "the probe")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(scaled(10))
        left = sorted(ns for ns in list_namespaces() if ns.startswith("flexcal"))
        assert left == ["flexcal0", "flexcal1", "flexcalhub"]
        done = flexcomm(["lab", "clean"])
        assert done.returncode == 0, done.stderr
        assert "flexcal: removed 3 namespace(s) flexcalhub flexcal0 flexcal1; stopped" in done.stdout
        assert "flexlab: removed 0 namespace(s)" in done.stdout
        assert not [ns for ns in list_namespaces() if ns.startswith("flexcal")]
    finally:
        if proc.poll() is None:
            proc.kill()
        flexcomm(["lab", "clean", "--prefix", "flexcal"])


def test_a_cluster_ends_what_a_reaped_processs_group_left(tmp_path: Path) -> None:
    # A rank that ended and was reaped (the runner polls them) left a child: its
    # group's id is no longer safe to signal, but the child carries the mark.
    with LabCluster.open(prefix=PREFIX, n=2, subnet="10.203.9.0/24", run_dir=tmp_path, namespaces=False) as lab:
        pid_file = tmp_path / "child.pid"
        proc = lab.spawn(0, ["sh", "-c", f"sleep 300 & echo $! > {pid_file}"], log=tmp_path / "sh.log")
        proc.wait()
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 10, "the child's pid")
        child = int(pid_file.read_text())
        pid_file.unlink()
        assert alive(child)
    wait_for(lambda: not alive(child), 10, "the left child to die")
    assert marked_pids(PREFIX) == []
