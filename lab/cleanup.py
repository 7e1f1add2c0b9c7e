"""`flexcomm lab clean`: remove what a crashed lab command left behind.

A lab command (`lab run`, `lab calibrate`) leaves, when killed: network
namespaces named with its prefix, processes it started (ranks, agents, their
iperf3 servers; in those namespaces or, on loopback, in this one), and a short
directory for the agents' sockets. Every process the lab starts carries
FLEXCOMM_LAB_PREFIX=<prefix> in its environment (children inherit it), which is
how they are found wherever they run. `clean(prefix)` kills them (SIGTERM, then
SIGKILL), deletes the namespaces (their veths and qdiscs go with them) and the
socket directories. Lab commands never shape an interface outside their own
namespaces, so nothing else needs restoring. A new cluster runs `clean` for its
own prefix before it starts, so a crashed run's leftovers never meet it.

A live lab command holds its prefix (`held`: an flock on a file in /tmp, which
the kernel drops when the process ends, however it ends; the file goes with a
command that ends normally): `clean` leaves a live command's prefix alone, and
a second command with the same prefix is refused, where either once tore down
the other's namespaces mid-run (the test suite's own `flexcomm lab clean` ended
a lab running beside it).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from flexcomm.lab import netns

LAB_ENV = "FLEXCOMM_LAB_PREFIX"
# Prefixes of the lab's commands: `lab run` and `lab calibrate` (their --prefix defaults).
DEFAULT_PREFIXES = ("flexlab", "flexcal")


def socket_dir_prefix(prefix: str) -> str:
    """What the name of a lab command's socket directory (in the temp dir) starts with."""
    return f"{prefix}-sockets-"


def namespace_pids(ns: str) -> list[int]:
    try:
        out = netns.ip("netns", "pids", ns)
    except netns.NetnsError:
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def marked_pids(prefix: str) -> list[int]:
    """Processes started by a lab command with `prefix` (by their environment),
    never this process or its ancestors."""
    mark = f"{LAB_ENV}={prefix}".encode()
    spared = _ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def kill_all(pids: Iterable[int], still_there: Callable[[], list[int]], grace_s: float = 2.0) -> list[int]:
    """SIGTERM `pids`, SIGKILL what `still_there()` lists after `grace_s`."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while still_there() and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in still_there():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def kill_namespace_processes(ns: str, grace_s: float = 2.0) -> list[int]:
    """SIGTERM every process in `ns`, SIGKILL those left after `grace_s`."""
    return kill_all(namespace_pids(ns), lambda: namespace_pids(ns), grace_s)


class LabBusy(ValueError):
    """A live lab command holds the prefix asked for."""


# Where claims live: one place per machine, whatever TMPDIR says, as the namespaces
# and processes a prefix names are the machine's (the suite gives its children a
# TMPDIR of their own).
CLAIMS_DIR = Path("/tmp")


def _claim_path(prefix: str) -> Path:
    return CLAIMS_DIR / f"flexcomm-lab-{prefix}.claim"


@contextlib.contextmanager
def held(prefix: str) -> Iterator[None]:
    """Hold `prefix` for this lab command while the block runs; LabBusy where a
    live one holds it already. The claim's file goes when the block ends."""
    path = _claim_path(prefix)
    fd = _claim(path, prefix)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still held: a command that opened it meanwhile sees it gone
        os.close(fd)  # the flock goes with it


def _claim(path: Path, prefix: str) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:
            raise ValueError(f"prefix: {path} is another user's (a lab run as root was killed and "
                             "left it): remove it, or give another --prefix") from None
        if not _lock(fd):
            pid = _holder(fd)
            os.close(fd)
            raise LabBusy(f"prefix: a lab command with prefix {prefix!r} is running (pid {pid}); "
                          "wait for it, or give another --prefix")
        if _still_at(fd, path):
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return fd
        os.close(fd)  # its last holder removed it as we opened it: claim the new one


def _lock(fd: int, tries: int = 3) -> bool:
    """The claim, taken; False where a live command holds it. A few tries: a
    `clean` looking at the claim holds it for an instant."""
    for attempt in range(tries):
        if attempt:
            time.sleep(0.05)
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    return False


def _still_at(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _sweep_claims(prefix: str, *, own: bool = False) -> dict[str, str]:
    """Live lab commands whose prefix starts with `prefix` (what `clean(prefix)`
    would match), prefix -> pid; `own`: this process holds `prefix` itself. The
    claims killed commands left (held by nobody) are removed, each taken first,
    so that a command that opened one meanwhile claims a new one."""
    live = {}
    for path in CLAIMS_DIR.glob(f"flexcomm-lab-{glob.escape(prefix)}*.claim"):
        name = path.name[len("flexcomm-lab-"):-len(".claim")]
        if own and name == prefix:
            continue
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _still_at(fd, path):
                    path.unlink()
            except BlockingIOError:
                live[name] = _holder(fd)
            finally:
                os.close(fd)
    return live


def _holder(fd: int) -> str:
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"


def clean(prefix: str, *, own: bool = False) -> dict[str, list]:
    """Kill the processes of, then delete the namespaces and socket directories
    of, every lab command with `prefix`; LabBusy, touching none of them, where a
    live one has such a prefix (`own`: besides this process, which holds `prefix`)."""
    if not prefix:
        raise ValueError("prefix: must not be empty (it would match every namespace)")
    running = _sweep_claims(prefix, own=own)
    if running:
        raise LabBusy("; ".join(f"a lab command with prefix {name!r} is running (pid {pid})"
                                for name, pid in sorted(running.items())))
    killed = kill_all(marked_pids(prefix), lambda: marked_pids(prefix))
    namespaces: list[str] = []
    if shutil.which("ip") is not None:
        mine = [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]
        for ns in mine:
            killed.extend(kill_namespace_processes(ns))
        namespaces = netns.destroy_prefix(prefix) if mine else []
    return {"namespaces": namespaces, "processes": sorted(set(killed)),
            "directories": _remove_socket_dirs(prefix)}


def _remove_socket_dirs(prefix: str) -> list[str]:
    gone = []
    for path in Path(tempfile.gettempdir()).glob(f"{socket_dir_prefix(prefix)}*"):
        if path.is_dir() and all(p.is_socket() for p in path.iterdir()):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(str(path))
    return gone
