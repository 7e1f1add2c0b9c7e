"""Never leave an interface shaped: record its original qdisc, put it back exactly.

Before flexcomm first changes an interface, `Revert.record()` writes a state file
holding what `Shaper.show()` read from the kernel then, and who owns the change
(`run`: a foreground process, its pid and start time; `apply`: a lasting change).
`Revert.restore()` removes flexcomm's tree, checks that the kernel is back to the
recorded state, and deletes the file. `clear`, a SIGINT/SIGTERM during `run`
(through `session()`), and the next start after a crashed `run` all call it.

    with session(Shaper("eth0", netns="n1"), owner="run") as shaper:
        shaper.apply(LinkState(50e6))       # restored on exit, on a signal, ...

Only a kernel-default root qdisc (handle 0:, e.g. noqueue on veth, pfifo_fast or
mq on a NIC) is recorded: deleting flexcomm's root makes the kernel attach that same
default again, which is what makes the restore exact. An interface whose root was
configured by someone else is refused rather than overwritten.

State files live in $FLEXCOMM_STATE_DIR, else /run/flexcomm/emulation (tmpfs: a
reboot clears both the shaping and the record of it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flexcomm.emulation.shaping import InterfaceMissing, Shaper, root_qdisc

DEFAULT_STATE_DIR = "/run/flexcomm/emulation"
OWNERS = ("run", "apply")
_COMPARED = ("qdiscs", "classes", "filters")


def state_dir() -> Path:
    return Path(os.environ.get("FLEXCOMM_STATE_DIR") or DEFAULT_STATE_DIR)


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), which
    tells a live owner from a later process that got the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def kernel_view(shown: dict[str, Any]) -> dict[str, Any]:
    """The part of `Shaper.show()` a restore must reproduce."""
    return {key: shown[key] for key in _COMPARED}


class StateDamaged(ValueError):
    """A state file that cannot be read as a record; `flexcomm emulate clear` clears it."""

    def __init__(self, path: Path, shaper: Shaper, why: str) -> None:
        netns = f" --netns {shaper.netns}" if shaper.netns else ""
        super().__init__(f"state: {path} is damaged ({why}); `flexcomm emulate clear --dev {shaper.ifname}{netns}`"
                         " removes flexcomm's shaping and the file")
        self.why = why


def _record_problem(record: Any) -> str:
    """What makes `record` not a state record, or ""."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if record.get("owner") not in OWNERS:
        return f"owner is {record.get('owner')!r:.40}, not one of {', '.join(OWNERS)}"
    original = record.get("original")
    if not isinstance(original, dict) or any(not isinstance(original.get(k), list) for k in _COMPARED):
        return f"original must hold the interface's {', '.join(_COMPARED)}"
    if record.get("pid") is not None and not isinstance(record.get("pid"), int):
        return f"pid is {record.get('pid')!r:.40}, not a whole number"
    return ""


class Revert:
    """The state file of one interface, and restoring what it records."""

    def __init__(self, shaper: Shaper, directory: Path | None = None) -> None:
        self.shaper = shaper
        name = f"{shaper.netns or '-'}__{shaper.ifname}.json"
        self.path = (directory or state_dir()) / name

    def read(self) -> dict[str, Any] | None:
        """The record, None when there is none; StateDamaged when it is not one."""
        try:
            record = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateDamaged(self.path, self.shaper, exc.strerror or str(exc)) from None
        except ValueError as exc:  # not JSON, not UTF-8
            raise StateDamaged(self.path, self.shaper, f"not JSON: {exc}") from None
        why = _record_problem(record)
        if why:
            raise StateDamaged(self.path, self.shaper, why)
        return record

    def clear_damaged(self) -> str:
        """Clear an interface whose state file is damaged, and delete the file.
        flexcomm records only a kernel-default root, so removing flexcomm's root
        restores the original without the record. Returns what was done."""
        try:
            removed = self.shaper.remove()
        except InterfaceMissing:
            self.path.unlink()
            return "the interface is gone; the damaged file was deleted"
        root = root_qdisc(self.shaper.show())
        self.path.unlink()
        if root is not None and root["handle"] != "0:":
            return (f"its root qdisc {root['kind']} {root['handle']} is not flexcomm's and was left alone; "
                    "the damaged file was deleted")
        done = "flexcomm's qdiscs removed, the kernel's default root is back" if removed else "it was not shaped"
        return f"{done}; the damaged file was deleted"

    def owner_alive(self, record: dict[str, Any]) -> bool:
        pid = record.get("pid")
        return (record.get("owner") == "run" and isinstance(pid, int)
                and _process_start(pid) == record.get("pid_start"))

    def record(self, owner: str) -> dict[str, Any]:
        """Write the state file unless one is already there (then the interface is
        already shaped by flexcomm and the file holds the true original).
        Raises ValueError if the interface's root qdisc is not the kernel default,
        or if a live `run` already owns it."""
        if owner not in OWNERS:
            raise ValueError(f"owner: must be one of {OWNERS}, got {owner!r}")
        existing = self.read()
        if existing is not None:
            if self.owner_alive(existing) and existing["pid"] != os.getpid():
                raise ValueError(f"dev: {self.shaper.where} is being emulated by "
                                 f"`flexcomm emulate run` (pid {existing['pid']})")
            return existing
        shown = self.shaper.show()
        root = root_qdisc(shown)
        if root is not None and root["handle"] != "0:":
            raise ValueError(
                f"dev: {self.shaper.where} already has a root qdisc {root['kind']} "
                f"{root['handle']} that flexcomm did not set; flexcomm only shapes an "
                "interface whose root qdisc is the kernel default (it restores that "
                "exactly); remove it first")
        record = {"dev": self.shaper.ifname, "netns": self.shaper.netns, "owner": owner,
                  "pid": os.getpid(), "pid_start": _process_start(os.getpid()),
                  "recorded_at": time.time(), "original": kernel_view(shown)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record, indent=1))
        os.replace(temporary, self.path)  # the file is whole or absent, never half
        return record

    def restore(self) -> bool:
        """Put the recorded original back and delete the state file. Returns False
        when there is no state file (nothing flexcomm changed). A record of an
        interface that no longer exists is dropped. Raises RuntimeError,
        keeping the file, if the kernel does not come back to the recorded state."""
        record = self.read()
        if record is None:
            return False
        try:
            self.shaper.remove()
        except InterfaceMissing:
            self.path.unlink()  # the interface went away, and its shaping with it
            return True
        now = kernel_view(self.shaper.show())
        if now != record["original"]:
            raise RuntimeError(
                f"{self.shaper.where}: after removing flexcomm's qdiscs the interface is "
                f"{json.dumps(now)}, not the recorded original {json.dumps(record['original'])};"
                f" the record stays in {self.path}")
        self.path.unlink()
        return True

    def restore_if_stale(self) -> dict[str, Any] | None:
        """At start: restore an interface left shaped by a `run` that died (its
        process is gone). Returns the stale record restored, or None."""
        record = self.read()
        if record is None or record.get("owner") != "run" or self.owner_alive(record):
            return None
        self.restore()
        return record


class _Terminated(Exception):
    """SIGTERM or SIGHUP, turned into an exception so that `finally` blocks run."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


# SIGHUP too: closing the terminal of a foreground `run` must not leave the link shaped.
_TERMINATING = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise `_Terminated` (SIGINT already
    raises KeyboardInterrupt); the previous handlers are put back on exit.

    A fork of this process inherits the handler (pyroute2's `IPRoute(netns=...)`
    forks helpers and stops them with SIGTERM, for one), so in any process but ours
    it just dies as SIGTERM's default would: unwinding our stack there would run
    our cleanup in the wrong process."""
    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            os._exit(128 + signum)
        raise _Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in _TERMINATING}
    try:
        yield
    finally:
        if os.getpid() == owner:
            for sig, old in previous.items():
                signal.signal(sig, old)


@contextlib.contextmanager
def session(shaper: Shaper, owner: str = "run") -> Iterator[Shaper]:
    """Record the original (restoring one left by a crashed run first), yield the
    shaper, and restore the original however the block ends: normally, by an
    exception, SIGINT, SIGTERM or SIGHUP. A SIGTERM ends in SystemExit(143), a
    SIGHUP in SystemExit(129)."""
    revert = Revert(shaper)
    revert.restore_if_stale()
    pid = os.getpid()
    with terminate_as_exception():
        revert.record(owner)
        try:
            yield shaper
        except _Terminated as exc:
            raise SystemExit(128 + exc.signum) from None
        finally:
            if os.getpid() == pid:  # never from a forked helper unwinding our stack
                with signals_ignored():  # a second Ctrl-C must not cut the restore short
                    revert.restore()


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, *_TERMINATING)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
