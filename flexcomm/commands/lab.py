"""`flexcomm lab`: an emulated cluster on this machine, real training under a
network schedule, once per policy, and a report.

    flexcomm lab run [--out DIR] [--nodes 4] [--workload lm] [--schedule FILE|NAME]
                     [--policies ...|all] [--repeats N] [--budget-s SECONDS]
                     [--targets 2.6,tight]
    flexcomm lab report DIR          # rebuild the report of a finished run
    flexcomm lab clean               # remove what a killed run or calibration left

As root, each node is a network namespace on a bridge, its link shaped in both
directions by the schedule; without root every rank runs on loopback, unshaped
(said up front). Everything is removed on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from flexcomm.commands.lab_calibrate import add_parser as add_calibrate_parser
from flexcomm.units import format_rate

EXAMPLES = """examples:
  flexcomm lab run --out runs/lab
  flexcomm lab calibrate --quick
  flexcomm lab clean
"""


def _per_workload(setting: str) -> str:
    from flexcomm.lab.plan import WORKLOAD_DEFAULTS

    return ", ".join(f"{name} {d[setting]}" for name, d in WORKLOAD_DEFAULTS.items()
                     if d.get(setting) is not None)


def register(subparsers: argparse._SubParsersAction) -> None:
    # Names only: the parser is built for every command (the agent's too), which must not wait for torch.
    from flexcomm.lab.plan import DEFAULT_POLICIES, DEFAULT_WORKLOAD, OPTIMIZERS, WORKLOAD_DEFAULTS, named_schedules

    parser = subparsers.add_parser(
        "lab", help="emulated multi-node cluster: train under a network schedule, compare policies",
        description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION", required=True)

    run = sub.add_parser("run", help="run the lab and write its report")
    run.add_argument("--out", help="run directory (default runs/lab-<time>)")
    run.add_argument("--nodes", type=int, default=4, help="nodes = ranks (default 4)")
    run.add_argument("--schedule", help="emulation schedule: a TOML file, or the name of one in "
                     f"examples/schedules ({', '.join(named_schedules())}); default: 20 Mbit/s and "
                     "1 Gbit/s in turn, 15 s each")
    run.add_argument("--policies", help=f"space/comma separated (default: "
                     f"{' '.join(DEFAULT_POLICIES)}; `all`: every baseline); see flexcomm.lab.plan")
    run.add_argument("--repeats", type=int, default=1,
                     help="runs of each policy, interleaved; the report gives medians and "
                     "spreads (default 1)")
    run.add_argument("--workload", choices=tuple(WORKLOAD_DEFAULTS), default=DEFAULT_WORKLOAD,
                     help=f"what to train (default {DEFAULT_WORKLOAD}); see flexcomm.lab.workload")
    run.add_argument("--steps", type=int, default=None,
                     help=f"training steps per policy (default: {_per_workload('steps')})")
    run.add_argument("--batch", type=int, default=None,
                     help=f"samples per rank per step (default: {_per_workload('batch')})")
    run.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                     help=f"adam is AdamW without weight decay (default: {_per_workload('optimizer')})")
    run.add_argument("--lr", type=float, default=None,
                     help=f"learning rate (default: {_per_workload('lr')})")
    run.add_argument("--eval-every", type=int, default=None,
                     help=f"steps between evaluations (default: {_per_workload('eval_every')})")
    run.add_argument("--target", type=float, default=None,
                     help="target test accuracy, a fraction, or for lm a validation loss in nats "
                     f"(default: {_per_workload('target')})")
    run.add_argument("--targets", default=None,
                     help="comma separated targets the report times every policy to: numbers "
                     "as --target, or `tight` (dense's final figure + 0.05 nats for lm, - 0.3 "
                     "points of accuracy otherwise); default: the target and tight")
    run.add_argument("--budget-s", type=float, default=None,
                     help="train every policy for this many seconds, each doing as many steps "
                     "as it can (a time-keyed schedule only); default under a time-keyed "
                     "schedule: dense's time for --steps; an epoch-keyed one: equal steps")
    run.add_argument("--hidden", type=int, default=None,
                     help=f"model width: sets the gradient size (default: {_per_workload('hidden')})")
    run.add_argument("--depth", type=int, default=None,
                     help=f"model layers or blocks (default: {_per_workload('depth')})")
    run.add_argument("--samples", type=int, default=None,
                     help=f"synthetic: samples; lm: windows per epoch (default: {_per_workload('samples')})")
    run.add_argument("--features", type=int, default=None, help="synthetic: input features")
    run.add_argument("--decisions", choices=("agent", "inprocess"), default="agent",
                     help="rank 0 asks its node's flexcomm agent (default) or runs the "
                     "policy in-process")
    run.add_argument("--control-interval", type=int, default=None,
                     help="steps between rank agreements, the hook's K (default 2)")
    run.add_argument("--prefix", default="flexlab", help="namespace name prefix")
    run.add_argument("--subnet", default="10.213.0.0/24", help="the nodes' subnet")
    run.add_argument("--loopback", action="store_true",
                     help="no namespaces even as root: loopback, unshaped")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    run.set_defaults(func=cmd_run)

    report = sub.add_parser("report", help="rebuild the report of a run directory")
    report.add_argument("out", help="the run directory")
    report.set_defaults(func=cmd_report)

    clean = sub.add_parser("clean", help="remove what a killed run or calibration left: namespaces, "
                           "processes, socket directories")
    clean.add_argument("--prefix", action="append",
                       help="a lab command's prefix; repeatable (default: flexlab and flexcal, "
                            "the defaults of run and calibrate); a prefix a live command holds "
                            "is left alone, and said so")
    clean.set_defaults(func=cmd_clean)

    add_calibrate_parser(sub)


def build_config(args: argparse.Namespace) -> Any:
    from flexcomm.lab.plan import DEFAULT_POLICIES, SCHEDULES_DIR, parse_policies, schedule_file
    from flexcomm.lab.runner import LabConfig
    from flexcomm.lab.workload import WorkloadSpec

    workload = {k: getattr(args, k) for k in ("hidden", "depth", "samples", "features")
                if getattr(args, k) is not None}
    kw: dict[str, Any] = {}
    for name in ("steps", "batch", "optimizer", "lr", "eval_every", "target", "control_interval",
                 "budget_s"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if args.schedule:
        path = schedule_file(args.schedule)
        try:
            kw["schedule_text"] = path.read_text()
        except OSError as exc:
            raise ValueError(f"schedule: cannot read {path}: {exc.strerror}") from None
        kw["schedule_name"] = args.schedule if path.parent == SCHEDULES_DIR else str(path)
    if args.targets is not None:
        kw["targets"] = [t.strip() for t in args.targets.split(",") if t.strip()]
    out = Path(args.out or f"runs/lab-{time.strftime('%Y%m%d-%H%M%S')}")
    return LabConfig(
        out=out, policies=parse_policies(args.policies or " ".join(DEFAULT_POLICIES)),
        nodes=args.nodes, workload=WorkloadSpec(name=args.workload, **workload),
        repeats=args.repeats, prefix=args.prefix, subnet=args.subnet, decisions=args.decisions,
        namespaces=False if args.loopback else None, **kw,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from flexcomm.emulation.revert import terminate_as_exception
    from flexcomm.lab.cluster import can_use_namespaces
    from flexcomm.lab.runner import LabError, run_lab
    from flexcomm.lab.table import format_table

    cfg = build_config(args)
    usable, why = can_use_namespaces()
    if args.loopback or not usable:
        print(f"flexcomm lab: {why or '--loopback'}: every rank runs on loopback and the links "
              "are NOT shaped; the schedule is not applied", file=sys.stderr)
    view = TerminalProgress(quiet=args.quiet)
    start = time.monotonic()
    try:
        with terminate_as_exception():
            summary = run_lab(cfg, progress=view)
    except LabError as exc:
        view.finish()
        print(f"flexcomm lab: {exc}", file=sys.stderr)
        return 1
    except SystemExit:
        raise
    except BaseException as exc:
        view.finish()
        if type(exc).__name__ == "_Terminated":
            print("flexcomm lab: terminated; cleaned up", file=sys.stderr)
            return 143
        raise
    view.finish()
    print(format_table(summary))
    print(f"\nreport: {cfg.out}/summary.json, summary.txt, network.png, quality.png, "
          f"step_time.png ({time.monotonic() - start:.0f} s in all)")
    for label, why in summary.failed.items():
        print(f"flexcomm lab: {label} failed: {why}", file=sys.stderr)
    return 1 if summary.failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    from flexcomm.lab.report import write_report
    from flexcomm.lab.table import format_table

    out = Path(args.out)
    if not (out / "config.json").exists():
        raise ValueError(f"out: {out} is not a lab run directory (no config.json)")
    print(format_table(write_report(out)))
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from flexcomm.lab.cleanup import DEFAULT_PREFIXES, LabBusy, clean

    for prefix in args.prefix or DEFAULT_PREFIXES:
        try:
            gone = clean(prefix)
        except LabBusy as busy:
            print(f"{prefix}: left alone: {busy}")
            continue
        print(f"{prefix}: removed {len(gone['namespaces'])} namespace(s) {' '.join(gone['namespaces'])}; "
              f"stopped {len(gone['processes'])} process(es); removed {len(gone['directories'])} "
              "socket directory(ies)")
    return 0


class TerminalProgress:
    """One line per policy that updates in place on a terminal (a line per
    evaluation otherwise)."""

    def __init__(self, quiet: bool = False, stream: Any = None) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.steps = 0
        self.state: dict[str, Any] = {}
        self._open_line = False

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "cluster":
            self._cluster(event)
        elif kind == "agents":
            self._print(f"starting {event['count']} flexcomm agent(s)")
        elif kind == "policy":
            self.finish()
            repeat = (f" (repeat {event['repeat'] + 1}/{event['repeats']})"
                      if event.get("repeats", 1) > 1 else "")
            self._print(f"[{event['index'] + 1}/{event['count']}] {event['policy']}{repeat}")
        elif kind == "budget":
            self._print(f"  every other policy trains {event['budget_s']:.1f} s "
                        f"({event['policy']}'s time)")
        elif kind == "start":
            self.steps = event["steps"]
        elif kind == "step":
            self.state.update(event)
            if self.tty:
                self._status()
        elif kind == "eval":
            self.state["accuracy"] = event["accuracy"]
            self.state["loss"] = event.get("loss")
            if not self.tty and (event["step"] % max(1, (self.steps or 100) // 10) < 5
                                 or event["step"] == self.steps):
                self._status()
        elif kind == "failed":
            self._print(f"  FAILED: {event['message'].strip().splitlines()[0]}")
        elif kind == "warning":
            self._print(f"  warning: {event['message']}")

    def _cluster(self, event: dict[str, Any]) -> None:
        nodes = event["nodes"]
        if event["shaped"]:
            names = ", ".join(n["ns"] for n in nodes)
            self._print(f"cluster: {len(nodes)} nodes (namespaces {names}), links shaped")
        else:
            self._print(f"cluster: {len(nodes)} ranks on loopback, links NOT shaped "
                        f"({event['reason_unshaped']})")

    def _status(self) -> None:
        s = self.state
        link = "unshaped" if not s.get("link") else format_rate(s["link"])
        choice = (f"{s['compression']}@{s.get('collective')}" if s.get("compression")
                  else f"{s.get('collective')}")
        acc = f"{100 * s['accuracy']:.1f}%" if "accuracy" in s else "-"
        loss = f" loss {s['loss']:.3f} |" if s.get("loss") is not None else ""
        line = (f"  step {s.get('step', 0) + 1}/{self.steps or '-'} epoch {s.get('epoch', 0)} "
                f"link {link} | {choice} | acc {acc} |{loss} {s.get('t', 0):.1f} s")
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
            self._open_line = True
        else:
            self._print(line)

    def _print(self, line: str) -> None:
        if self.quiet:
            return
        if self._open_line:
            self.stream.write("\n")
            self._open_line = False
        self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False
        self.state = {}
