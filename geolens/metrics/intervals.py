"""Intervals from resampled estimates (docs/methods.md §A.10).

A statistic ``theta`` is recomputed on ``B`` resamples of its data (each by the same estimator);
the spread of the ``B`` values estimates the statistic's standard error at the sample's size,
and the interval is symmetric about the estimate itself:

    theta +- t_{B - 1, (1 + level) / 2} * sqrt(n / (n - 1)) * sd(theta*_1 .. theta*_B)

where the resamples draw ``n`` independent units (texts) with replacement. A bootstrap's spread is the
plug-in one: for a mean of ``n`` units its variance is ``(n - 1) / n`` times the unbiased estimate, a
shortfall that matters with few units (16 texts: 3 % of the width), so ``n / (n - 1)`` restores it
(``n_units``; ``None`` leaves the spread as it is).

The spread is read about the resamples' own mean, so a shift of the resamples (a resample of ``n``
texts draws fewer distinct ones, and a statistic that depends on the sample's size moves with it)
widens nothing and moves nothing: the interval always holds the estimate. Student's ``t`` with
``B - 1`` degrees of freedom carries the Monte Carlo error of the spread itself.

Example:
    >>> import numpy as np
    >>> replicates = np.random.default_rng(0).normal(5.0, 1.0, size=200)
    >>> low, high, error = symmetric_interval(5.3, replicates)
    >>> bool(low < 5.3 < high), round(high - low, 1), error < 0.2
    (True, 3.8, True)
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from geolens._validation import check_int

__all__ = ["INTERVAL_LEVEL", "MIN_FINITE_FRACTION", "symmetric_interval", "end_error"]

# The interval's nominal coverage, and the share of resamples that must be scorable for one.
INTERVAL_LEVEL = 0.95
MIN_FINITE_FRACTION = 0.8


def symmetric_interval(estimate: float, replicates: np.ndarray, *, level: float = INTERVAL_LEVEL,
                       n_units: int | None = None) -> tuple[float, float, float]:
    """``(low, high, end_error)``: ``estimate +- t * sd(replicates)`` (finite replicates only; with ``n_units``,
    the units each resample draws, the spread times ``sqrt(n_units / (n_units - 1))``) and the Monte Carlo
    standard error of either end (:func:`end_error`). NaN where fewer than ``MIN_FINITE_FRACTION`` of the
    replicates, or fewer than 2, are finite, or the estimate is not.

    Example:
        >>> symmetric_interval(1.0, np.array([0.0, 2.0, np.nan]))    # too few finite: no interval
        (nan, nan, nan)
        >>> low, high, _ = symmetric_interval(1.0, np.array([0.0, 2.0, 1.0, 1.0, 1.0]))
        >>> round(low, 3), round(high, 3)
        (-0.963, 2.963)
        >>> low, high, _ = symmetric_interval(1.0, np.array([0.0, 2.0, 1.0, 1.0, 1.0]), n_units=5)
        >>> round(high - 1.0, 3)    # sqrt(5 / 4) times wider
        2.195
    """
    if n_units is not None:
        n_units = check_int(n_units, "n_units", low=2)  # the units a resample draws
    values = np.asarray(replicates, dtype=float)
    finite = values[np.isfinite(values)]
    if not math.isfinite(estimate) or finite.size < 2 or finite.size < MIN_FINITE_FRACTION * values.size:
        return math.nan, math.nan, math.nan
    sd = float(finite.std(ddof=1))
    if n_units is not None:
        sd *= math.sqrt(n_units / (n_units - 1))
    half = float(stats.t.ppf(0.5 + level / 2, finite.size - 1)) * sd
    return estimate - half, estimate + half, end_error(half, finite.size)


def end_error(half_width: float, n_replicates: int) -> float:
    """The Monte Carlo standard error of an interval end ``estimate +- half_width`` read from the spread of
    ``n_replicates`` replicates: the sample sd's relative error is about ``1 / sqrt(2 (B - 1))``.

    Example:
        >>> round(end_error(2.0, 51), 3)
        0.2
    """
    return half_width / math.sqrt(2.0 * (n_replicates - 1))
