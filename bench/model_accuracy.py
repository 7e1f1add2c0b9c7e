"""Validate the cost model against real gloo collectives on the emulated cluster.

    sudo .venv/bin/python bench/model_accuracy.py --out runs/model-accuracy [--quick]

The same code as `flexcomm lab calibrate` (flexcomm/commands/lab_calibrate.py,
where the options are described): times dense ring AllReduce, AG-Topk, AR-Topk
Ring and AR-Topk Tree over a grid of link rates, node counts, gradient sizes and
CRs, compares the cost model's predictions (raw, and calibrated on a held-out
half) and the regret of its choices. Writes measured.json, table.csv,
predicted_vs_measured.png and model_accuracy.json to --out; the last printed
line is model_accuracy.json's object. `--from DIR` re-analyses an earlier run.

Needs root (network namespaces); namespaces "fcvb*", subnet 10.215.0.0/24 unless
--prefix/--subnet say otherwise.
"""

from __future__ import annotations

import argparse
import sys

from flexcomm.commands.lab_calibrate import add_arguments, cmd_calibrate

PREFIX = "fcvb"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, prefix=PREFIX)
    return cmd_calibrate(p.parse_args(argv))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
