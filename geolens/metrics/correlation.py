"""Rank correlations across models: Spearman, and a partial Spearman that holds one variable fixed.

Used by the cross-model views of a study (a geometry metric against held-out loss or a
hyper-parameter). With a handful of models these are descriptive; the p-values are the
usual ones (``scipy.stats.spearmanr``'s t approximation; for the partial coefficient a t
test with ``n - 3`` degrees of freedom) and are not corrected for the many pairs a study
looks at. See docs/methods.md §G.

Example:
    >>> x, y, z = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5], [1, 2, 3, 5, 4]
    >>> round(rank_correlation(x, y)[0], 3), round(partial_rank_correlation(x, y, z)[0], 3)
    (0.8, 0.746)
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats

__all__ = ["partial_rank_correlation", "rank_correlation"]


def _clean(*columns: Sequence[float]) -> list[np.ndarray]:
    arrays = [np.asarray(c, dtype=float) for c in columns]
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
        raise ValueError(f"expected 1-D sequences of one length, got shapes {[a.shape for a in arrays]}")
    keep = np.logical_and.reduce([np.isfinite(a) for a in arrays])
    return [a[keep] for a in arrays]


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    return float(stats.spearmanr(a, b).statistic)


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Spearman's rho of ``x`` and ``y`` (ties averaged) and its two-sided p-value; pairs with a NaN are dropped.

    NaN when fewer than 3 pairs remain or either side is constant.

    Example:
        >>> rank_correlation([1, 2, 3, 4], [10, 20, 30, 25])
        (0.8, 0.2)
    """
    a, b = _clean(x, y)
    rho = _spearman(a, b)
    if math.isnan(rho):
        return math.nan, math.nan
    p = float(stats.spearmanr(a, b).pvalue)
    return round(rho, 12), round(p, 12)


def partial_rank_correlation(x: Sequence[float], y: Sequence[float], z: Sequence[float]) -> tuple[float, float]:
    """Spearman correlation of ``x`` and ``y`` with ``z`` held fixed, and its two-sided p-value.

    ``r = (r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2))`` on Spearman coefficients, which equals
    the Pearson correlation of the residuals of rank(x) and rank(y) after regressing each on rank(z);
    ``t = r sqrt((n - 3) / (1 - r^2))`` with ``n - 3`` degrees of freedom. NaN with fewer than 4
    complete triples, a constant variable, or ``z`` that ranks exactly as ``x`` or ``y``.

    Example:
        >>> r, p = partial_rank_correlation([1, 2, 3, 4, 5, 6], [1, 3, 2, 5, 4, 6], [6, 5, 4, 3, 2, 1])
        >>> r, p   # z is a rank-reversal of x: nothing is left once it is held fixed
        (nan, nan)
    """
    a, b, c = _clean(x, y, z)
    if a.size < 4:
        return math.nan, math.nan
    r_xy, r_xz, r_yz = _spearman(a, b), _spearman(a, c), _spearman(b, c)
    if any(math.isnan(r) for r in (r_xy, r_xz, r_yz)) or max(abs(r_xz), abs(r_yz)) >= 1 - 1e-12:
        return math.nan, math.nan
    r = (r_xy - r_xz * r_yz) / math.sqrt((1 - r_xz**2) * (1 - r_yz**2))
    r = max(-1.0, min(1.0, r))
    df = a.size - 3
    if abs(r) >= 1:
        return r, 0.0
    t = r * math.sqrt(df / (1 - r**2))
    return round(r, 12), round(float(2 * stats.t.sf(abs(t), df)), 12)
