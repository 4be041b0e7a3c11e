"""Phase detection on planted unimodal curves, agreement with kneed, and honest failure on monotone curves."""

import numpy as np
import pytest
from kneed import KneeLocator

from geolens.metrics.phases import PHASE_NAMES, detect_phases, kneedle


def _planted(n=24, b1=5, b2=17, low=0.2):
    """Rise to a plateau at b1, plateau, fall from b2 on."""
    x = np.arange(n, dtype=np.float64)
    rise = low + (1 - low) * np.minimum(x / b1, 1.0)
    fall = np.where(x >= b2, 1.0 - (1 - low) * (x - b2 + 1) / (n - b2), 1.0)
    return np.minimum(rise, fall)


@pytest.mark.parametrize("noise", [0.0, 0.01, 0.03])
def test_planted_breakpoints_found_within_one_layer(noise):
    curve = _planted()
    hits = 0
    for seed in range(10):
        noisy = curve + noise * np.random.default_rng(seed).standard_normal(curve.size)
        split = detect_phases(noisy, smoothing=1.0)
        hits += split.found and abs(split.b1 - 5) <= 1 and abs(split.b2 - 17) <= 1
    # Noise sd up to ~4 % of the curve's range (0.8) always works. Measured with 20 seeds:
    # sd 0.05 -> 17/20, 0.1 -> 12/20, 0.2 -> 2/20 within one layer (the rest: no phases, or off).
    assert hits == 10


def test_phases_per_index():
    split = detect_phases(_planted(), smoothing=0.0)
    assert split.phases[: split.b1] == [PHASE_NAMES[0]] * split.b1
    assert set(split.phases[split.b1 : split.b2]) == {PHASE_NAMES[1]}
    assert set(split.phases[split.b2 :]) == {PHASE_NAMES[2]}


def test_kneedle_step_agrees_with_kneed():
    y = _planted()[:12]
    x = np.arange(12, dtype=np.float64)
    ref = KneeLocator(x, y, curve="concave", direction="increasing").knee
    assert kneedle(x, y, curve="concave", direction="increasing") == int(ref)


@pytest.mark.parametrize("curve", [np.linspace(0, 1, 20), np.linspace(1, 0, 20), np.full(20, 0.5) + np.arange(20) * 1e-3])
def test_monotone_curve_gives_no_phases(curve):
    split = detect_phases(curve)
    assert not split.found and split.b1 is None and split.b2 is None and split.reason
    assert split.phases == [None] * 20


def test_bad_curves():
    with pytest.raises(ValueError, match="at least"):
        detect_phases([1.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="NaN"):
        detect_phases([0.1, 0.5, float("nan"), 0.5, 0.1, 0.0])
