"""``geolens report`` (the main job): an HTML + CSV geometry report of a model.

Bad arguments (a model folder that does not exist, a missing or empty text
file, ``--k 0``, an unknown device, ...) stop with exit code 2 and a one-line
message before any model is loaded.

Example:
    $ geolens report --out out/report --n-tokens 1024 --ccr 1
    $ geolens report --quick --out out/quick          # small budgets: that everything runs, quickly
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from geolens.cli.args import (HelpFormatter, device, int_at_least, model_arg, nonnegative_int_list, out_dir, positive_int,
                              read_text_file, text_file)
from geolens.data.models import refused_weights_named
from geolens.model import boot_bridge
from geolens.plotting import NO_BROWSER, STATIC_FORMATS, browser_path
from geolens.analyses import registry
from geolens.report import QUICK, ReportSettings, report
from geolens.report.settings import check_lens_check

__all__ = ["add_report_parser", "run_report"]


def _section_names() -> list[str]:
    # Read when the command runs: analyses registered by then (geolens.register_analysis) are sections too.
    return registry.names("report")


def _name_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in _section_names()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown sections {unknown or text!r}; choose from {_section_names()}")
    return names


def _format_list(text: str) -> list[str]:
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in STATIC_FORMATS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown figure formats {unknown or text!r}; choose from {list(STATIC_FORMATS)}")
    return names


def _lens_check_factor(text: str) -> int:
    """``--lens-check``: what the setting takes (:func:`~geolens.report.settings.check_lens_check`)."""
    try:
        return check_lens_check(int_at_least(0)(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# Budget flags -> (ReportSettings field, type, help). Their argparse default is None ("not given"), so
# that --quick's preset fills every flag the user left out and an explicit flag always wins over it.
_BUDGET_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--n-texts": ("n_texts", positive_int, "texts taken from the default corpus"),
    "--max-length": ("max_length", positive_int, "tokens per text"),
    "--n-tokens": ("n_tokens", int_at_least(3), "token positions sampled"),
    "--k": ("k", positive_int, "readout dimension"),
    "--n-null": ("n_null", int_at_least(2), "random subspaces in the null"),
    "--ccr": ("ccr", nonnegative_int_list, "CCR values (components removed after centring), comma-separated"),
    "--probe-n-texts": ("probe_n_texts", int_at_least(2), "labelled texts for the probe section"),
    "--probe-folds": ("probe_folds", int_at_least(2), "cross-validation folds of the probes"),
    "--convergence-n-tokens": ("convergence_n_tokens", int_at_least(3),
                               "word-end positions of the convergence section"),
    "--lens-n-tokens": ("lens_n_tokens", int_at_least(3),
                        "positions the lens section scores (logit and tuned lens at every layer), sampled from the --n-tokens positions"),
    "--lens-check": ("lens_check", _lens_check_factor,
                     "also train a tuned lens this many times longer and compare its phases k by k (0: off; "
                     "costs about that many times the lens's fit)"),
    "--seed": ("seed", int_at_least(0), "seed of every sample"),
}
# Flags of geolens 0.3.0 -> their names since 0.4.0 (the settings' renames): given, they stop the run naming the new one.
_RENAMED_FLAGS = {"--probe-texts": "--probe-n-texts", "--convergence-positions": "--convergence-n-tokens",
                  "--lens-positions": "--lens-n-tokens"}


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


_DESCRIPTION = """\
Every analysis on one model (default: the offline SmolLM2-135M) and one text (default: BBC News),
written as one self-contained HTML page (report.html) plus a CSV and a JSON file per section.

sections: {sections}
"""

_EPILOG = """\
examples:
  geolens report --out out/report
  geolens report --quick --out out/quick                # small budgets: about a minute on 2 CPU cores
  geolens report --model EleutherAI/pythia-160m --sections pga,spectrum --ccr 0,1
  geolens report --model ./my-model --text a.txt --text b.txt --device cuda
  geolens report --quick --figures png,svg,pdf --out out/quick   # also every figure as a static file

A flag given explicitly always wins over --quick's value. Bad arguments stop with exit code 2
before any model is loaded; a section that fails is shown with its error and the run exits 1.
"""


def add_report_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``report`` sub-command's arguments; defaults and ``--quick`` values come from :mod:`geolens.report`."""
    defaults = ReportSettings()
    sections = ", ".join(_section_names())
    rep = sub.add_parser("report", help="geometry report of a model (default: the offline default model)",
                         description=_DESCRIPTION.format(sections=sections), epilog=_EPILOG,
                         formatter_class=HelpFormatter, renamed_flags=_RENAMED_FLAGS)
    rep.add_argument("--model", type=model_arg, default=None, metavar="PATH_OR_NAME",
                     help="a local Hugging Face model folder (with config.json) or a hub name, booted as a "
                          "TransformerBridge (default: the offline SmolLM2-135M)")
    rep.add_argument("--text", type=text_file, action="append", default=None, metavar="FILE",
                     help="a UTF-8 text file, one text per file (repeatable; default: the offline BBC News texts)")
    rep.add_argument("--out", type=out_dir, default=Path("out/report"), metavar="DIR",
                     help="output folder (default: out/report)")
    rep.add_argument("--quick", action="store_true",
                     help="small budgets for every section (about a minute for the default model on 2 CPU cores); "
                          "flags given explicitly still win")
    for flag, (name, kind, text) in _BUDGET_FLAGS.items():
        default = _shown(getattr(defaults, name)) if getattr(defaults, name) is not None else "min(100, d_model - 1)"
        quick = f"; --quick: {_shown(QUICK[name])}" if name in QUICK else ""
        rep.add_argument(flag, dest=name, type=kind, default=None, metavar=name.upper(),
                         help=f"{text} (default: {default}{quick})")
    rep.add_argument("--sections", type=_name_list, default=None, metavar="A,B,...",
                     help=f"comma-separated sections to run, among {sections} (default: all of them)")
    rep.add_argument("--device", type=device, default=None,
                     help="torch device: cpu, cuda, cuda:1, mps (default: cpu)")
    rep.add_argument("--figures", type=_format_list, default=None, metavar="FMT,...",
                     help=f"also write every figure as <section>-<n>.<ext> next to the CSVs, in these formats "
                          f"among {', '.join(STATIC_FORMATS)} (needs Chromium; default: none)")
    rep.add_argument("--no-progress", action="store_true", help="no progress bars")
    return rep


def _settings_given(args: argparse.Namespace) -> dict[str, Any]:
    """The budget flags given on the command line, as :class:`~geolens.report.ReportSettings` overrides."""
    given = {name: getattr(args, name) for name, _, _ in _BUDGET_FLAGS.values() if getattr(args, name) is not None}
    return {**given, "progress": not args.no_progress}


def _fail(message: str) -> NoReturn:
    """Say what went wrong the way argparse does (one line on stderr) and exit with its code, 2."""
    print(f"geolens report: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run_report(args: argparse.Namespace) -> int:
    import pandas as pd

    if args.figures and browser_path() is None:
        _fail(f"--figures: {NO_BROWSER}")
    model = None
    if args.model is not None:
        try:
            with refused_weights_named(args.model):
                model = boot_bridge(args.model, device=args.device)
        except Exception as error:  # e.g. a hub name with no hub access: no traceback for a bad argument
            first_line = (str(error).strip().splitlines() or [""])[0]
            _fail(f"cannot load --model {args.model!r}: {type(error).__name__}: {first_line}")
    texts = None
    if args.text:
        texts = [read_text_file(path) for path in args.text]  # checked as UTF-8 when the flag was read
    paths = report(model, texts, args.out, sections=args.sections, device=args.device, quick=args.quick,
                   figures=args.figures, **_settings_given(args))
    headline = f"{registry.headline_metric().partition('.')[0]}.csv"  # the headline metric's section, on screen
    if headline in paths:
        table = pd.read_csv(paths[headline])
        with pd.option_context("display.max_rows", 200, "display.width", 160, "display.precision", 4):
            print(table.to_string(index=False))
    meta = json.loads(paths["meta.json"].read_text())
    for name, error in meta["errors"].items():
        print(f"section {name} failed: {error}", file=sys.stderr)
    for name, path in paths.items():
        print(f"wrote {path}")
    return 1 if meta["errors"] else 0
