"""The sampling options every analysis shares (:data:`SAMPLING_OPTIONS`); the one seeded subset every
sample of rows draws: token positions, aligned positions, lens rows; and the one rule for a sample size
that is a default upper bound (:func:`bounded_subset`).

Example:
    >>> [option.name for option in SAMPLING_OPTIONS]
    ['n_tokens', 'seed', 'batch_size', 'max_length', 'attention_mask', 'progress']
    >>> seeded_subset(10, 4, seed=0)
    tensor([1, 4, 5, 7])
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from geolens._rng import rng
from geolens._validation import DEFAULT_N_TOKENS, UpperBound, check_int

__all__ = ["SAMPLING_DEFAULT_EXCEPTIONS", "SAMPLING_OPTIONS", "SamplingOption", "seeded_subset", "bounded_subset"]


@dataclass(frozen=True)
class SamplingOption:
    """One keyword of the sampling group: its name, its default and what it means."""

    name: str
    default: object
    meaning: str


# The shared keywords, in the order that ends every signature that takes them (docs/concepts/conventions.md,
# tests/test_api.py). A keyword set rather than an options object: each is typed and tab-completed where it is
# used, as in scikit-learn and TransformerLens.
SAMPLING_OPTIONS: tuple[SamplingOption, ...] = (
    SamplingOption("n_tokens", DEFAULT_N_TOKENS, "token positions sampled (BOS and padding never); an upper "
                                                 "bound by default, None = all"),
    SamplingOption("seed", 0, "seed of every random choice of the call (same seed, same numbers)"),
    SamplingOption("batch_size", 8, "texts (rows) per forward pass; bounds memory, never changes a number"),
    SamplingOption("max_length", None, "tokens kept per text (None: whole texts)"),
    SamplingOption("attention_mask", None, "mask of a [B, T] token-id tensor (texts carry their own)"),
    SamplingOption("progress", True, "show progress bars"),
)
# (call, option) -> (its default there, why it differs from the group's).
SAMPLING_DEFAULT_EXCEPTIONS: dict[tuple[str, str], tuple[object, str]] = {
    ("capture", "n_tokens"): (None, "the low-level reader: every eligible position unless asked"),
    ("ablation_effect", "n_tokens"): (256, "two captures and two PGA runs per call"),
    ("patch", "batch_size"): (32, "rows are cheap patched copies of one prompt pair, not texts"),
    ("ablate", "n_tokens"): (None, "the reference mean reads every reference position unless asked"),
    ("ablation_hooks", "n_tokens"): (None, "as ablate"),
    ("ablate_pcs", "n_tokens"): (None, "the directions come from every reference position unless asked"),
    ("cached_tuned_lens", "n_tokens"): (None, "None: the lens method's own budget (FAST_BUDGET)"),
    ("fit_tuned_lens", "n_tokens"): (32768, "positions the lens trains on (FAST_BUDGET), not a measurement's sample"),
}


def seeded_subset(available: int, n: int, seed: int | None = 0) -> torch.Tensor:
    """Indices of ``n`` of ``range(available)``, without replacement, in increasing order (int64, CPU).

    The first ``n`` of a seeded random permutation (``None`` seeds 0), so the same seed picks the
    same rows, and a larger ``n`` keeps every row a smaller one picked. ``n >= available`` keeps all.
    """
    available = check_int(available, "available", low=0)
    n = check_int(n, "n", low=0)
    return torch.randperm(available, generator=rng(seed, "positions"))[:n].sort().values


def bounded_subset(
    available: int, n: int | None, seed: int | None = 0, *, name: str, too_many: str, over_default: str,
    low: int = 3, stacklevel: int = 2,
) -> torch.Tensor | None:
    """The :func:`seeded_subset` of ``n`` of ``available`` rows, or ``None`` for all of them.

    ``n=None`` takes all. A default size (an :class:`~geolens._validation.UpperBound`) is an upper
    bound: larger than ``available``, all rows are used and a ``UserWarning`` says so (``over_default``).
    An explicit ``n`` larger than ``available`` raises ``ValueError`` (``too_many``). Both messages are
    format strings with ``{n}`` and ``{available}``; ``name`` names ``n`` (an int ``>= low``).
    ``stacklevel`` is that of a warning issued by the caller itself.

    Example:
        >>> from geolens._validation import UpperBound
        >>> messages = dict(too_many="n = {n} > {available}", over_default="all {available} (default {n})")
        >>> bounded_subset(10, 4, name="n", **messages)
        tensor([1, 4, 5, 7])
        >>> bounded_subset(10, 12, name="n", **messages)
        Traceback (most recent call last):
        ...
        ValueError: n = 12 > 10
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     bounded_subset(10, UpperBound(12), name="n", **messages), str(caught[0].message)
        (None, 'all 10 (default 12)')
    """
    if n is None:
        return None
    default = isinstance(n, UpperBound)
    n = check_int(n, name, low=low)
    if n > available and default:
        warnings.warn(over_default.format(n=n, available=available), UserWarning, stacklevel=stacklevel + 1)
        return None
    if n > available:
        raise ValueError(too_many.format(n=n, available=available))
    return seeded_subset(available, n, seed)
