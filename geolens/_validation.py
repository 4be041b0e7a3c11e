"""Input checks shared by every public entry point.

Validation happens once, at the boundary, with messages that say what was
expected and what arrived; the numerical code below it can then assume clean,
finite, floating-point tensors.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import pickle
from pathlib import Path
from typing import Iterator

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_float_matrix(
    x: object,
    name: str,
    *,
    min_rows: int = 1,
    min_cols: int = 1,
    finite: bool = True,
) -> torch.Tensor:
    """Return ``x`` if it is a finite floating-point ``[rows, cols]`` tensor, else raise.

    Example:
        >>> check_float_matrix(torch.zeros(3, 2), "states").shape
        torch.Size([3, 2])
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [rows, cols], got shape {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    rows, cols = x.shape
    if rows < min_rows:
        raise ValueError(f"{name} needs at least {min_rows} rows, got {rows} (shape {tuple(x.shape)})")
    if cols < min_cols:
        raise ValueError(f"{name} needs at least {min_cols} columns, got {cols} (shape {tuple(x.shape)})")
    if finite:
        check_finite(x, name)
    return x


def check_finite(x: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` naming how many entries of ``x`` are NaN or infinite."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        n_nan = int(torch.isnan(x).sum())
        n_inf = int(bad.sum()) - n_nan
        raise ValueError(f"{name} contains {n_nan} NaN and {n_inf} infinite values; geometry is undefined")


def check_int(value: object, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as an int within ``[low, high]`` (inclusive), else raise.

    Any integral number is accepted (Python and NumPy integers, 0-d integer
    tensors); ``bool`` and floats are not, even when whole.

    Example:
        >>> check_int(3, "k", low=1)
        3
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) and not (
        isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point()
    ):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")
    return value


def check_float(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
) -> float:
    """Return ``value`` as a finite float within ``low``/``high``, else raise naming ``name``.

    Bounds are closed (``>=``, ``<=``) unless ``low_open``/``high_open``. Any real number is
    accepted (Python and NumPy ints and floats, 0-d real tensors); ``bool``, strings and complex
    numbers raise ``TypeError``; NaN, infinities and values out of bounds ``ValueError``.
    ``finite=False`` lets infinities through (a limit that may be "never"); NaN still raises.

    Example:
        >>> check_float(1e-3, "lr", low=0, low_open=True)
        0.001
        >>> check_float(1.0, "warmup", low=0, high=1, high_open=True)
        Traceback (most recent call last):
        ...
        ValueError: warmup must be < 1, got 1.0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) and not (
        isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_complex() and value.dtype != torch.bool
    ):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value) or finite and math.isinf(value):
        raise ValueError(f"{name} must be a {'finite ' if finite else ''}number, got {value}")
    if low is not None and (value < low or low_open and value == low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value > high or high_open and value == high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value


class InvalidParameterError(ValueError, TypeError):
    """A value of the wrong kind or range for an option that takes several kinds (as scikit-learn's):
    ``except ValueError`` and ``except TypeError`` both catch it."""


def resolve_k(k: object, d_model: int) -> int | None:
    """The subspace dimension ``k`` as an int: an int is a dimension, a float in ``(0, 1)`` a fraction
    of ``d_model`` (``max(1, round(k * d_model))``, as scikit-learn's ``n_components``); ``None`` stays
    ``None`` (the caller's default). Anything else raises :class:`InvalidParameterError` naming ``k``.

    The one reading of ``k`` for every call that takes it (pga, ablation_effect, convergence, phases);
    each caller checks the upper bound its own subspaces need.

    Example:
        >>> resolve_k(8, 64), resolve_k(0.25, 64), resolve_k(None, 64)
        (8, 16, None)
        >>> resolve_k(1.5, 64)
        Traceback (most recent call last):
        ...
        geolens._validation.InvalidParameterError: k must be an int >= 1 (a dimension) or a float in (0, 1) ..., got 1.5
    """
    if k is None:
        return None
    if isinstance(k, numbers.Integral) and not isinstance(k, bool) and int(k) >= 1:
        return int(k)
    if isinstance(k, numbers.Real) and not isinstance(k, (bool, numbers.Integral)) and 0 < float(k) < 1:
        return max(1, round(float(k) * d_model))
    raise InvalidParameterError(f"k must be an int >= 1 (a dimension) or a float in (0, 1) (a fraction of "
                                f"d_model = {d_model}), got {k!r}")


class DegenerateError(ValueError):
    """The input has no geometry to measure (numerically constant states, a null without spread, ...)."""


class DamagedFileError(ValueError):
    """A file geolens reads (a saved lens, a cached model) is unreadable or inconsistent.

    The message names the file and what to do (save again, delete the cache entry);
    caches catch it to rebuild the entry.
    """


class UpperBound(int):
    """A default sample size that is an upper bound: with less input, what there is is used (and said).

    An explicit ``int`` that the input cannot honour raises; this subclass marks
    the defaults, so ``n_tokens=1024`` given by hand still means exactly 1024.

    Example:
        >>> n = UpperBound(1024)
        >>> n == 1024, isinstance(n, UpperBound), isinstance(1024, UpperBound)
        (True, True, False)
    """

    __slots__ = ()

    def __repr__(self) -> str:  # signatures show the number, as for a plain default
        return int.__repr__(self)


DEFAULT_N_TOKENS = UpperBound(1024)


def working_dtype(x: torch.Tensor) -> torch.dtype:
    """Half precision is too coarse for ranks of distances: compute in float32 at least."""
    return x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32


@contextlib.contextmanager
def refused_weights_named(folder: str | os.PathLike) -> Iterator[None]:
    """Inside, torch's refusal to unpickle a model's weights (``pickle.UnpicklingError`` from
    ``torch.load(weights_only=True)``, which names no file) raises
    :class:`~geolens._validation.DamagedFileError` naming the pickled weight files of ``folder``.

    Example:
        >>> with refused_weights_named("models/m"):  # doctest: +ELLIPSIS
        ...     raise pickle.UnpicklingError("Weights only load failed. Unsupported global: GLOBAL posix.system")
        Traceback (most recent call last):
        ...
        geolens._validation.DamagedFileError: models/m (its pickled weights: pytorch_model*.bin, *.pt) cannot be loaded safely: ...
    """
    try:
        yield
    except pickle.UnpicklingError as err:
        path = Path(folder)
        files = sorted(str(p) for pattern in ("*.bin", "*.pt", "*.pth") for p in path.glob(pattern)) \
            if path.is_dir() else []
        named = ", ".join(files) if files else f"{folder} (its pickled weights: pytorch_model*.bin, *.pt)"
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = next((line for line in lines if "GLOBAL" in line or "Unsupported" in line), lines[0] if lines else "")
        raise DamagedFileError(f"{named} cannot be loaded safely: torch's weights-only loader refused it ({reason}); "
                               "the file may hold code: load it with weights_only=False only if you trust where it "
                               "came from, or save the model again as safetensors") from None
