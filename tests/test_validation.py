"""The argument checks of geolens._validation (check_float beside check_int)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from geolens._validation import check_float, check_int


@pytest.mark.parametrize("value", [0.5, 2, np.float32(0.5), np.int64(3), torch.tensor(0.25), torch.tensor(4)])
def test_check_float_accepts_real_numbers_as_float(value):
    out = check_float(value, "x")
    assert type(out) is float and out == float(value)


@pytest.mark.parametrize("value", [True, "1.0", None, 1 + 2j, [1.0], torch.tensor([1.0]), torch.tensor(True)])
def test_check_float_refuses_other_types_naming_the_argument(value):
    with pytest.raises(TypeError, match=r"^ridge must be a number, got "):
        check_float(value, "ridge")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float64("nan"), torch.tensor(float("inf"))])
def test_check_float_refuses_non_finite(value):
    with pytest.raises(ValueError, match=r"^tol must be a finite number, got "):
        check_float(value, "tol")


@pytest.mark.parametrize("kwargs, good, bad, message", [
    (dict(low=0), [0, 0.0, 1e9], [-1e-12], "x must be >= 0, got"),
    (dict(low=0, low_open=True), [1e-300, 3], [0, -1], "x must be > 0, got"),
    (dict(high=1), [1, -5], [1.0000001], "x must be <= 1, got"),
    (dict(low=0, high=1, high_open=True), [0, 0.999], [1, 2, -0.1], "x must be (>=|<) "),
    (dict(low=0, high=1, low_open=True, high_open=True), [0.5], [0, 1], "x must be (>|<) "),
])
def test_check_float_bounds_closed_or_open(kwargs, good, bad, message):
    for value in good:
        assert check_float(value, "x", **kwargs) == value
    for value in bad:
        with pytest.raises(ValueError, match=message):
            check_float(value, "x", **kwargs)


def test_check_int_is_unchanged_beside_it():
    assert check_int(np.int64(3), "k", low=1) == 3
    with pytest.raises(TypeError, match="k must be an int"):
        check_int(3.0, "k")


def test_entry_points_validate_floats_with_it(native_bridge):
    """The tuned-lens fitters, the study's resources and the zoo's config refuse bad floats by name."""
    from geolens.lens import fit_tuned_lens, train_tuned_lens
    from geolens.study import Study
    from geolens.zoo.train import ZooConfig

    with pytest.raises(ValueError, match="lr must be > 0, got 0.0"):
        fit_tuned_lens(native_bridge, ["the cat sat"], lr=0, progress=False)
    with pytest.raises(ValueError, match="ridge must be a finite number"):
        fit_tuned_lens(native_bridge, ["the cat sat"], ridge=math.nan, progress=False)
    with pytest.raises(TypeError, match="tol must be a number, got str"):
        fit_tuned_lens(native_bridge, ["the cat sat"], tol="0.1", progress=False)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        train_tuned_lens(native_bridge, ["the cat sat"], weight_decay=-1, progress=False)
    with pytest.raises(ValueError, match="momentum must be < 1"):
        train_tuned_lens(native_bridge, ["the cat sat"], momentum=1, progress=False)
    with pytest.raises(ValueError, match="memory must be > 0"):
        Study(models={"a": "x"}, texts=["a b c"], resources={"memory": 0}).cells()
    with pytest.raises(ValueError, match="num_cpus must be a finite number"):
        Study(models={"a": "x"}, texts=["a b c"], resources={"num_cpus": math.inf}).cells()
    with pytest.raises(ValueError, match="lr must be > 0"):
        ZooConfig(lr=0.0)


def test_check_float_finite_false_lets_infinities_through_but_not_nan():
    assert check_float(math.inf, "timeout", low=0, finite=False) == math.inf
    with pytest.raises(ValueError, match=r"^timeout must be a number, got nan"):
        check_float(math.nan, "timeout", finite=False)
    with pytest.raises(ValueError, match=r"^timeout must be >= 0, got -inf"):
        check_float(-math.inf, "timeout", low=0, finite=False)


def test_study_and_zoo_limits_validate_floats_with_it(tmp_path):
    """run_study's infeasible_timeout (no limit: inf) and the zoo report's k (a fraction), checked before any work."""
    from geolens.study import Study, run_study
    from geolens.zoo import zoo_report

    spec = Study(models={"a": "x"}, texts=["a b c"])
    with pytest.raises(ValueError, match="infeasible_timeout must be >= 0, got -1.0"):
        run_study(spec, tmp_path / "a", executor="ray", infeasible_timeout=-1, progress=False)
    with pytest.raises(TypeError, match="infeasible_timeout must be a number, got str"):
        run_study(spec, tmp_path / "b", executor="ray", infeasible_timeout="5", progress=False)
    for bad, message in ((0, "k must be > 0, got 0.0"), (1, "k must be < 1, got 1.0"),
                         (math.nan, "k must be a finite number")):
        with pytest.raises(ValueError, match=message):
            zoo_report(None, None, k=bad)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
