"""One canonical JSON form of parameters and rows: for saving results, and for hashing a study's cells.

Strict JSON has no NaN or Infinity (``json.dumps`` writes them by default, and strict parsers such as
JavaScript's ``JSON.parse`` or ``jq`` then reject the whole file). Saved values spell non-finite floats
as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (the spellings ``json.dumps`` would use) and
:func:`restore_non_finite` reads them back as floats, so tables keep their NaNs across a save/load.
A string that is one of those spellings (a text column holding ``"NaN"``) is saved with a leading
apostrophe (``"'NaN"``, as a spreadsheet marks text), one more on a string already spelled so, and
comes back as the string it was.

``for_hash=True`` gives the form a cell's hash is taken of; it differs on purpose where a hash must
tell settings apart that a saved file need not: a default sample size (an
:class:`~geolens._validation.UpperBound`) is ``{"at_most": n}``, not ``n``; mappings are sorted by key;
objects without a JSON form are their ``repr``. Its spellings of non-finite floats (``"nan"``,
``"inf"``) are those the stored hashes were taken with, so they stay.

Example:
    >>> jsonable({"a": (1, float("nan")), "b": float("-inf"), "text": "NaN"})
    {'a': [1, 'NaN'], 'b': '-Infinity', 'text': "'NaN"}
    >>> jsonable({"n": UpperBound(1024), "b": 1, "a": float("inf")}, for_hash=True)
    {'a': 'inf', 'b': 1, 'n': {'at_most': 1024}}
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from geolens._validation import UpperBound

__all__ = ["NON_FINITE", "callable_id", "jsonable", "parse_json", "restore_non_finite"]

NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
TEXT_MARK = "'"  # leads a string that would read as a non-finite float


def _spelled_non_finite(text: str) -> bool:
    """Whether ``text`` is a non-finite spelling, with any number of text marks before it."""
    return text.lstrip(TEXT_MARK) in NON_FINITE


def _non_finite_name(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def callable_id(fn: Any, *, for_hash: bool = True) -> Any:
    """A stable identity of a function: module and qualified name, and a partial's arguments.

    Example:
        >>> callable_id(functools.partial(math.log, base=2))
        {'partial': 'math.log', 'args': [], 'kwargs': {'base': 2}}
    """
    if isinstance(fn, functools.partial):
        return {"partial": callable_id(fn.func, for_hash=for_hash), "args": jsonable(list(fn.args), for_hash=for_hash),
                "kwargs": jsonable(dict(fn.keywords), for_hash=for_hash)}
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def jsonable(value: Any, *, for_hash: bool = False) -> Any:
    """``value`` as plain JSON types: dicts (string keys), lists, str, int, float, bool, ``None``.

    Tuples become lists; tensors, arrays and numpy scalars their values; paths strings; functions
    (and partials) their :func:`callable_id`; non-finite floats strings (see the module's note).
    Anything else is its ``str`` (``repr`` with ``for_hash``). ``for_hash``: the form a study
    hashes (default sample sizes apart from explicit ones, keys sorted).
    """
    if isinstance(value, UpperBound):
        return {"at_most": int(value)} if for_hash else int(value)  # for a hash "at most n" differs from "n"
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda kv: str(kv[0])) if for_hash else value.items()
        return {str(k): jsonable(v, for_hash=for_hash) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, for_hash=for_hash) for v in value]
    if isinstance(value, Path):
        return str(value)
    if callable(value):
        return callable_id(value, for_hash=for_hash)
    if hasattr(value, "tolist"):  # tensors, numpy arrays and scalars: their values can be non-finite too
        return jsonable(value.tolist(), for_hash=for_hash)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value) if for_hash else _non_finite_name(value)
    if isinstance(value, str) and not for_hash and _spelled_non_finite(value):
        return TEXT_MARK + value  # text, not a float: restore_non_finite takes the mark off again
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value) if for_hash else str(value)


def restore_non_finite(value: Any) -> Any:
    """Undo :func:`jsonable`'s spelling of non-finite floats (``"NaN"`` -> ``nan``), recursively; a string
    it marked as text (``"'NaN"``) loses its mark and stays a string.

    Example:
        >>> restore_non_finite({"z": ["NaN", 1.0], "s": "text", "t": "'NaN"})
        {'z': [nan, 1.0], 's': 'text', 't': 'NaN'}
    """
    if isinstance(value, dict):
        return {k: restore_non_finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restore_non_finite(v) for v in value]
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    if isinstance(value, str) and value.startswith(TEXT_MARK) and _spelled_non_finite(value):
        return value[len(TEXT_MARK):]
    return value


def parse_json(text: str | bytes, where: Any) -> Any:
    """``json.loads(text)``, with what the parser raises bare, naming nothing, as a ``ValueError`` naming
    ``where`` (the file): nesting deeper than Python's recursion limit, an integer longer than its digit
    limit. A malformed text raises ``json.JSONDecodeError`` as before (callers word it themselves).

    Example:
        >>> parse_json('{"k": 4}', "a.json")
        {'k': 4}
        >>> parse_json("[" * 100_000, "deep.json")
        Traceback (most recent call last):
        ...
        ValueError: deep.json is not readable JSON: nested deeper than Python's parser can follow
        >>> parse_json("9" * 5000, "big.json")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: big.json is not readable JSON: Exceeds the limit (4300 digits) for integer string conversion...
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where} is not readable JSON: nested deeper than Python's parser can follow") from None
    except json.JSONDecodeError:
        raise
    except ValueError as err:  # an integer past sys.get_int_max_str_digits()
        raise ValueError(f"{where} is not readable JSON: {err}") from None
