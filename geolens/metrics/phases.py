"""Three-phase detection on an RSS curve: smoothing, then a two-stage Kneedle (``kneed``).

The RSS curve of a model is expected to be unimodal: it rises (Phase I,
"seeding multiplexing"), stays high (Phase II, "hoisting overriding") and falls
(Phase III, "focal convergence"). After Gaussian smoothing, the curve is split
at its maximum; Kneedle (Satopaa et al. 2011, via the ``kneed`` package) finds
the knee of the rising part (``concave``, ``increasing``: where the rise
saturates, ``b1``) and of the falling part (``concave``, ``decreasing``: where
the plateau breaks, ``b2``). Phase I is ``[0, b1)``, II ``[b1, b2)``, III ``[b2, end]``.
A curve with no interior maximum, or a side without a knee, gives an explicit
"no phases found" with the reason, never invented breakpoints.

See docs/methods.md §C.9.

Example:
    >>> import torch
    >>> x = torch.arange(20.0)
    >>> curve = torch.minimum(torch.minimum(x / 4, torch.ones(20)), (19 - x) / 4 + 0.2)
    >>> split = detect_phases(curve, smoothing=0.0)
    >>> split.found, split.b1, split.b2            # plateau 4..15, the fall starts at 16
    (True, 4, 16)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["PHASE_NAMES", "PhaseSplit", "detect_phases", "kneedle", "smooth_curve"]

PHASE_NAMES = ("I seeding multiplexing", "II hoisting overriding", "III focal convergence")


@dataclass(frozen=True)
class PhaseSplit:
    """Breakpoints ``b1 < b2`` (indices into the curve) and a phase per index, or why none were found.

    See docs/methods.md §C.9.
    """

    found: bool
    b1: int | None
    b2: int | None
    peak: int
    phases: list[str | None] = field(repr=False)
    smoothed: list[float] = field(repr=False)
    reason: str = ""


def kneedle(x: np.ndarray, y: np.ndarray, *, curve: str, direction: str, sensitivity: float = 1.0) -> int | None:
    """Index (into ``x``) of the Kneedle knee of ``y(x)``, or ``None`` when there is none.

    See docs/methods.md §C.9.
    """
    from kneed import KneeLocator

    if len(x) < 3:
        return None
    knee = KneeLocator(x, y, S=sensitivity, curve=curve, direction=direction).knee
    return None if knee is None else int(np.flatnonzero(x == knee)[0])


def smooth_curve(y: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian smoothing with ``sigma`` in indices (edges: nearest value); ``sigma = 0`` copies.

    See docs/methods.md §C.9.
    """
    y = np.asarray(y, dtype=np.float64)
    if sigma <= 0:
        return y.copy()
    from scipy.ndimage import gaussian_filter1d

    return gaussian_filter1d(y, sigma, mode="nearest")


def detect_phases(
    curve, *, smoothing: float = 1.0, sensitivity: float = 1.0, min_side: int = 3, plateau_tol: float = 0.05
) -> PhaseSplit:
    """Split a unimodal curve (one value per layer or layer pair) into three phases.

    See docs/methods.md §C.9.

    Args:
        curve: 1-D values (tensor, array or list), e.g. RSS between consecutive layers.
        smoothing: Gaussian sigma in indices (0 = none).
        sensitivity: Kneedle's ``S``.
        min_side: fewest points the rising and the falling side each need.
        plateau_tol: the curve is split at the middle of its top plateau, the points
            within ``plateau_tol x (max - min)`` of the maximum, so each side keeps
            part of the plateau and has a knee to find.
    """
    y = np.asarray(torch.as_tensor(curve, dtype=torch.float64).cpu(), dtype=np.float64).reshape(-1)
    if y.size < 2 * min_side - 1:
        raise ValueError(f"the curve has {y.size} point{'' if y.size == 1 else 's'}; phase detection needs at least "
                         f"{2 * min_side - 1}")
    if not np.isfinite(y).all():
        raise ValueError("the curve contains NaN or infinite values")
    smoothed = smooth_curve(y, smoothing)
    top = np.flatnonzero(smoothed >= smoothed.max() - plateau_tol * (smoothed.max() - smoothed.min()))
    peak = int((top[0] + top[-1]) // 2)
    x = np.arange(y.size, dtype=np.float64)

    def none(reason: str) -> PhaseSplit:
        return PhaseSplit(False, None, None, peak, [None] * y.size, smoothed.tolist(), reason)

    if smoothed.max() - smoothed.min() <= 1e-12 * max(1.0, abs(smoothed.max())):
        return none("the smoothed curve is flat: no rise, plateau and fall to split")
    if peak + 1 < min_side:
        return none(f"the smoothed curve peaks at index {peak}: no rising side (not unimodal: monotone decreasing?)")
    if y.size - peak < min_side:
        return none(f"the smoothed curve peaks at index {peak} of {y.size}: no falling side (monotone increasing?)")
    b1 = kneedle(x[: peak + 1], smoothed[: peak + 1], curve="concave", direction="increasing", sensitivity=sensitivity)
    b2 = kneedle(x[peak:], smoothed[peak:], curve="concave", direction="decreasing", sensitivity=sensitivity)
    if b1 is None:
        return none("Kneedle found no knee on the rising side")
    if b2 is None:
        return none("Kneedle found no knee on the falling side")
    b2 += peak
    if not b1 < b2:
        return none(f"breakpoints out of order (b1 = {b1}, b2 = {b2})")
    phases = [PHASE_NAMES[0] if i < b1 else PHASE_NAMES[1] if i < b2 else PHASE_NAMES[2] for i in range(y.size)]
    return PhaseSplit(True, b1, b2, peak, phases, smoothed.tolist())
