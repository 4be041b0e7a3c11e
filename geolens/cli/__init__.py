"""Command line: ``geolens report`` (the main job), ``geolens zoo train|report`` and ``geolens study run|report``.

Bad arguments stop with exit code 2 and a one-line message before any model is loaded.
``geolens --version`` prints the version; every sub-command's ``--help`` lists its options with
their defaults.

Example:
    $ geolens report --out out/report --n-tokens 1024 --ccr 1
    $ geolens report --quick --out out/quick          # small budgets: that everything runs, quickly
    $ geolens zoo train --widths 64,128 --steps 200
    $ geolens study run examples/studies/pythia_suite.toml --out out/pythia --executor ray
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from geolens import __version__
from geolens.cli.args import HelpFormatter, Parser
from geolens.cli.report import add_report_parser, run_report
from geolens.cli.study import add_study_parser, run_study_command
from geolens.cli.zoo import add_zoo_parser, run_zoo

__all__ = ["build_parser", "main"]

# Shown by `geolens --help`: plain text (the module docstring above is reST for the docs).
DESCRIPTION = """\
Measure the geometry of a language model's representations, layer by layer.

commands:
  geolens report        every analysis on one model: one HTML page, a CSV and JSON per section
  geolens zoo           train and study a family of small models that differ only in width
  geolens study         many models x checkpoints x analyses as one resumable run (local or Ray)
"""

EPILOG = """\
examples:
  geolens report --out out/report                   # the offline default model (SmolLM2-135M)
  geolens report --quick --out out/quick            # small budgets: about a minute on 2 CPU cores
  geolens report --model ./my-model --text my.txt --sections pga,spectrum
  geolens zoo report --train --out out/zoo
  geolens study run examples/studies/pythia_suite.toml --out out/pythia --executor ray

Bad arguments stop with exit code 2 and a one-line message before any model is loaded.
'geolens COMMAND --help' lists a command's options with their defaults.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``geolens`` argument parser with its three sub-commands.

    Example:
        >>> build_parser().parse_args(["report", "--quick"]).quick
        True
    """
    parser = Parser(prog="geolens", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"geolens {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
