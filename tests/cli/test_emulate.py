"""`flexcomm emulate` for real, in network namespaces: restore after clear, after
SIGTERM and after SIGKILL + clear; steps on time; bad input changes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flexcomm.emulation.emulator import Emulator
from flexcomm.emulation.revert import session
from flexcomm.emulation.schedule import parse_schedule
from flexcomm.emulation.shaping import Shaper
from support.cli import REPO, assert_one_line_error, flexcomm
from support.emulation_fixtures import pair, show_json
from support.waiting import scaled

pytestmark = pytest.mark.privileged

LONG = """
[[step]]
duration = "30s"
rate = "20Mbit"
[[step]]
duration = "30s"
rate = "40Mbit"
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, FLEXCOMM_STATE_DIR=str(tmp_path / "state"),
                FLEXCOMM_DB=str(tmp_path / "flexcomm.db"))


@pytest.fixture
def long_schedule(tmp_path: Path) -> Path:
    path = tmp_path / "long.toml"
    path.write_text(LONG)
    return path


def _dev(node) -> list[str]:
    return ["--dev", node.ifname, "--netns", node.ns]


def _start_run(schedule: Path, node, env: dict[str, str]) -> subprocess.Popen:
    """`flexcomm emulate run` in the background, returned once step 1 is applied."""
    proc = subprocess.Popen([sys.executable, "-m", "flexcomm.cli", "emulate", "run",
                             str(schedule), *_dev(node)], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    if "applied step 1/" not in line:
        proc.kill()
        raise AssertionError(f"run did not start: {line!r} {proc.communicate()[1]}")
    return proc


def test_apply_then_clear_restores_the_original(privileged, env):
    with pair("c") as (a, _):
        before = show_json(a, env)
        done = flexcomm(["emulate", "apply", *_dev(a), "--rate", "20Mbit"], env)
        assert done.returncode == 0, done.stderr
        assert show_json(a, env)["shaping"]["1:1"]["rate_bps"] == 20e6
        assert list(Path(env["FLEXCOMM_STATE_DIR"]).glob("*.json"))
        done = flexcomm(["emulate", "clear", *_dev(a)], env)
        assert done.returncode == 0 and "restored" in done.stdout
        assert show_json(a, env) == before
        assert not list(Path(env["FLEXCOMM_STATE_DIR"]).glob("*.json"))


def test_run_killed_by_sigkill_then_clear_leaves_the_interface_as_before(privileged, env,
                                                                         long_schedule):
    with pair("k") as (a, _):
        before = show_json(a, env)
        proc = _start_run(long_schedule, a, env)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=scaled(10))
        assert show_json(a, env) != before  # a killed run cannot clean up...
        done = flexcomm(["emulate", "clear", *_dev(a)], env)
        assert done.returncode == 0, done.stderr
        assert show_json(a, env) == before  # ...but its record lets clear do it exactly


def test_next_start_after_a_crashed_run_restores_first(privileged, env, long_schedule):
    with pair("x") as (a, _):
        before = show_json(a, env)
        proc = _start_run(long_schedule, a, env)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=scaled(10))
        done = flexcomm(["emulate", "apply", *_dev(a), "--rate", "30Mbit"], env)
        assert done.returncode == 0, done.stderr
        assert f"left shaped by a run (pid {proc.pid}) that died" in done.stdout
        assert flexcomm(["emulate", "clear", *_dev(a)], env).returncode == 0
        assert show_json(a, env) == before


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 128 + signal.SIGTERM),
                                             (signal.SIGINT, 130),
                                             (signal.SIGHUP, 128 + signal.SIGHUP)])
def test_a_signal_ends_a_run_with_the_interface_restored(privileged, env, long_schedule, sig,
                                                         status):
    with pair(f"s{int(sig)}") as (a, _):
        before = show_json(a, env)
        proc = _start_run(long_schedule, a, env)
        proc.send_signal(sig)
        assert proc.wait(timeout=scaled(20)) == status
        assert show_json(a, env) == before
        assert not list(Path(env["FLEXCOMM_STATE_DIR"]).glob("*.json"))


def test_epoch_keyed_run_follows_epochs_read_from_stdin(privileged, env, tmp_path):
    schedule = tmp_path / "epochs.toml"
    schedule.write_text('[[step]]\nepoch = 0\nrate = "20Mbit"\n[[step]]\nepoch = 2\nrate = "40Mbit"\n')
    with pair("e") as (a, _):
        before = show_json(a, env)
        done = flexcomm(["emulate", "run", str(schedule), *_dev(a), "--epochs-from-stdin"], env,
                        input="0\n1\n2\n3\n")
        assert done.returncode == 0, done.stderr
        applied = [line for line in done.stdout.splitlines() if "applied" in line]
        assert [line.split(" applied ")[1] for line in applied] == [
            "step 1/2 (round 1) at epoch 0: 20 Mbit/s", "step 2/2 (round 1) at epoch 2: 40 Mbit/s"]
        assert show_json(a, env) == before
        refused = flexcomm(["emulate", "run", str(schedule), *_dev(a)], env)
        assert refused.returncode == 2 and "--epochs-from-stdin" in refused.stderr


def test_two_step_schedule_changes_the_rate_on_time(privileged, monkeypatch, tmp_path):
    monkeypatch.setenv("FLEXCOMM_STATE_DIR", str(tmp_path))
    schedule = parse_schedule('[[step]]\nduration = "1s"\nrate = "20Mbit"\n'
                              '[[step]]\nduration = "1s"\nrate = "40Mbit"\n')
    with pair("o") as (a, _):
        shaper = Shaper(a.ifname, netns=a.ns)
        seen: dict[float, float] = {}  # rate read from the kernel -> first time seen
        with session(shaper):
            runner = threading.Thread(target=Emulator(schedule, shaper).run)
            start = time.monotonic()
            runner.start()
            while runner.is_alive():
                summary = shaper.show()["shaping"] or {}
                rate = summary.get("1:1", {}).get("rate_bps")
                if rate is not None:
                    seen.setdefault(rate, time.monotonic() - start)
                time.sleep(0.02)
            runner.join()
        print(f"rate seen in the kernel at: {seen}")
        assert list(seen) == [20e6, 40e6]
        assert seen[20e6] < scaled(0.5)
        assert abs(seen[40e6] - 1.0) <= scaled(0.5)
        assert shaper.show()["shaping"] is None  # the session restored it


def test_finished_run_records_its_steps_and_restores(privileged, env, tmp_path):
    from flexcomm.store import Store

    schedule = tmp_path / "short.toml"
    schedule.write_text('[[step]]\nduration = "200ms"\nrate = "20Mbit"\n'
                        '[[step]]\nduration = "200ms"\nrate = "40Mbit"\n')
    with pair("d") as (a, _):
        before = show_json(a, env)
        done = flexcomm(["emulate", "run", str(schedule), *_dev(a)], env)
        assert done.returncode == 0, done.stderr
        assert "applied step 2/2" in done.stdout
        assert show_json(a, env) == before
    with Store(env["FLEXCOMM_DB"]) as store:
        steps = store.emulation_steps(interface=a.ifname)
    assert [(s.step_index, s.rate_bps, s.netns) for s in reversed(steps)] == [
        (0, 20e6, a.ns), (1, 40e6, a.ns)]


def test_bad_schedule_and_dry_run_change_nothing(privileged, env, tmp_path, long_schedule):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[step]]\nduration = "1s"\nrate = "-5Mbit"\n')
    with pair("b") as (a, _):
        before = show_json(a, env)
        done = flexcomm(["emulate", "run", str(bad), *_dev(a)], env)
        assert done.returncode == 2
        assert f"{bad}: step 1: rate: must be > 0" in done.stderr
        dry = flexcomm(["emulate", "apply", *_dev(a), "--rate", "10Mbit", "--dry-run"], env)
        assert dry.returncode == 0
        assert f"tc class replace dev {a.ifname} parent 1: classid 1:1 htb rate 10000000bit" \
            in dry.stdout
        dry = flexcomm(["emulate", "run", str(long_schedule), *_dev(a), "--dry-run"], env)
        assert dry.returncode == 0, dry.stderr
        step_2 = dry.stdout.split("step 2 (for 30 s): 40 Mbit/s\n")[1].splitlines()
        assert step_2[0].strip().startswith(f"tc class replace dev {a.ifname} parent 1: "
                                            "classid 1:1 htb rate 40000000bit")
        assert dry.stdout.rstrip().endswith("dry run: nothing changed")
        assert show_json(a, env) == before
        assert not Path(env["FLEXCOMM_STATE_DIR"]).exists()


def test_a_root_qdisc_set_by_someone_else_is_refused_and_kept(privileged, env):
    from pyroute2 import IPRoute

    with pair("f") as (a, _):
        with IPRoute(netns=a.ns, flags=0) as ipr:
            index = ipr.link_lookup(ifname=a.ifname)[0]
            ipr.tc("add", "tbf", index, 0x80010000, rate="5mbit", burst=20000, latency=50)
        before = show_json(a, env)
        done = flexcomm(["emulate", "apply", *_dev(a), "--rate", "10Mbit"], env)
        assert done.returncode == 2
        assert "already has a root qdisc tbf 8001:" in done.stderr
        assert show_json(a, env) == before


def test_delay_without_netem_is_a_clear_error_and_changes_nothing(privileged, env):
    with pair("m") as (a, _):
        before = show_json(a, env)
        done = flexcomm(["emulate", "apply", *_dev(a), "--rate", "10Mbit", "--delay", "5ms"], env)
        if done.returncode == 0:
            assert show_json(a, env)["shaping"]["1:1"]["delay_s"] == pytest.approx(0.005)
            assert flexcomm(["emulate", "clear", *_dev(a)], env).returncode == 0
            return  # this kernel has sch_netem: the delay itself was checked instead
        assert done.returncode == 1
        assert "sch_netem" in done.stderr
        assert show_json(a, env) == before


@pytest.mark.parametrize("damage", [b"\x00\xff not json", b"[]", b'{"owner": "run", "original": 5}'])
def test_a_damaged_state_file_is_named_and_clear_still_restores(privileged, env, damage):
    with pair("d") as (a, _):
        before = show_json(a, env)
        assert flexcomm(["emulate", "apply", *_dev(a), "--rate", "20Mbit"], env).returncode == 0
        (state,) = Path(env["FLEXCOMM_STATE_DIR"]).glob("*.json")
        state.write_bytes(damage)
        again = flexcomm(["emulate", "apply", *_dev(a), "--rate", "30Mbit"], env)
        line = assert_one_line_error(again, "emulate", f"state: {state} is damaged (")
        assert line.endswith(f"`flexcomm emulate clear --dev {a.ifname} --netns {a.ns}` removes flexcomm's "
                             "shaping and the file")
        done = flexcomm(["emulate", "clear", *_dev(a)], env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert f"the state file {state} was damaged" in done.stdout
        assert "flexcomm's qdiscs removed, the kernel's default root is back" in done.stdout
        assert show_json(a, env) == before and not state.exists()


def test_clear_on_a_state_path_that_is_a_directory_is_one_line_and_changes_nothing(privileged, env):
    with pair("y") as (a, _):
        assert flexcomm(["emulate", "apply", *_dev(a), "--rate", "20Mbit"], env).returncode == 0
        shaped = show_json(a, env)
        (state,) = Path(env["FLEXCOMM_STATE_DIR"]).glob("*.json")
        state.unlink()
        state.mkdir()
        (state / "kept").write_text("someone's file")
        done = flexcomm(["emulate", "clear", *_dev(a)], env)
        assert_one_line_error(done, "emulate", f"state: {state} is a directory, not a state file")
        assert show_json(a, env) == shaped and (state / "kept").read_text() == "someone's file"


def test_clear_drops_the_record_of_an_interface_that_is_gone(privileged, env):
    with pair("g") as (a, _):
        done = flexcomm(["emulate", "apply", *_dev(a), "--rate", "10Mbit"], env)
        assert done.returncode == 0, done.stderr
    assert list(Path(env["FLEXCOMM_STATE_DIR"]).glob("*.json"))
    done = flexcomm(["emulate", "clear", *_dev(a)], env)
    assert done.returncode == 0, done.stderr
    assert not list(Path(env["FLEXCOMM_STATE_DIR"]).glob("*.json"))
