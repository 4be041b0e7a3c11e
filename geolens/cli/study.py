"""``geolens study run SPEC.toml --out DIR`` and ``geolens study report DIR``: studies from the command line.

Bad arguments (a spec file that does not exist, is not TOML or declares an unknown analysis,
``--address`` without ``--executor ray``, Ray not installed, a results folder without a study)
stop with exit code 2 and a one-line message before any model is loaded. A run in which some
cells failed exits 1 (their errors are printed, and kept in the results folder).

Example:
    $ geolens study run examples/studies/pythia_suite.toml --out out/pythia
    $ geolens study run examples/studies/pythia_suite.toml --out out/pythia --executor ray --address auto
    $ geolens study report out/pythia            # out/pythia/report.html
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from geolens.cli.args import HelpFormatter, int_at_least, out_dir

__all__ = ["add_study_parser", "run_study_command"]


def spec_file(text: str):
    """A study TOML file that parses and declares a valid study (checked without loading any model)."""
    from geolens.study import Study

    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"study file {text!r} does not exist" if not path.exists()
                                         else f"{text!r} is not a file")
    try:
        study = Study.from_toml(path)
        study.cells()
    except (ValueError, TypeError, OSError) as err:
        raise argparse.ArgumentTypeError(f"{text}: {err}") from None
    return study


def results_dir(text: str) -> Path:
    """A folder a study wrote (a geolens ``study.json`` or ``cells/``); a missing folder or another tool's
    ``study.json`` is refused with one line."""
    from geolens.study.results import check_study_dir

    try:
        return check_study_dir(text)
    except FileNotFoundError as err:
        raise argparse.ArgumentTypeError(f"{err}; run `geolens study run SPEC.toml --out DIR` first") from None
    except (ValueError, OSError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None


_STUDY_EPILOG = """\
examples:
  geolens study run examples/studies/pythia_suite.toml --out out/pythia
  geolens study run examples/studies/pythia_suite.toml --out out/pythia --executor ray --address auto
  geolens study report out/pythia            # writes out/pythia/report.html
"""


def add_study_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``study run`` and ``study report`` to the ``geolens`` command's sub-parsers."""
    study = sub.add_parser("study", help="many models x checkpoints x analyses as one resumable run",
                           description="Many models x checkpoints x analyses, declared in a TOML file, run as one\n"
                                       "resumable run into a Parquet dataset (locally or on Ray).",
                           epilog=_STUDY_EPILOG, formatter_class=HelpFormatter)
    actions = study.add_subparsers(dest="study_command", required=True)
    run = actions.add_parser("run", help="compute every unfinished cell of a study file into a Parquet dataset",
                             description="Compute every unfinished cell of a study file into a Parquet dataset;\n"
                                         "a rerun skips the finished cells.", epilog=_STUDY_EPILOG,
                             formatter_class=HelpFormatter)
    run.add_argument("spec", type=spec_file, metavar="SPEC.toml", help="the study file")
    run.add_argument("--out", type=out_dir, required=True, help="results folder (a rerun resumes it)")
    run.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="local: this process, cell after cell; ray: one Ray task per cell (default: local)")
    run.add_argument("--address", default=None,
                     help="Ray cluster to join (auto, ray://host:10001); default: start a local one")
    run.add_argument("--max-retries", type=int_at_least(0), default=2,
                     help="times Ray re-runs a cell whose worker died (default: 2)")
    run.add_argument("--report", action="store_true", help="write DIR/report.html at the end")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    report = actions.add_parser("report", help="the cross-model views of a study's results as one HTML page",
                                description="The cross-model views of a study's results as one HTML page.",
                                formatter_class=HelpFormatter)
    report.add_argument("dir", type=results_dir, metavar="DIR", help="the study's results folder")
    report.add_argument("--out", default=None, help="the page (default: DIR/report.html)")


def run_study_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``geolens study run|report``; returns the exit code."""
    import pandas as pd

    from geolens.study import run_study, study_report

    from geolens.study.results import check_study_dir

    if args.study_command == "report":
        try:
            page = study_report(args.dir, path=args.out)
        except (ValueError, OSError) as err:
            parser.error(str(err))
        print(f"wrote {page}")
        return 0
    if args.address is not None and args.executor != "ray":
        parser.error("--address needs --executor ray")
    if args.executor == "ray" and importlib.util.find_spec("ray") is None:
        parser.error("--executor ray needs Ray (the extra geolens-tl[ray]): pip install 'ray>=2.9'")
    try:
        check_study_dir(args.out, writing=True)  # another tool's study.json there is never overwritten
    except (ValueError, OSError) as err:
        parser.error(f"--out: {err}")
    result = run_study(args.spec, args.out, executor=args.executor, address=args.address,
                       max_retries=args.max_retries, progress=not args.no_progress)
    params: dict[str, Any] = result.params
    print(f"study {params['name']}: {len(params['computed'])} cells computed, {len(params['skipped'])} already "
          f"finished, {len(params['failed'])} failed ({params['seconds']} s)")
    table = result.to_pandas()
    if not table.empty:
        with pd.option_context("display.width", 200, "display.precision", 3, "display.max_columns", 30):
            print(result.summary().to_string(index=False))
    for cell, error in params["failed"].items():
        print(f"cell {cell} failed: {error}", file=sys.stderr)
    print(f"wrote {args.out}")
    if args.report and not table.empty:
        print(f"wrote {study_report(args.out)}")
    return 1 if params["failed"] else 0
