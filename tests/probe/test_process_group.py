"""A child's process group is signalled only while the child is unreaped: a
reaped child's pid, its group's id, may be a new process's (pid_max 32768 here;
the suite wraps it). Real processes; the one fake records os.killpg calls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from flexcomm.probe import process_group
from flexcomm.probe.process_group import end_group, exited, signal_group
from support.processes import alive


def test_a_reaped_childs_group_is_never_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(process_group.os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    assert not signal_group(proc, signal.SIGKILL)
    end_group(proc, 0.0, signal.SIGTERM)
    assert sent == []


def test_an_exited_child_left_unreaped_still_holds_its_group_for_the_stragglers() -> None:
    # The leader exits and leaves a child in its group; waiting without reaping
    # keeps the group's id its own, so the straggler is ended by the group's signal.
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    straggler = int(proc.stdout.readline())
    try:
        assert exited(proc, 10.0) and proc.returncode is None  # exited, not reaped
        assert alive(straggler)
        end_group(proc, 1.0, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while alive(straggler) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(straggler) and proc.returncode == 0
    finally:
        if alive(straggler):
            os.kill(straggler, signal.SIGKILL)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    assert not exited(proc, 0.1)
    end_group(proc, 0.2, signal.SIGTERM)
    assert proc.returncode == -signal.SIGKILL
