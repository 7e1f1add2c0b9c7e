"""The `flexcomm` command line.

Each subcommand lives in its own module under `flexcomm/commands/` with a
`register(subparsers)` function that adds its parser and sets `func`. Heavy
imports (torch, grpc, pyroute2) happen inside the handlers, so `flexcomm model`
starts fast and the daemon side runs without torch.

Exit codes: 0 success, 1 a failure at run time, 2 bad input (flag, file, unit):
the message names what was wrong and no traceback is printed; 141 when the
reader of the output went away (`flexcomm status | head`), silently, as a
program ended by SIGPIPE.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from flexcomm import __version__

# Subcommand modules, in the order `flexcomm --help` lists them.
COMMANDS = ("model", "probe", "emulate", "agent", "status", "lab")
EXIT_BROKEN_PIPE = 128 + 13  # as if ended by SIGPIPE


class UsageError(ValueError):
    """Bad input from the user; printed without a traceback, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flexcomm",
        description="Adaptive gradient compression and collectives for networks that change.",
    )
    parser.add_argument("--version", action="version", version=f"flexcomm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"flexcomm.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"flexcomm.commands.{name}":
                continue  # that part is not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to write
        return EXIT_BROKEN_PIPE
    except ValueError as exc:  # UsageError included: bad input, named by the raiser
        print(f"flexcomm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flexcomm {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
