"""docs/CLI.md, generated from the argument parsers so it cannot drift.

`python -m flexcomm.clidoc > docs/CLI.md` rewrites it; tests/cli/test_clidoc.py
fails when the committed file differs from what the parsers say.
"""

from __future__ import annotations

import argparse
import os

from flexcomm.cli import build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _section(path: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    parser.prog = path
    out = [f"{'#' * level} `{path}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, child in _subparsers(parser).items():
        out += _section(f"{path} {name}", child, min(level + 1, 4))
    return out


def render() -> str:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width; fix it
    try:
        parser = build_parser()
        body = _section("flexcomm", parser, 2)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    lines = ["# CLI reference", "",
             "Generated from the parsers by `python -m flexcomm.clidoc > docs/CLI.md`; do not edit by hand.",
             "Exit codes: 0 success, 1 failure at run time, 2 bad input (the message names what was wrong), "
             "141 the output's reader went away (`flexcomm status | head`).", ""]
    return "\n".join(lines + body).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
