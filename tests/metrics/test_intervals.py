"""The interval of geolens.metrics.intervals: symmetric about the estimate, Student's t over the replicates,
and the bootstrap's plug-in spread made unbiased for the units it resamples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from geolens.metrics.intervals import symmetric_interval


def test_the_unit_correction_makes_the_bootstrap_spread_of_a_mean_its_unbiased_standard_error():
    # A mean of n units: the ideal bootstrap variance is (n - 1) / n times s^2 / n (s with divisor n - 1).
    rng = np.random.default_rng(0)
    n = 8
    units = rng.normal(size=n)
    replicates = units[rng.integers(0, n, size=(40_000, n))].mean(1)
    low, high, _ = symmetric_interval(float(units.mean()), replicates, n_units=n)
    half = scipy.stats.t.ppf(0.975, replicates.size - 1) * units.std(ddof=1) / math.sqrt(n)
    assert (high - low) / 2 == pytest.approx(half, rel=0.01)
    plain_low, plain_high, _ = symmetric_interval(float(units.mean()), replicates)
    assert (plain_high - plain_low) / 2 == pytest.approx(half * math.sqrt((n - 1) / n), rel=0.01)


def test_the_interval_is_symmetric_about_the_estimate_with_student_t():
    replicates = np.array([0.0, 2.0, 1.0, 1.5, 0.5, np.nan])
    low, high, error = symmetric_interval(3.0, replicates, n_units=4)
    half = scipy.stats.t.ppf(0.975, 4) * np.nanstd(replicates, ddof=1) * math.sqrt(4 / 3)
    assert (low, high) == pytest.approx((3.0 - half, 3.0 + half), rel=1e-12)
    assert error == pytest.approx(half / math.sqrt(2 * 4), rel=1e-12)


@pytest.mark.parametrize("n_units, error, message", [
    (1, ValueError, "n_units must be >= 2, got 1"), (0, ValueError, "n_units must be >= 2, got 0"),
    (2.5, TypeError, "n_units must be an int, got float"), (True, TypeError, "n_units must be an int, got bool"),
    ("8", TypeError, "n_units must be an int, got str"),
])
def test_n_units_must_be_an_integer_of_at_least_two(n_units, error, message):
    with pytest.raises(error, match=message):
        symmetric_interval(1.0, np.arange(10.0), n_units=n_units)
