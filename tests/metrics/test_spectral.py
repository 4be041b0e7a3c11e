"""Spectral metrics: direct numpy references, planted ground truth, invariances, bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from geolens.metrics.spectral import (
    alpha_req,
    condition_number,
    cosine_stats,
    effective_rank,
    isotropy,
    mean_cosine,
    numerical_rank,
    rankme,
    spectral_summary,
)

TOL = 1e-6


def _cloud(n=300, d=24, seed=0, offset=0.0):
    g = np.random.default_rng(seed)
    scales = np.arange(1, d + 1) ** -0.7
    return g.standard_normal((n, d)) * scales + offset * g.standard_normal(d)


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# ------------------------------------------------------------------ numpy references (written independently)
def np_effective_rank(x):
    s = np.linalg.svd(x, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def np_rankme(x, eps=1e-7):
    s = np.linalg.svd(x, compute_uv=False)
    p = s / np.abs(s).sum() + eps
    return float(np.exp(-(p * np.log(p)).sum()))


def np_alpha(x, start, stop, centre=True):
    xc = x - x.mean(0) if centre else x
    lam = np.linalg.eigh(xc.T @ xc / ((len(x) - 1) if centre else len(x)))[0][::-1]
    i = np.arange(1, len(lam) + 1)[start:stop]
    y = np.log(lam[start:stop])
    w = 1.0 / i
    design = np.stack([np.ones_like(i, dtype=float), np.log(i)], 1)
    sw = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)
    fitted = design @ coef
    ybar = np.average(y, weights=w)
    r2 = 1 - np.sum(w * (y - fitted) ** 2) / np.sum(w * (y - ybar) ** 2)
    return -coef[1], r2


def np_isotropy(x):
    _, vecs = np.linalg.eigh(x.T @ x)
    cs = np.concatenate([vecs, -vecs], axis=1)  # both signs of every eigenvector
    scores = x @ cs
    top = scores.max(0)
    log_z = top + np.log(np.exp(scores - top).sum(0))
    return float(np.exp(log_z.min() - log_z.max()))


def np_cosines(x):
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = unit @ unit.T
    iu = np.triu_indices(len(x), 1)
    return cos[iu].mean(), cos[iu].std()


def np_condition(x):
    s = np.linalg.svd(x, compute_uv=False)
    keep = s > max(x.shape) * np.finfo(x.dtype).eps * s[0]
    return s[keep][0] / s[keep][-1]


# ------------------------------------------------------------------ against numpy
@pytest.mark.parametrize("centre", [False, True])
def test_matches_numpy(centre):
    x = _cloud(offset=2.0)
    xc = x - x.mean(0) if centre else x
    t = _t(x)
    assert effective_rank(t, centre=centre) == pytest.approx(np_effective_rank(xc), rel=TOL)
    assert rankme(t, centre=centre) == pytest.approx(np_rankme(xc), rel=TOL)
    alpha, r2 = alpha_req(t, fit_range=(2, 20), centre=centre)
    ref_alpha, ref_r2 = np_alpha(x, 2, 20, centre=centre)
    assert alpha == pytest.approx(ref_alpha, rel=TOL) and r2 == pytest.approx(ref_r2, rel=TOL)
    assert isotropy(t, centre=centre) == pytest.approx(np_isotropy(xc), rel=TOL)
    mean, sd = cosine_stats(t, centre=centre)
    ref_mean, ref_sd = np_cosines(xc)
    assert mean == pytest.approx(ref_mean, abs=TOL) and sd == pytest.approx(ref_sd, abs=TOL)
    assert mean_cosine(t, centre=centre) == pytest.approx(ref_mean, abs=TOL)
    assert condition_number(t, centre=centre) == pytest.approx(np_condition(xc), rel=TOL)


def test_summary_equals_individual_metrics():
    x = _t(_cloud(offset=1.0))
    out = spectral_summary(x, centre=True, alpha_fit_range=(2, 20))
    assert out["effective_rank"] == pytest.approx(effective_rank(x, centre=True), rel=1e-12)
    assert out["rankme"] == pytest.approx(rankme(x, centre=True), rel=1e-12)
    assert (out["alpha_req"], out["alpha_req_r2"]) == pytest.approx(alpha_req(x, fit_range=(2, 20)), rel=1e-12)
    assert out["isotropy"] == pytest.approx(isotropy(x, centre=True), rel=1e-12)
    assert out["log_isotropy"] == pytest.approx(isotropy(x, centre=True, log=True), rel=1e-12)
    assert (out["mean_cosine"], out["cosine_std"]) == pytest.approx(cosine_stats(x, centre=True), abs=1e-12)
    assert out["condition_number"] == pytest.approx(condition_number(x, centre=True), rel=1e-12)
    assert out["numerical_rank"] == numerical_rank(x, centre=True) == 24
    raw = spectral_summary(x, centre=False, alpha_fit_range=(2, 20))
    assert raw["rankme"] == pytest.approx(rankme(x), rel=1e-12)


def test_wide_matrix_rows_are_weight_vectors():
    """[V, d] with V < d too (e.g. a small vocabulary): null-space eigenvectors give Z = N."""
    x = _cloud(n=10, d=24, seed=3)
    assert isotropy(_t(x)) == pytest.approx(np_isotropy(x), rel=TOL)
    assert effective_rank(_t(x)) == pytest.approx(np_effective_rank(x), rel=TOL)


def test_float32_close_to_float64():
    x = _t(_cloud(offset=1.0))
    for fn in (effective_rank, rankme, mean_cosine):
        assert fn(x.float()) == pytest.approx(fn(x), rel=1e-4)


# ------------------------------------------------------------------ planted ground truth
def _orthonormal(n, k, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, k)))
    return q


@pytest.mark.parametrize("r", [1, 3, 7])
def test_equal_singular_values_give_rank_r(r):
    n, d = 60, 12
    x = _t(_orthonormal(n, r, 0) @ np.diag(np.full(r, 2.5)) @ _orthonormal(d, r, 1).T)
    assert effective_rank(x) == pytest.approx(r, rel=1e-9)
    assert rankme(x) == pytest.approx(r, rel=1e-4)
    assert numerical_rank(x) == r
    assert condition_number(x) == pytest.approx(1.0, rel=1e-9)


def test_effective_rank_is_not_capped_after_centring():
    """Centring n = 5 points in d = 10 leaves rank 4; the entropy is never clipped to some cap."""
    x = _cloud(n=5, d=10, seed=4)
    xc = x - x.mean(0)
    assert effective_rank(_t(x), centre=True) == pytest.approx(np_effective_rank(xc), rel=TOL)
    assert 1 < effective_rank(_t(x), centre=True) < 4


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.3])
@pytest.mark.parametrize("centre", [False, True])
def test_power_law_spectrum_recovers_alpha(alpha, centre):
    n, d = 150, 104
    lam = np.arange(1, d + 1, dtype=float) ** -alpha
    if centre:  # left vectors orthogonal to the ones vector, so centring leaves X unchanged
        basis = _orthonormal(n, d + 1, 0)
        ones = np.ones((n, 1)) / math.sqrt(n)
        u = basis - ones @ (ones.T @ basis)
        u, _ = np.linalg.qr(u[:, :d])
        scale = math.sqrt(n - 1)  # covariance = X^T X / (N - 1)
    else:
        u, scale = _orthonormal(n, d, 0), math.sqrt(n)
    x = u @ np.diag(np.sqrt(lam) * scale) @ _orthonormal(d, d, 1).T
    got, r2 = alpha_req(_t(x), centre=centre)  # the reference range, indices 5..99
    assert got == pytest.approx(alpha, abs=1e-3)
    assert r2 == pytest.approx(1.0, abs=1e-6)


def test_isotropic_cloud_and_offset_cloud():
    g = torch.Generator().manual_seed(0)
    cloud = torch.randn(200_000, 4, generator=g, dtype=torch.float64)
    assert isotropy(cloud) > 0.95
    shifted = cloud + 8.0 * torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert isotropy(shifted) < 1e-3
    assert mean_cosine(cloud) == pytest.approx(0.0, abs=0.01)
    assert mean_cosine(shifted) > 0.9


def test_condition_number_of_known_singular_values():
    s = np.array([10.0, 5.0, 2.0, 0.5])
    x = _t(_orthonormal(30, 4, 2) @ np.diag(s) @ _orthonormal(6, 4, 3).T)  # rank 4 in d = 6
    assert condition_number(x) == pytest.approx(20.0, rel=1e-9)
    assert condition_number(x, rtol=0.1) == pytest.approx(5.0, rel=1e-9)  # 0.5 < 0.1 * 10 is negligible


# ------------------------------------------------------------------ invariances
def _rotation(d, seed):
    return _t(_orthonormal(d, d, seed))


def test_rotation_invariance():
    x = _t(_cloud(offset=1.0))
    q = _rotation(x.shape[1], 5)
    a = spectral_summary(x, alpha_fit_range=(2, 20))
    b = spectral_summary(x @ q, alpha_fit_range=(2, 20))
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-7, abs=1e-9), key
    assert isotropy(x @ q) == pytest.approx(isotropy(x), rel=1e-7)


def test_scale_invariance_except_isotropy():
    x = _t(_cloud(offset=1.0))
    a = spectral_summary(x, alpha_fit_range=(2, 20))
    b = spectral_summary(3.7 * x, alpha_fit_range=(2, 20))
    for key in ("effective_rank", "rankme", "alpha_req", "alpha_req_r2", "condition_number", "mean_cosine",
                "cosine_std"):
        assert b[key] == pytest.approx(a[key], rel=1e-7), key
    # Isotropy is NOT scale invariant: Z(c) = sum exp(c^T w) changes non-linearly with the scale.
    assert abs(b["log_isotropy"] - a["log_isotropy"]) > 0.1


# ------------------------------------------------------------------ bad inputs
ALL = (effective_rank, rankme, isotropy, mean_cosine, condition_number, numerical_rank,
       lambda x: alpha_req(x, fit_range=(0, 2)), spectral_summary)


@pytest.mark.parametrize("fn", ALL)
def test_bad_inputs(fn):
    with pytest.raises(TypeError):
        fn(np.ones((4, 3)))
    with pytest.raises(TypeError):
        fn(torch.ones(4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="2-D"):
        fn(torch.ones(4))
    with pytest.raises(ValueError, match="at least 2 rows"):
        fn(torch.ones(1, 3))
    bad = torch.randn(5, 3)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fn(bad)
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match="infinite"):
        fn(bad)
    with pytest.raises(ValueError, match="zero"):
        fn(torch.zeros(5, 3))


def test_identical_rows_are_zero_after_centring():
    x = torch.ones(6, 3)
    with pytest.raises(ValueError, match="after centring"):
        effective_rank(x, centre=True)
    with pytest.raises(ValueError, match="after centring"):
        spectral_summary(x, alpha_fit_range=(0, 2))


def test_alpha_range_errors():
    x = torch.randn(50, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="needs 100 covariance eigenvalues"):
        alpha_req(x)
    with pytest.raises(ValueError, match="needs 100 covariance eigenvalues"):
        spectral_summary(x)
    with pytest.raises(ValueError, match="stop - start >= 2"):
        alpha_req(x, fit_range=(3, 4))
    with pytest.raises(TypeError):
        alpha_req(x, fit_range=5)
    low_rank = x[:, :4] @ torch.randn(4, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="numerical rank 4"):
        alpha_req(low_rank, fit_range=(1, 10))


def test_zero_norm_row_in_cosines():
    x = torch.randn(5, 3)
    x[2] = 0
    with pytest.raises(ValueError, match="zero norm"):
        mean_cosine(x)


def test_half_precision_is_promoted():
    x = _t(_cloud()).float()
    assert effective_rank(x.half()) == pytest.approx(effective_rank(x), rel=1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    x = _t(_cloud(offset=1.0))
    a = spectral_summary(x, alpha_fit_range=(2, 20))
    b = spectral_summary(x.cuda(), alpha_fit_range=(2, 20))
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-6), key


def test_no_pair_loops_large_n_cosines_fast():
    """cosine_stats on 20k rows is exact without the 20k x 20k matrix (compared on a subsample pairwise)."""
    x = _cloud(n=20_000, d=8, seed=7, offset=0.5)
    mean, sd = cosine_stats(_t(x))
    sub = x[:2000]
    ref_mean, ref_sd = np_cosines(sub)
    assert mean == pytest.approx(ref_mean, abs=0.02) and sd == pytest.approx(ref_sd, abs=0.02)
