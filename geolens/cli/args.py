"""Argument types shared by the ``geolens`` sub-commands: each checks one flag and says what is wrong in one line.

Example:
    >>> positive_int("3"), int_list("1,5,10")
    (3, [1, 5, 10])
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from geolens._io import check_writable_folder
from geolens._renames import RENAMED_IN

__all__ = ["HelpFormatter", "Parser", "device", "int_at_least", "int_list", "nonnegative_int_list", "looks_like_path", "model_arg", "out_dir", "positive_float", "positive_int",
           "read_text_file", "text_file"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs kept as written (their examples stay one per line); option help wrapped.

    The defaults are written into each option's help by hand, because the budget flags default to
    ``None`` ("not given", so that ``--quick`` can fill them) while their effective default lives in
    the settings objects.
    """


class Parser(argparse.ArgumentParser):
    """An argument parser whose flags renamed in a release (``renamed_flags``: old -> new) stop the run with
    a message naming the new flag, given as ``--old VALUE`` or ``--old=VALUE``.

    An old flag is no option of the parser, so it stays out of ``--help``. Sub-commands are made with the
    class of their parent (argparse's default), so each passes its own ``renamed_flags`` to ``add_parser``.

    Example:
        >>> parser = Parser(prog="geolens report", renamed_flags={"--lens-positions": "--lens-n-tokens"})
        >>> parser.add_argument("--lens-n-tokens", type=int).dest
        'lens_n_tokens'
        >>> parser.parse_args(["--lens-n-tokens", "5"]).lens_n_tokens
        5
    """

    def __init__(self, *args: Any, renamed_flags: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renamed_flags = dict(renamed_flags or {})

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        for arg in sys.argv[1:] if args is None else args:
            if arg == "--":  # what follows is values, never flags
                break
            old = arg.partition("=")[0]
            if old in self.renamed_flags:
                self.error(f"{old} was renamed to {self.renamed_flags[old]} in geolens {RENAMED_IN}")
        return super().parse_known_args(args, namespace)


def int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def nonnegative_int_list(text: str) -> list[int]:
    """Comma-separated integers >= 0 (e.g. ``--ccr 0,1,5``).

    Example:
        >>> nonnegative_int_list("0,1,5")
        [0, 1, 5]
    """
    values = int_list(text)
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def int_at_least(low: int):
    """An argument type for integers >= ``low``.

    Example:
        >>> int_at_least(2)("3")
        3
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            kind = "a positive integer" if low >= 1 else "an integer"
            raise argparse.ArgumentTypeError(f"expected {kind} >= {low}, got {value}")
        return value

    parse.__name__ = f"int_at_least_{low}"
    return parse


positive_int = int_at_least(1)  # sizes and counts: --k, --n-texts, --layers, ...


def looks_like_path(text: str) -> bool:
    """Whether ``--model`` names a local folder rather than a hub model (``org/name`` or ``name``).

    Example:
        >>> looks_like_path("EleutherAI/pythia-70m"), looks_like_path("./pythia-70m"), looks_like_path("a/b/c")
        (False, True, True)
    """
    if text in (".", "..") or text.startswith(("./", "../", "/", "~", ".\\", "..\\")) or "\\" in text:
        return True
    return text.count("/") > 1 or Path(text).exists()  # hub names have at most one "/"


def model_arg(text: str) -> str:
    """A hub name, passed through; or a local Hugging Face model folder, which must exist and hold config.json.

    Example:
        >>> model_arg("EleutherAI/pythia-70m")
        'EleutherAI/pythia-70m'
    """
    if not looks_like_path(text):
        return text
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"model folder {text!r} does not exist")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a model folder (a folder with config.json)")
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"model folder {text!r} has no config.json (not a Hugging Face model folder)")
    return str(path)


def read_text_file(path: Path) -> str:
    """The text of ``path``, read strictly as UTF-8: a file that is not (Latin-1, a binary file) raises
    ``ValueError`` naming it and the first bad byte, instead of running on replacement characters.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = Path(tmp, "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
        ...     read_text_file(Path(tmp, "latin1.txt"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: text file '...latin1.txt' is not UTF-8 text: byte 0xe9 at offset 3 ...; save it as UTF-8
    """
    data = path.read_bytes()
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError as error:
        byte = data[error.start:error.start + 1].hex()
        raise ValueError(f"text file {str(path)!r} is not UTF-8 text: byte 0x{byte} at offset {error.start} "
                         f"({error.reason}); save it as UTF-8") from None
    if "\x00" in content:
        raise ValueError(f"text file {str(path)!r} holds NUL bytes: a binary file, not text")
    return content


def text_file(text: str) -> Path:
    """A readable, non-empty UTF-8 text file (:func:`read_text_file`).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = Path(tmp, "texts.txt")
        ...     _ = path.write_text("the cat sat")
        ...     text_file(str(path)).name
        'texts.txt'
    """
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"text file {text!r} does not exist")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    try:
        content = read_text_file(path)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot read text file {text!r}: {error.strerror or error}") from None
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not content.strip():
        raise argparse.ArgumentTypeError(f"text file {text!r} is empty")
    return path


def out_dir(text: str) -> Path:
    """An output folder that exists or can be made, and where this process may write: neither it nor a
    folder above it may be a file (:func:`geolens._io.check_writable_folder`).

    Example:
        >>> out_dir("out/report")
        PosixPath('out/report')
    """
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is an existing file, not a folder")
    blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise argparse.ArgumentTypeError(f"cannot make folder {text!r}: {str(blocking)!r} is a file")
    try:
        return check_writable_folder(path, "the output folder")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def device(text: str) -> str:
    """A torch device string (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ...) whose backend this machine has.

    Example:
        >>> device("cpu")
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


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value
