"""Command line: ``geolens report`` (the main job), ``geolens zoo train|report`` and ``geolens study run|report``.

Bad arguments stop with exit code 2 and a one-line message before any model is loaded.

Example:
    $ geolens report --out out/report --n-tokens 1024 --ccr 1
    $ geolens report --quick --out out/quick          # small budgets: about a minute on 2 CPU cores
    $ geolens zoo train --widths 64,128 --steps 200
    $ geolens study run examples/studies/pythia_suite.toml --out out/pythia --executor ray
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


from geolens.cli.report import add_report_parser, run_report
from geolens.cli.study import add_study_parser, run_study_command
from geolens.cli.zoo import add_zoo_parser, run_zoo

__all__ = ["build_parser", "main"]





def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geolens", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_report_parser(sub)
    add_zoo_parser(sub)
    add_study_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "report":
        return run_report(args)
    if args.command == "zoo":
        return run_zoo(args, parser)
    if args.command == "study":
        return run_study_command(args, parser)
    return 2  # pragma: no cover - argparse enforces the command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
