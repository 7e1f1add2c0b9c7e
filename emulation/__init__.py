"""flexcomm.emulation: shaping a link with tc (through pyroute2) to emulate network
conditions, and restoring it exactly.

    shaping.py   the HTB (+ netem) tree one `Shaper` builds on an interface
    revert.py    what the interface had before, recorded and restored
    schedule.py  emulation schedules (TOML): link states keyed by time or epoch
    emulator.py  applies a schedule's steps in order
"""
