"""Command line: ``geolens report`` (the main job) writes an HTML + CSV geometry report.

Example:
    $ geolens report --out out/report --n-tokens 1024 --ccr 1
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

__all__ = ["main"]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _section_names() -> list[str]:
    from geolens.report import SECTIONS

    return list(SECTIONS)


def _name_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in _section_names()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown sections {unknown or text!r}; choose from {_section_names()}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geolens", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="geometry report of a model (default: the offline default model)")
    rep.add_argument("--model", default=None,
                     help="a local HF model folder or hub name, booted as a TransformerBridge (default: SmolLM2-135M)")
    rep.add_argument("--text", action="append", default=None, help="a text file (repeatable); default: BBC News")
    rep.add_argument("--out", default="out/report", help="output folder")
    rep.add_argument("--n-texts", type=_positive, default=32, help="texts taken from the default corpus")
    rep.add_argument("--max-length", type=_positive, default=128, help="tokens per text")
    rep.add_argument("--n-tokens", type=_positive, default=1024, help="token positions sampled")
    rep.add_argument("--k", type=_positive, default=None, help="readout dimension (default min(100, d-1))")
    rep.add_argument("--n-null", type=_positive, default=100, help="random subspaces in the null")
    rep.add_argument("--ccr", type=_int_list, default=[1, 5, 10],
                     help="CCR values (components removed after centring), comma-separated")
    rep.add_argument("--sections", type=_name_list, default=None,
                     help="comma-separated sections (default all): " + ", ".join(_section_names()))
    rep.add_argument("--probe-texts", type=_positive, default=150, help="labelled texts for the probe section")
    rep.add_argument("--seed", type=int, default=0)
    rep.add_argument("--device", default=None)
    rep.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        return _report(args)
    return 2  # pragma: no cover - argparse enforces the command


def _report(args: argparse.Namespace) -> int:
    import pandas as pd

    from geolens.report import report

    model = None
    if args.model is not None:
        from geolens.model import boot_bridge

        model = boot_bridge(args.model, device=args.device)
    texts = None
    if args.text:
        from pathlib import Path

        texts = [Path(p).read_text(encoding="utf-8", errors="replace") for p in args.text]
    paths = report(model, texts, args.out, sections=args.sections, device=args.device, n_texts=args.n_texts,
                   max_length=args.max_length, n_tokens=args.n_tokens, k=args.k, n_null=args.n_null, ccr=args.ccr,
                   seed=args.seed, probe_texts=args.probe_texts, progress=not args.no_progress)
    if "pga.csv" in paths:
        table = pd.read_csv(paths["pga.csv"])
        with pd.option_context("display.max_rows", 200, "display.width", 160, "display.precision", 4):
            print(table.to_string(index=False))
    meta = json.loads(paths["meta.json"].read_text())
    for name, error in meta["errors"].items():
        print(f"section {name} failed: {error}", file=sys.stderr)
    for name, path in paths.items():
        print(f"wrote {path}")
    return 1 if meta["errors"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
