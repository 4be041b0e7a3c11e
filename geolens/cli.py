"""Command line: ``geolens report`` (the main job) writes an HTML + CSV geometry report.

Bad arguments (a model folder that does not exist, a missing or empty text
file, ``--k 0``, an unknown device, ...) stop with exit code 2 and a one-line
message before any model is loaded.

Example:
    $ geolens report --out out/report --n-tokens 1024 --ccr 1
    $ geolens report --quick --out out/quick          # small budgets: about a minute on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

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


def _looks_like_path(text: str) -> bool:
    """Whether ``--model`` names a local folder rather than a hub model (``org/name`` or ``name``).

    Example:
        >>> _looks_like_path("EleutherAI/pythia-70m"), _looks_like_path("./pythia-70m"), _looks_like_path("a/b/c")
        (False, True, True)
    """
    if text in (".", "..") or text.startswith(("./", "../", "/", "~", ".\\", "..\\")) or "\\" in text:
        return True
    return text.count("/") > 1 or Path(text).exists()  # hub names have at most one "/"


def _model_arg(text: str) -> str:
    """A hub name, passed through; or a local Hugging Face model folder, which must exist and hold config.json.

    Example:
        >>> _model_arg("EleutherAI/pythia-70m")
        'EleutherAI/pythia-70m'
    """
    if not _looks_like_path(text):
        return text
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"model folder {text!r} does not exist")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a model folder (a folder with config.json)")
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"model folder {text!r} has no config.json (not a Hugging Face model folder)")
    return str(path)


def _text_file(text: str) -> Path:
    """A readable, non-empty text file.

    Example:
        >>> _text_file("README.md").name        # doctest: +SKIP
        'README.md'
    """
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"text file {text!r} does not exist")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    try:
        content = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read text file {text!r}: {error.strerror or error}") from None
    if not content.strip():
        raise argparse.ArgumentTypeError(f"text file {text!r} is empty")
    return path


def _out_dir(text: str) -> Path:
    """An output folder that exists or can be made: neither it nor a folder above it may be a file.

    Example:
        >>> _out_dir("out/report")
        PosixPath('out/report')
    """
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is an existing file, not a folder")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise argparse.ArgumentTypeError(f"cannot make folder {text!r}: {str(blocking)!r} is a file")
    return path


def _device(text: str) -> str:
    """A torch device string (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ...) whose backend this machine has.

    Example:
        >>> _device("cpu")
        'cpu'
    """
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"device {text!r}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"device {text!r}: MPS is not available on this machine")
    return text


# Budget flags -> (ReportSettings field, type, help). Their argparse default is None ("not given"), so
# that --quick's preset fills every flag the user left out and an explicit flag always wins over it.
_BUDGET_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--n-texts": ("n_texts", _positive, "texts taken from the default corpus"),
    "--max-length": ("max_length", _positive, "tokens per text"),
    "--n-tokens": ("n_tokens", _positive, "token positions sampled"),
    "--k": ("k", _positive, "readout dimension"),
    "--n-null": ("n_null", _positive, "random subspaces in the null"),
    "--ccr": ("ccr", _int_list, "CCR values (components removed after centring), comma-separated"),
    "--probe-texts": ("probe_texts", _positive, "labelled texts for the probe section"),
    "--probe-folds": ("probe_folds", _positive, "cross-validation folds of the probes"),
    "--convergence-positions": ("convergence_positions", _positive, "word-end positions of the convergence section"),
    "--seed": ("seed", int, "seed of every sample"),
}


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _add_report_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``report`` sub-command's arguments; defaults and ``--quick`` values come from :mod:`geolens.report`."""
    from geolens.report import QUICK, ReportSettings

    defaults = ReportSettings()
    rep = sub.add_parser("report", help="geometry report of a model (default: the offline default model)")
    rep.add_argument("--model", type=_model_arg, default=None,
                     help="a local HF model folder or hub name, booted as a TransformerBridge (default: SmolLM2-135M)")
    rep.add_argument("--text", type=_text_file, action="append", default=None,
                     help="a text file (repeatable); default: BBC News")
    rep.add_argument("--out", type=_out_dir, default=Path("out/report"), help="output folder (default out/report)")
    rep.add_argument("--quick", action="store_true",
                     help="small budgets for every section (about a minute for the default model on 2 CPU cores); "
                          "flags given explicitly still win")
    for flag, (name, kind, text) in _BUDGET_FLAGS.items():
        default = _shown(getattr(defaults, name)) if getattr(defaults, name) is not None else "min(100, d - 1)"
        quick = f"; --quick: {_shown(QUICK[name])}" if name in QUICK else ""
        rep.add_argument(flag, dest=name, type=kind, default=None, help=f"{text} (default {default}{quick})")
    rep.add_argument("--sections", type=_name_list, default=None,
                     help="comma-separated sections (default all but lens, phases): " + ", ".join(_section_names()))
    rep.add_argument("--device", type=_device, default=None, help="torch device, e.g. cpu, cuda, cuda:1 (default cpu)")
    rep.add_argument("--no-progress", action="store_true", help="no progress bars")
    return rep


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geolens", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_report_parser(sub)
    from geolens.zoo.cli import add_zoo_parser

    add_zoo_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "report":
        return _report(args)
    if args.command == "zoo":
        from geolens.zoo.cli import run_zoo

        return run_zoo(args, parser)
    return 2  # pragma: no cover - argparse enforces the command


def _settings_given(args: argparse.Namespace) -> dict[str, Any]:
    """The budget flags given on the command line, as :class:`~geolens.report.ReportSettings` overrides."""
    given = {name: getattr(args, name) for name, _, _ in _BUDGET_FLAGS.values() if getattr(args, name) is not None}
    return {**given, "progress": not args.no_progress}


def _fail(message: str) -> NoReturn:
    """Say what went wrong the way argparse does (one line on stderr) and exit with its code, 2."""
    print(f"geolens report: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _report(args: argparse.Namespace) -> int:
    import pandas as pd

    from geolens.report import report

    model = None
    if args.model is not None:
        from geolens.model import boot_bridge

        try:
            model = boot_bridge(args.model, device=args.device)
        except Exception as error:  # e.g. a hub name with no hub access: no traceback for a bad argument
            first_line = (str(error).strip().splitlines() or [""])[0]
            _fail(f"cannot load --model {args.model!r}: {type(error).__name__}: {first_line}")
    texts = None
    if args.text:
        texts = [path.read_text(encoding="utf-8", errors="replace") for path in args.text]
    paths = report(model, texts, args.out, sections=args.sections, device=args.device, quick=args.quick,
                   **_settings_given(args))
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
