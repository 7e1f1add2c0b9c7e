"""`flexcomm emulate`: shape an interface's egress, run schedules, read back, undo.

    flexcomm emulate apply --dev eth0 --rate 50Mbit [--delay 10ms --jitter 1ms --loss 0.1%]
    flexcomm emulate run SCHEDULE.toml --dev eth0        # foreground; restores on exit
    flexcomm emulate show --dev eth0 [--json]            # the kernel's state
    flexcomm emulate clear --dev eth0                    # back to the recorded original
    flexcomm emulate validate SCHEDULE.toml ...
    flexcomm emulate record LOG [--peer ADDRESS] [--out SCHEDULE.toml]
                                    # a recorded network as a time-keyed schedule

Every command takes --netns NAME (the interface lives in that namespace) and
touches only the --dev named. `apply` and `run` take --peer ADDRESS (repeatable:
shape only traffic to those addresses) and --dry-run (print the tc-equivalent
changes, change nothing). Applied steps are recorded in the store (--db, default
$FLEXCOMM_DB or /var/lib/flexcomm/flexcomm.db; --no-record to skip).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from flexcomm.units import parse_duration, parse_fraction, parse_rate

EXAMPLES = """examples:
  flexcomm emulate validate examples/schedules/bandwidth-drop.toml
  flexcomm emulate run examples/schedules/bandwidth-drop.toml --dev eth0 --dry-run
  flexcomm emulate apply --dev eth0 --rate 50Mbit --db emulation.db
  flexcomm emulate show --dev eth0
  flexcomm emulate clear --dev eth0
  flexcomm emulate record iperf3.json --out recorded.toml
  flexcomm emulate record /var/lib/flexcomm/flexcomm.db --peer 10.0.0.2 --window 20s
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "emulate", help="emulate a network: shape an interface with rate/delay/jitter/loss",
        description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="emulate_command", metavar="ACTION", required=True)

    apply = sub.add_parser("apply", help="shape an interface now (lasts until `clear`)")
    _device_options(apply, peers=True)
    apply.add_argument("--rate", required=True, help="e.g. 50Mbit, 1Gbit")
    apply.add_argument("--delay", default="0ms", help="e.g. 20ms (needs sch_netem)")
    apply.add_argument("--jitter", default="0ms", help="e.g. 2ms (needs a delay)")
    apply.add_argument("--loss", default="0", help="e.g. 0.5%% or 0.005")
    _change_options(apply)
    apply.set_defaults(func=cmd_apply)

    run = sub.add_parser("run", help="run a schedule in the foreground, then restore")
    run.add_argument("schedule", help="a TOML schedule file")
    _device_options(run, peers=True)
    run.add_argument("--epochs-from-stdin", action="store_true",
                     help="epoch-keyed schedules: read the job's epoch numbers, one a line")
    _change_options(run)
    run.set_defaults(func=cmd_run)

    show = sub.add_parser("show", help="read the interface's tc state back from the kernel")
    _device_options(show, peers=False)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=cmd_show)

    clear = sub.add_parser("clear", help="restore the interface's recorded original qdisc")
    _device_options(clear, peers=False)
    clear.set_defaults(func=cmd_clear)

    record = sub.add_parser(
        "record", help="turn a recorded network (an agent's store, an iperf3 --json log, a "
        "mahimahi trace) into a time-keyed schedule")
    record.add_argument("log", help="an agent's SQLite store (read-only), an iperf3 --json log, "
                        "or a mahimahi trace (one delivery time in ms per line)")
    record.add_argument("--format", choices=("auto", "store", "iperf3", "mahimahi"),
                        default="auto", help="what LOG is (default: from its first bytes)")
    record.add_argument("--peer", help="store: the peer whose bandwidth measurements to use "
                        "(needed when the store measured several)")
    record.add_argument("--window", default="10s",
                        help="average over windows this long; a step lasts at least one "
                        "(default 10s)")
    record.add_argument("--merge", default="10%",
                        help="join neighbouring windows whose rates differ by less (default 10%%)")
    record.add_argument("--name", default=None, help="the schedule's name (default: LOG's name)")
    record.add_argument("--out", default=None, help="write the schedule here (default: stdout)")
    record.set_defaults(func=cmd_record)

    validate = sub.add_parser("validate", help="check schedule files; change nothing")
    validate.add_argument("schedules", nargs="+", metavar="SCHEDULE")
    validate.set_defaults(func=cmd_validate)


def _device_options(parser: argparse.ArgumentParser, *, peers: bool) -> None:
    parser.add_argument("--dev", required=True, help="the interface to shape (only this one)")
    parser.add_argument("--netns", default=None, help="the network namespace it lives in")
    if peers:
        parser.add_argument("--peer", action="append", default=[], metavar="ADDRESS",
                            help="shape only traffic to this IPv4 address (repeatable)")


def _change_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would change (tc-equivalent), change nothing")
    parser.add_argument("--db", default=None, help="store to record applied steps in")
    parser.add_argument("--no-record", action="store_true", help="do not record steps")


def _shaper(args: argparse.Namespace) -> Any:
    from flexcomm.emulation.shaping import Shaper

    return Shaper(args.dev, netns=args.netns, peers=getattr(args, "peer", ()))


def _recorder(args: argparse.Namespace, shaper: Any) -> Callable[[Any], None] | None:
    """A callback that records each applied step in the store, or None."""
    if args.no_record or args.dry_run:
        return None
    from flexcomm.store import EmulationStep, Store, default_path

    path = args.db or default_path()
    try:
        store = Store(path)
    except (ValueError, OSError) as exc:
        if args.db:
            raise ValueError(f"db: cannot open {path}: {exc}") from None
        print(f"warning: not recording steps, store {path} unusable: {exc}", file=sys.stderr)
        return None

    def record(applied: Any) -> None:
        state = applied.state
        store.add_emulation_step(EmulationStep(
            interface=shaper.ifname, step_index=applied.step_index, netns=shaper.netns or "",
            rate_bps=state.rate_bps, delay_s=state.delay_s, jitter_s=state.jitter_s,
            loss=state.loss, ts=applied.applied_at))

    return record


def _print_plan(shaper: Any, state: Any, header: str, *, after_apply: bool = False) -> None:
    print(header)
    for request in shaper.plan(state, after_apply=after_apply):
        print(f"  {request}")


def _netem_failed(shaper: Any, exc: Exception) -> int:
    print(f"flexcomm emulate: error: {shaper.where}: {exc}; the interface is back to its "
          "original qdisc", file=sys.stderr)
    return 1


def cmd_apply(args: argparse.Namespace) -> int:
    from flexcomm.emulation.emulator import AppliedStep
    from flexcomm.emulation.revert import Revert
    from flexcomm.emulation.shaping import LinkState, NetemUnavailable

    state = LinkState(parse_rate("rate", args.rate), parse_duration("delay", args.delay),
                      parse_duration("jitter", args.jitter), parse_fraction("loss", args.loss))
    shaper = _shaper(args)
    revert = Revert(shaper)
    if args.dry_run:
        if revert.read() is None:
            print(f"would record the original qdiscs of {shaper.where} in {revert.path}")
        _print_plan(shaper, state, f"would shape {shaper.where} to {state.describe()}:")
        print("dry run: nothing changed")
        return 0
    record = _recorder(args, shaper)
    stale = revert.restore_if_stale()
    if stale is not None:
        print(f"restored {shaper.where}, left shaped by a run (pid {stale['pid']}) that died")
    revert.record("apply")
    try:
        shaper.apply(state)
    except NetemUnavailable as exc:
        revert.restore()
        return _netem_failed(shaper, exc)
    if record is not None:
        record(AppliedStep(0, 0, state, time.time()))
    print(f"{shaper.where}: shaped to {state.describe()} "
          f"(undo: flexcomm emulate clear --dev {shaper.ifname}"
          f"{f' --netns {shaper.netns}' if shaper.netns else ''})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from flexcomm.emulation.emulator import Emulator
    from flexcomm.emulation.revert import session
    from flexcomm.emulation.schedule import load_schedule
    from flexcomm.emulation.shaping import NetemUnavailable

    schedule = load_schedule(args.schedule)
    if schedule.by_epoch and not args.epochs_from_stdin and not args.dry_run:
        raise ValueError(f"schedule: {args.schedule} is keyed by epoch; pass "
                         "--epochs-from-stdin (one epoch number a line) or run it in the agent")
    shaper = _shaper(args)
    if args.dry_run:
        _print_schedule_plan(schedule, shaper)
        return 0
    record = _recorder(args, shaper)
    emulator = Emulator(schedule, shaper, on_step=_announce_then(record, schedule))
    try:
        with session(shaper, owner="run"):
            if schedule.by_epoch:
                _follow_epochs(emulator, sys.stdin)
            else:
                emulator.run(on_progress=_progress_printer())
    except NetemUnavailable as exc:
        return _netem_failed(shaper, exc)
    finally:
        if sys.stderr.isatty():
            print(file=sys.stderr)
    print(f"{shaper.where}: schedule done; original qdisc restored", flush=True)
    return 0


def _print_schedule_plan(schedule: Any, shaper: Any) -> None:
    from flexcomm.emulation.revert import Revert

    rounds = "forever" if schedule.repeat is None else f"{schedule.repeat} round(s)"
    print(f"{schedule.path}: {len(schedule.steps)} step(s), {rounds}, on {shaper.where}")
    print(f"first: the original qdiscs are recorded in {Revert(shaper).path}")
    for step in schedule.steps:
        when = (f"at epoch {step.epoch}" if step.epoch is not None
                else f"for {step.duration_s:g} s")
        _print_plan(shaper, step.state, f"step {step.number} ({when}): {step.state.describe()}",
                    after_apply=step.number > 1)
    print("then: the original qdiscs are restored")
    print("dry run: nothing changed")


def _announce_then(record: Callable[[Any], None] | None, schedule: Any) -> Callable[[Any], None]:
    def on_step(applied: Any) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(applied.applied_at))
        epoch = "" if applied.epoch is None else f" at epoch {applied.epoch}"
        print(f"{stamp} applied step {applied.step_index + 1}/{len(schedule.steps)}"
              f" (round {applied.round + 1}){epoch}: {applied.state.describe()}", flush=True)
        if record is not None:
            record(applied)
    return on_step


def _progress_printer() -> Callable[[Any], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(progress: Any) -> None:
        sys.stderr.write(f"\r\x1b[K{progress.line()}")
        sys.stderr.flush()
    return show


def _follow_epochs(emulator: Any, stream: Any) -> None:
    for number, line in enumerate(stream, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            epoch = int(text)
        except ValueError:
            raise ValueError(f"epoch: stdin line {number} is not a whole number: {text!r}") from None
        emulator.advance_epoch(epoch)


def cmd_show(args: argparse.Namespace) -> int:
    from flexcomm.emulation.revert import Revert

    shaper = _shaper(args)
    shown = shaper.show()
    if args.json:
        print(json.dumps(shown, indent=1, sort_keys=True))
        return 0
    for qdisc in shown["qdiscs"]:
        extra = " ".join(f"{k} {v}" for k, v in qdisc.items() if k not in ("kind", "handle", "parent"))
        print(f"qdisc {qdisc['kind']} {qdisc['handle']} parent {qdisc['parent']} {extra}".rstrip())
    for cls in shown["classes"]:
        rate = f" rate {cls['rate_bps']:.0f}bit ceil {cls['ceil_bps']:.0f}bit" if "rate_bps" in cls else ""
        print(f"class {cls['kind']} {cls['classid']} parent {cls['parent']}{rate}")
    for flt in shown["filters"]:
        print(f"filter {flt['kind']} {flt['handle']} {' '.join(flt['match'])} -> {flt['classid']}")
    record = Revert(shaper).read()
    if shown["shaping"] is None:
        print(f"{shaper.where}: not shaped by flexcomm")
    elif record is not None:
        print(f"{shaper.where}: shaped by flexcomm ({record['owner']}, pid {record['pid']});"
              f" original recorded in {Revert(shaper).path}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from flexcomm.emulation.revert import Revert, StateDamaged

    shaper = _shaper(args)
    revert = Revert(shaper)
    if revert.path.is_dir():  # not flexcomm's to delete: it may hold someone's files
        raise ValueError(f"state: {revert.path} is a directory, not a state file; nothing was changed"
                         " (move it away, then clear again)")
    try:
        record = revert.read()
    except StateDamaged as exc:
        print(f"{shaper.where}: the state file {revert.path} was damaged ({exc.why}); {revert.clear_damaged()}")
        return 0
    if record is not None and revert.owner_alive(record):
        print(f"note: the run that shaped {shaper.where} (pid {record['pid']}) is still "
              "going; it will find its link restored", file=sys.stderr)
    if revert.restore():
        print(f"{shaper.where}: original qdiscs restored")
        return 0
    hint = ""
    if shaper.show()["shaping"] is not None:
        hint = (" (its root is an htb 1: that looks like flexcomm's, but with no record "
                "flexcomm cannot tell; `tc qdisc del dev "
                f"{shaper.ifname} root` removes it)")
    print(f"{shaper.where}: nothing to clear, no flexcomm record in {revert.path}{hint}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from flexcomm.emulation.schedule import ScheduleError, load_schedule

    errors = []
    for path in args.schedules:
        try:
            schedule = load_schedule(path)
        except ScheduleError as exc:
            errors.extend(exc.errors)
            continue
        if schedule.by_epoch:
            extent = f"keyed by epoch, {schedule.epoch_period} epoch(s) a round"
        else:
            extent = f"keyed by time, {schedule.round_seconds:g} s a round"
        rounds = "forever" if schedule.repeat is None else f"{schedule.repeat} round(s)"
        print(f"{path}: ok, {len(schedule.steps)} step(s), {extent}, {rounds}")
    if errors:
        raise ValueError("\n".join(errors))
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flexcomm.emulation import record
    from flexcomm.emulation.schedule import parse_schedule

    path = Path(args.log)
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise ValueError(f"log: cannot read {path}: {exc.strerror}") from None
    kind = args.format if args.format != "auto" else (
        "store" if head.startswith(b"SQLite format 3") else
        "iperf3" if head.lstrip().startswith(b"{") else "mahimahi")
    if kind == "store":
        samples = record.measurement_samples(*_stored_bandwidth(path, args.peer))
        share, what = record.TCP_PAYLOAD_SHARE, "an agent's bandwidth probes (goodput)"
    else:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"log: cannot read {path} as text: {exc}") from None
        if kind == "iperf3":
            samples = record.iperf3_samples(text, str(path))
            share, what = record.TCP_PAYLOAD_SHARE, "an iperf3 --json log (goodput)"
        else:
            samples = record.mahimahi_samples(text, str(path))
            share, what = 1.0, "a mahimahi trace (the link's own rate)"
    window = parse_duration("window", args.window, allow_zero=False)
    merge = parse_fraction("merge", args.merge)
    provenance = (f"Recorded by `flexcomm emulate record` from {what}: {path.name}.\n"
                  f"Windows of {window:g} s, neighbours within {100 * merge:g}% joined"
                  + ("; rates are the goodput / " f"{share:.4f} (TCP payload per wire byte), so "
                     "TCP through the shaper carries the recorded goodput." if share < 1 else "."))
    text = record.schedule_text(samples, window_s=window, merge=merge, payload_share=share,
                                name=args.name or path.stem, provenance=provenance)
    parse_schedule(text, "the recorded schedule")  # what is written must read back
    if args.out:
        Path(args.out).write_text(text)
        print(f"{args.out}: {text.count('[[step]]')} step(s) from {path}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _stored_bandwidth(path: Any, peer: str | None) -> tuple[list[tuple[float, float]], str]:
    """(ts, goodput) of a peer's successful bandwidth probes in a store, oldest
    first, read without changing the file (sqlite3 read-only: `Store` opens a
    store for writing and migrates it, and this may be a running agent's)."""
    import sqlite3

    from flexcomm.store.records import BANDWIDTH

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = conn.execute(
                "SELECT peer, ts, bandwidth_bps FROM measurements WHERE kind = ? AND ok "
                "AND bandwidth_bps IS NOT NULL ORDER BY ts", (BANDWIDTH,)).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise ValueError(f"log: {path} is not a readable flexcomm store ({exc})") from None
    peers = sorted({r[0] for r in rows})
    if peer is None and len(peers) > 1:
        raise ValueError(f"peer: {path} measured {len(peers)} peers ({', '.join(peers)}); "
                         "name one with --peer")
    chosen = peer or (peers[0] if peers else "")
    where = f"{path}: peer {chosen or '(none)'}"
    return [(float(ts), float(bps)) for p, ts, bps in rows if p == chosen], where
