"""What a process's network namespace shows of its TCP connections."""

from __future__ import annotations


def established(pid: int, port: int) -> bool:
    """Whether the namespace of `pid` has an established TCP connection on local `port`."""
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False
