"""Property-based tests of the pure metrics (hypothesis): any shape, dtype, scale, duplicated rows or rank.

Every call either returns finite numbers that agree with the same metric on the same values in float64,
or raises ``ValueError`` / ``TypeError``: never a NaN, never a silent wrong number.
"""

from __future__ import annotations

import math

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from geolens.metrics import (  # noqa: E402
    cosine_stats,
    effective_rank,
    linear_cka,
    mutual_knn,
    principal_angles,
    rankme,
    readout_basis,
    subspace_pga,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# How far a result may drift from the float64 one when the inputs come in this dtype
# (the values are the same; only the arithmetic differs).
TOLERANCE = {torch.float16: 5e-2, torch.bfloat16: 5e-2, torch.float32: 1e-3, torch.float64: 1e-9}
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def clouds(draw, min_rows=3, max_rows=40, max_cols=24):
    """``(x, dtype)``: a cloud of states in one of four shapes, at one of three scales, in one of four dtypes."""
    n = draw(st.integers(min_rows, max_rows))
    d = draw(st.integers(2, max_cols))
    dtype = draw(st.sampled_from(DTYPES))
    scale = draw(st.sampled_from((1e-2, 1.0, 1e2)))
    kind = draw(st.sampled_from(("random", "duplicated", "low_rank", "constant", "offset")))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    if kind == "duplicated":
        x[n // 2:] = x[: n - n // 2].clone()
    elif kind == "low_rank":
        r = draw(st.integers(1, max(1, min(n, d) - 1)))
        x = torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(r, d, generator=g, dtype=torch.float64)
    elif kind == "constant":
        x = x[:1].expand(n, d).clone()
    elif kind == "offset":  # a huge shared mean, as in anisotropic residual streams
        x = x + 50.0 * torch.randn(1, d, generator=g, dtype=torch.float64)
    return (scale * x).to(dtype), dtype


def _outcome(fn, *args, **kwargs):
    """``("ok", value)`` or ``("error", exception)``; anything but ValueError/TypeError fails the test."""
    try:
        return "ok", fn(*args, **kwargs)
    except (ValueError, TypeError) as err:
        return "error", err


def _numbers(value):
    if isinstance(value, torch.Tensor):
        return [float(v) for v in value.flatten()]
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _numbers(v)]
    return [float(value)]


def _check(fn, x, dtype, *args, tol_scale=1.0, **kwargs):
    status, value = _outcome(fn, x, *args, **kwargs)
    if status == "error":
        return
    numbers = _numbers(value)
    assert all(math.isfinite(v) for v in numbers), f"{fn.__name__} returned a non-finite number: {numbers}"
    ref_status, reference = _outcome(fn, x.double(), *[a.double() if isinstance(a, torch.Tensor) else a
                                                         for a in args], **kwargs)
    if ref_status == "ok":
        for got, want in zip(numbers, _numbers(reference)):
            assert abs(got - want) <= tol_scale * TOLERANCE[dtype] * max(1.0, abs(want)), (fn.__name__, got, want)


@SETTINGS
@given(clouds())
def test_spectral_metrics(cloud):
    x, dtype = cloud
    for centre in (False, True):
        # effective rank and RankMe are exponentials of entropies: compare on the log scale's spread
        _check(effective_rank, x, dtype, centre=centre, tol_scale=10.0 if dtype in (torch.float16, torch.bfloat16) else 1.0)
        _check(rankme, x, dtype, centre=centre, tol_scale=10.0 if dtype in (torch.float16, torch.bfloat16) else 1.0)
        _check(cosine_stats, x, dtype, centre=centre)


@SETTINGS
@given(clouds(min_rows=4), st.integers(0, 2), st.integers(0, 2**16))
def test_subspace_pga(cloud, ccr, seed):
    x, dtype = cloud
    d = x.shape[1]
    if d < 3:
        return
    w_u = torch.randn(d, 3 * d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    readout = readout_basis(w_u, max(1, d // 3))
    status, score = _outcome(subspace_pga, x, readout, n_null=8, ccr=ccr, seed=seed)
    if status == "error":
        return
    assert all(math.isfinite(v) for v in (score.rho_readout, score.z, score.null_mean, score.null_std))
    assert -1.0 <= score.rho_readout <= 1.0 and 0.0 < score.p_value <= 1.0
    ref_status, ref = _outcome(subspace_pga, x.double(), readout, n_null=8, ccr=ccr, seed=seed)
    if ref_status == "ok" and dtype in (torch.float32, torch.float64):
        # rho is a rank statistic: float32 rounding may swap near-tied distances, nothing more
        assert abs(score.rho_readout - ref.rho_readout) <= (1e-9 if dtype == torch.float64 else 2e-2)


@SETTINGS
@given(clouds(min_rows=5), st.integers(0, 2**16), st.booleans())
def test_similarity_measures(cloud, seed, debiased):
    x, dtype = cloud
    g = torch.Generator().manual_seed(seed)
    y = (x.double() @ torch.randn(x.shape[1], 5, generator=g, dtype=torch.float64)
         + 0.1 * torch.randn(x.shape[0], 5, generator=g, dtype=torch.float64)).to(dtype)
    status, value = _outcome(linear_cka, x, y, debiased=debiased)
    if status == "ok":
        assert math.isfinite(value) and (debiased or -1e-6 <= value <= 1 + 1e-6)
    status, value = _outcome(mutual_knn, x, y, k=min(3, x.shape[0] - 1))
    if status == "ok":
        assert math.isfinite(value) and 0.0 <= value <= 1.0


@SETTINGS
@given(st.integers(3, 16), st.integers(1, 3), st.integers(1, 3), st.sampled_from(DTYPES), st.integers(0, 2**16))
def test_principal_angles(d, k1, k2, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q1 = torch.linalg.qr(torch.randn(d, min(k1, d), generator=g, dtype=torch.float64))[0].to(dtype)
    q2 = torch.linalg.qr(torch.randn(d, min(k2, d), generator=g, dtype=torch.float64))[0].to(dtype)
    status, angles = _outcome(principal_angles, q1, q2)
    if status == "ok":
        values = _numbers(angles)
        assert all(math.isfinite(v) and -1e-6 <= v <= math.pi / 2 + 1e-6 for v in values)
