"""``geolens zoo train`` and ``geolens zoo report``: the offline width family from the command line.

Example:
    $ geolens zoo train --widths 64,128,256,512 --layers 6 --steps 400
    $ geolens zoo report --widths 64,128,256,512 --layers 6 --steps 400 --out out/zoo
    $ geolens zoo report --quick --train --widths 32,64 --layers 4 --steps 100   # a small study end to end
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from geolens.cli.args import HelpFormatter, int_list, out_dir, positive_float, positive_int

__all__ = ["add_zoo_parser", "run_zoo"]

# Family flags -> ZooConfig fields. Left unset, a flag keeps the default (or the family found in --dir).
_FAMILY_FLAGS = {"widths": "widths", "layers": "n_layers", "d_head": "d_head", "vocab_size": "vocab_size",
                 "seq_len": "seq_len", "batch_size": "batch_size", "steps": "steps", "lr": "lr", "seed": "seed",
                 "checkpoints": "checkpoints"}
# Flags of `zoo report` in geolens 0.3.0 -> their names since 0.4.0 (the settings' renames).
_RENAMED_FLAGS = {"--k-fraction": "--k", "--lens-steps": "--lens-max-steps"}


def _at(text: str) -> str | list[int]:
    return text if text in ("all", "final") else int_list(text)


def _analyses(text: str) -> list[str]:
    from geolens.zoo.width_study import zoo_analyses

    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in zoo_analyses()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown analyses {unknown or text!r}; choose from {zoo_analyses()}")
    return names


def _family_parser() -> argparse.ArgumentParser:
    from geolens.zoo.train import ZooConfig

    c = ZooConfig()
    family = argparse.ArgumentParser(add_help=False)
    group = family.add_argument_group(
        "the family",
        "Flags left out keep these defaults, or the settings of the family found in --dir.")
    group.add_argument("--widths", type=int_list, default=None,
                       help=f"d_model of each member, comma-separated (default: {','.join(map(str, c.widths))})")
    group.add_argument("--layers", type=positive_int, default=None, help=f"blocks per model (default: {c.n_layers})")
    group.add_argument("--d-head", type=positive_int, default=None,
                       help=f"head size; heads = width / d_head (default: {c.d_head})")
    group.add_argument("--vocab-size", type=positive_int, default=None,
                       help=f"BPE vocabulary trained on the corpus (default: {c.vocab_size})")
    group.add_argument("--seq-len", type=positive_int, default=None,
                       help=f"tokens per training window (default: {c.seq_len})")
    group.add_argument("--batch-size", type=positive_int, default=None,
                       help=f"windows per step (default: {c.batch_size})")
    group.add_argument("--steps", type=positive_int, default=None, help=f"training steps (default: {c.steps})")
    group.add_argument("--lr", type=positive_float, default=None, help=f"peak learning rate (default: {c.lr:g})")
    group.add_argument("--seed", type=int, default=None,
                       help=f"initialisation and data order (default: {c.seed})")
    group.add_argument("--checkpoints", type=int_list, default=None,
                       help="steps to save, comma-separated (default: 0, the powers of two from 16, and the last)")
    group.add_argument("--dir", default=None,
                       help="the family's folder (default: <geolens cache>/zoo/<family key>)")
    family.add_argument("--no-progress", action="store_true", help="no progress bars")
    return family


_ZOO_EPILOG = """\
examples:
  geolens zoo train --widths 64,128,256,512 --layers 6 --steps 400
  geolens zoo report --train --out out/zoo
  geolens zoo report --quick --train --widths 32,64 --layers 4 --steps 100   # a small study end to end
"""


def add_zoo_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``zoo train`` and ``zoo report`` to the ``geolens`` command's sub-parsers."""
    from geolens.zoo.width_study import ZooReportSettings, zoo_analyses

    s, q = ZooReportSettings(), ZooReportSettings.quick()

    def budget(name: str) -> str:
        shown = lambda v: ",".join(map(str, v)) if isinstance(v, (tuple, list)) else f"{v:g}" if isinstance(v, float) else str(v)  # noqa: E731
        return f"(default: {shown(getattr(s, name))}; --quick: {shown(getattr(q, name))})"

    family = _family_parser()
    zoo = sub.add_parser("zoo", help="train and study a family of small GPT-NeoX models that differ only in width",
                         description="Train (cached, resumable) and study a family of small GPT-NeoX models that "
                                     "differ only in width.", epilog=_ZOO_EPILOG, formatter_class=HelpFormatter)
    actions = zoo.add_subparsers(dest="zoo_command", required=True, metavar="{train,report}")
    train = actions.add_parser("train", parents=[family], help="train (or resume) every member of the family",
                               description="Train (or resume) every member of the family; finished checkpoints\n"
                                           "are kept, so a stopped run resumes where it stopped.",
                               formatter_class=HelpFormatter)
    train.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                       help="train only up to this step, to resume later (default: train to --steps)")
    report = actions.add_parser("report", parents=[family],
                                help="PGA (CCR sweep), spectra and phases on every member and checkpoint",
                                description="PGA (CCR sweep), spectra and phases on every member and checkpoint\n"
                                            "of the family; writes zoo.html, zoo.csv and zoo.json.",
                                epilog=_ZOO_EPILOG, formatter_class=HelpFormatter, renamed_flags=_RENAMED_FLAGS)
    report.add_argument("--out", type=out_dir, default=Path("out/zoo"), metavar="DIR",
                        help="output folder (default: out/zoo)")
    report.add_argument("--train", action="store_true", help="train the members that are missing first")
    report.add_argument("--at", type=_at, default="all",
                        help="checkpoints to analyse: all, final, or comma-separated steps (default: all)")
    report.add_argument("--analyses", type=_analyses, default=None, metavar="A,B,...",
                        help=f"among {','.join(zoo_analyses())} (default: all of them)")
    report.add_argument("--quick", action="store_true",
                        help="small budgets (seconds per checkpoint); flags given explicitly still win")
    report.add_argument("--n-texts", type=positive_int, default=None, help=f"held-out texts analysed {budget('n_texts')}")
    report.add_argument("--n-tokens", type=positive_int, default=None, help=f"token positions sampled {budget('n_tokens')}")
    report.add_argument("--n-null", type=positive_int, default=None,
                        help=f"random subspaces in the PGA null {budget('n_null')}")
    report.add_argument("--ccr", type=int_list, default=None, help=f"CCR values, comma-separated {budget('ccr')}")
    report.add_argument("--k", type=positive_float, default=None,
                        help=f"readout k as a fraction of d_model, below 1 {budget('k')}")
    report.add_argument("--lens-max-steps", type=positive_int, default=None,
                        help=f"tuned-lens training steps per checkpoint {budget('lens_max_steps')}")


def _zoo_of(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The family the flags describe: from ``--dir`` if it holds one (flags must agree), else built from the flags."""
    from geolens.zoo.train import FAMILY_FILE, Zoo, ZooConfig, zoo_root

    given = {field: getattr(args, flag) for flag, field in _FAMILY_FLAGS.items() if getattr(args, flag) is not None}
    if "checkpoints" in given:
        given["checkpoints"] = tuple(given["checkpoints"])
    if "widths" in given:
        given["widths"] = tuple(given["widths"])
    if args.dir is not None and (Path(args.dir).expanduser() / FAMILY_FILE).is_file():
        zoo = Zoo.open(args.dir, widths=given.get("widths"))
        clash = {k: v for k, v in given.items() if k != "widths" and getattr(zoo.config, k) != v}
        if clash:
            parser.error(f"--dir {args.dir} holds a family with other settings than {clash}: "
                         f"{zoo.config.family()}; leave those flags out or choose another --dir")
        return zoo
    try:
        config = ZooConfig(**given)
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    return Zoo(config, zoo_root(config, args.dir))


def run_zoo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``geolens zoo train|report``; returns the exit code."""
    import pandas as pd

    from geolens.zoo.train import train_zoo

    zoo = _zoo_of(args, parser)
    progress = not args.no_progress
    if args.zoo_command == "train" or args.train:
        stop_at = getattr(args, "stop_at", None)
        if stop_at is not None and not 0 <= stop_at <= zoo.config.steps:
            parser.error(f"--stop-at must lie in [0, {zoo.config.steps}], got {stop_at}")
        zoo = train_zoo(zoo.config, zoo.root, stop_at=stop_at, progress=progress)
        with pd.option_context("display.width", 160, "display.max_colwidth", 80):
            print(zoo.to_pandas().drop(columns="path").to_string(index=False))
        print(f"zoo: {zoo.root} (train time {zoo.train_time_s} s)")
        if args.zoo_command == "train":
            return 0
    return _report(zoo, args, parser, progress)


def _report(zoo, args: argparse.Namespace, parser: argparse.ArgumentParser, progress: bool) -> int:
    import pandas as pd

    from geolens.zoo.width_study import ZooReportSettings, zoo_report

    overrides: dict[str, Any] = {name: getattr(args, name) for name in
                                 ("n_texts", "n_tokens", "n_null", "k", "lens_max_steps")
                                 if getattr(args, name) is not None}
    if args.ccr is not None:
        overrides["ccr"] = tuple(args.ccr)
    if args.k is not None and not args.k < 1:
        parser.error(f"--k must be below 1, got {args.k}")
    settings = (ZooReportSettings.quick if args.quick else ZooReportSettings)(progress=progress, **overrides)
    try:
        result = zoo_report(zoo, args.out, checkpoints=args.at, analyses=args.analyses or None,
                            settings=settings)
    except FileNotFoundError as err:
        print(f"geolens zoo report: {err} (or pass --train)", file=sys.stderr)
        return 1
    except ValueError as err:
        parser.error(str(err))
    with pd.option_context("display.width", 200, "display.precision", 3, "display.max_columns", 30):
        print(result.summary().to_string(index=False))
    for name, path in result.params["paths"].items():
        print(f"wrote {path}")
    return 0
