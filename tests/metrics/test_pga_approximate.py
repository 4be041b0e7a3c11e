"""Approximate PGA (``n_pairs``): the null's spread freed of the pair-sampling noise, and an honest z_se.

Planted states where the exact z is known and set by construction: near-isotropic states whose
variance is raised in a subspace B and lowered in another, C; readouts rotated from B (z >> 0) to C
(z << 0). The exact rhos (every pair) are the reference; the approximate ones come from the same
code path as ``subspace_pga(n_pairs=...)`` (shared pair sample, jackknife blocks seeded alike),
run once for all readouts and the null subspaces together, which keeps the tests short.
"""

import warnings

import numpy as np
import pytest
import torch

from geolens.metrics import random_subspaces, rank_alignment, remove_common_components, subspace_pga
from geolens.metrics._ranking.pairs import shared_pair_sample
from geolens.metrics.pga import (
    JACKKNIFE_BLOCKS,
    MIN_NULL_VARIANCE_FRACTION,
    sampled_rank_alignment,
    sampled_z,
)

N, D, K, R = 1024, 512, 128, 100
M = N * (N - 1) // 2
# Readout angles from B towards C: exact z from about 116 down to about -50 (checked below).
ANGLES = (0.0, 0.79, 1.05, 1.2, 1.31)


def _planted(seed: int, n: int = N, d: int = D, k: int = K, boost: float = 1.7, dark: float = 0.5,
             angles=ANGLES):
    """CCR-1-processed float32 states ``[n, d]`` and readouts ``[len(angles), d, k]``.

    Gaussian states, their standard deviation ``boost`` in B, ``dark`` in C and 1 elsewhere, plus a
    dominant direction outside both (CCR-1 removes it); readout ``cos(t) B + sin(t) C``."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    scale = torch.ones(d, dtype=torch.float64)
    scale[:k], scale[k:2 * k] = boost, dark
    states = (torch.randn(n, d, generator=g, dtype=torch.float64) * scale) @ basis.T
    states += 20.0 * torch.randn(n, 1, generator=g, dtype=torch.float64) * basis[:, -1]
    b, c = basis[:, :k], basis[:, k:2 * k]
    readouts = torch.stack([np.cos(t) * b + np.sin(t) * c for t in angles])
    return remove_common_components(states, 1).float(), readouts.float()


def _z_of(rhos: torch.Tensor, j: int, n_readouts: int) -> float:
    null = rhos[n_readouts:].double()
    return float((rhos[j] - null.mean()) / null.std())


def _rows(j: int, n_readouts: int, r: int) -> torch.Tensor:
    """Readout ``j`` and the null subspaces, in the order ``sampled_z`` takes them."""
    return torch.cat([torch.tensor([j]), torch.arange(n_readouts, n_readouts + r)])


@pytest.fixture(scope="module")
def planted_cases():
    """Per state seed: processed states, all subspaces (readouts first) and their exact rhos."""
    cases = []
    for seed in (0, 1):
        states, readouts = _planted(seed)
        subspaces = torch.cat([readouts, random_subspaces(D, K, R, seed=10 + seed, dtype=torch.float32)])
        cases.append((states, subspaces, rank_alignment(states, subspaces).double()))
    return cases


def _approximate(states, subspaces, n_pairs, seed):
    pairs = shared_pair_sample(states.shape[0], n_pairs, seed)
    rhos, deleted = sampled_rank_alignment(states, subspaces, pairs, seed=seed)
    return rhos, deleted, 1.0 - pairs.n_pairs / M


def test_planted_z_within_tolerance_and_its_error_honest(planted_cases):
    """Exact z from about -50 to 116, two state seeds, two pair samples each, 400,000 of the 523,776 pairs
    (the pair-sampling noise is a few per cent of the null's variance, as at N = 4096 with 500,000
    pairs): |dz| <= 0.3 + 0.05 |z|, |dz| <= 3 z_se + 0.3, and z_se <= 0.5 + 0.05 |z|."""
    n_readouts = len(ANGLES)
    exact_z = []
    for states, subspaces, exact in planted_cases:
        z_ref = [_z_of(exact, j, n_readouts) for j in range(n_readouts)]
        exact_z += z_ref
        for pair_seed in (0, 1):
            rhos, deleted, fpc = _approximate(states, subspaces, 400_000, pair_seed)
            for j, z0 in enumerate(z_ref):
                rows = _rows(j, n_readouts, R)
                s = sampled_z(rhos[rows], deleted[rows], fpc)
                dz = abs(s.z - z0)
                assert not s.floored and 0 < s.pair_noise_std < s.null_std < s.null_std_raw
                assert dz <= 0.3 + 0.05 * abs(z0), (z0, s)
                assert dz <= 3 * s.z_se + 0.3, (z0, s)
                assert s.z_se <= 0.5 + 0.05 * abs(z0), (z0, s)
    # The planted range: strongly positive to strongly negative z.
    assert max(exact_z) > 100 and min(exact_z) < -40 and any(abs(z) < 25 for z in exact_z)


def test_noise_correction_removes_the_bias_the_raw_spread_has(planted_cases):
    """Few pairs (the noise about half the null's variance): across pair samples the uncorrected z
    (``null_std_raw``) is biased towards 0, the corrected one is centred on the exact z, the noise
    estimate matches the realised noise ``var(e_i - mean e)`` of the null rhos, and z_se describes
    the errors. Tolerances: 8 pair samples, the relative error of one z about 7 %."""
    states, subspaces, exact = planted_cases[0]
    n_readouts = len(ANGLES)
    z_ref = np.array([_z_of(exact, j, n_readouts) for j in range(n_readouts)])
    rel_raw, rel, ratio, noise, realised = [], [], [], [], []
    for pair_seed in range(8):
        rhos, deleted, fpc = _approximate(states, subspaces, 100_000, pair_seed)
        err = (rhos[n_readouts:] - exact[n_readouts:]).numpy()
        realised.append(np.var(err, ddof=1))
        for j, z0 in enumerate(z_ref):
            rows = _rows(j, n_readouts, R)
            s = sampled_z(rhos[rows], deleted[rows], fpc)
            raw_z = (float(rhos[j]) - float(rhos[n_readouts:].mean())) / s.null_std_raw
            if abs(z0) > 20:  # where the spread, not the numerator, sets the error
                rel_raw.append(raw_z / z0 - 1)
                rel.append(s.z / z0 - 1)
                ratio.append((s.z - z0) / s.z_se)
        noise.append(s.pair_noise_std**2)
    assert 0.3 < np.mean(noise) / exact[n_readouts:].var() < 1.0  # the noise is visible here
    assert np.mean(rel_raw) < -0.1  # the raw spread shrinks z by more than the tolerance
    assert abs(np.mean(rel)) < 0.05
    assert np.mean(noise) == pytest.approx(np.mean(realised), rel=0.2)
    ratio = np.array(ratio)
    assert 0.6 < np.sqrt(np.mean(ratio**2)) < 1.6
    assert np.mean(np.abs(ratio) <= 3) >= 0.9


def _reference_sampled_z(rhos, deleted, fpc, floor):
    """The estimator of docs/methods.md §A.4a written out with NumPy loops."""
    rhos, deleted = np.asarray(rhos, float), np.asarray(deleted, float)
    s_count, g = deleted.shape
    r = s_count - 1
    scale = fpc * (g - 1) / g

    def jack(theta):
        return scale * sum((t - np.mean(theta)) ** 2 for t in theta)

    null = rhos[1:]
    raw = np.var(null, ddof=1)
    w = np.zeros(g)
    for i in range(1, s_count):
        a = np.array([deleted[i, b] - np.mean(deleted[1:, b]) for b in range(g)])
        for b in range(g):
            w[b] += scale * (a[b] - a.mean()) ** 2 / (r - 1)
    noise = w.sum()
    null_var = max(raw - noise, floor * raw)
    z = (rhos[0] - null.mean()) / np.sqrt(null_var)
    rep_z = []
    for b in range(g):
        rep_var = np.var(deleted[1:, b], ddof=1)
        rep_z.append((deleted[0, b] - deleted[1:, b].mean()) / np.sqrt(max(rep_var - noise, floor * rep_var)))
    noise_se = np.sqrt(g * np.var(w, ddof=1))
    z_se = np.sqrt(jack(rep_z) + (abs(z) / (2 * null_var) * noise_se) ** 2)
    return z, np.sqrt(null_var), np.sqrt(raw), np.sqrt(noise), np.sqrt(jack(deleted[0])), z_se


@pytest.mark.parametrize("spread", [0.01, 2.0])  # a small noise; a noise beyond the floor
def test_sampled_z_matches_the_formula_written_out(spread):
    g = torch.Generator().manual_seed(0)
    rhos = 0.4 + 0.01 * torch.randn(31, generator=g, dtype=torch.float64)
    rhos[0] += 0.05
    deleted = rhos.unsqueeze(1) + spread * 0.01 * torch.randn(31, 12, generator=g, dtype=torch.float64)
    s = sampled_z(rhos, deleted, 0.9)
    ref = _reference_sampled_z(rhos.numpy(), deleted.numpy(), 0.9, MIN_NULL_VARIANCE_FRACTION)
    got = (s.z, s.null_std, s.null_std_raw, s.pair_noise_std, s.rho_se, s.z_se)
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=0)
    assert s.floored == (spread == 2.0) and s.null_std >= np.sqrt(MIN_NULL_VARIANCE_FRACTION) * s.null_std_raw - 1e-15


def test_subspace_pga_reports_the_correction():
    """subspace_pga's approximate score is sampled_z of its own rhos and replicates; the table's numbers
    are consistent (null_std^2 = null_std_raw^2 - pair_noise_std^2) and exact scores carry no correction."""
    states, readouts = _planted(3, n=400, d=64, k=8, angles=(0.3,))
    nulls = random_subspaces(64, 8, 30, seed=2, dtype=torch.float32)
    score = subspace_pga(states, readouts[0], null_subspaces=nulls, ccr=0, seed=4, n_pairs=20_000)
    rhos, deleted, fpc = _approximate(states, torch.cat([readouts, nulls]), 20_000, 4)
    s = sampled_z(rhos, deleted, 1.0 - 20_000 / (400 * 399 // 2))
    assert (score.z, score.z_se, score.rho_se, score.null_std, score.null_std_raw, score.pair_noise_std) == pytest.approx(
        (s.z, s.z_se, s.rho_se, s.null_std, s.null_std_raw, s.pair_noise_std), rel=1e-4)  # re-centred in float32
    assert score.pair_noise_std > 0 and not score.null_floored and score.null_std < score.null_std_raw
    assert score.null_std**2 == pytest.approx(score.null_std_raw**2 - score.pair_noise_std**2, rel=1e-9)
    assert score.null_std_raw == pytest.approx(float(score.null_rhos.std()), rel=1e-12)
    exact = subspace_pga(states, readouts[0], null_subspaces=nulls, ccr=0)
    assert exact.null_std_raw == exact.null_std and exact.pair_noise_std == 0.0 and not exact.null_floored


def test_too_few_pairs_floor_the_null_and_warn():
    """Pure noise states and the fewest pairs: the pair-sampling noise is most of the null's spread."""
    g = torch.Generator().manual_seed(0)
    states = torch.randn(2000, 64, generator=g)
    q = torch.linalg.qr(torch.randn(64, 16, generator=g))[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        score = subspace_pga(states, q, n_null=40, ccr=0, seed=0, n_pairs=1000)
    assert score.null_floored and score.pair_noise_std > score.null_std_raw * (1 - MIN_NULL_VARIANCE_FRACTION) ** 0.5
    assert any("floored" in str(w.message) and "n_pairs = 1000" in str(w.message) for w in caught)
    assert score.null_std == pytest.approx(np.sqrt(MIN_NULL_VARIANCE_FRACTION) * score.null_std_raw, rel=1e-12)
    assert np.isfinite(score.z) and score.z_se > 0


def test_blocks_fit_the_compiled_kernel():
    from geolens.metrics._ranking.select import select_backend

    assert select_backend(device="cpu", dtype=torch.float32, n_values=500_000, n_blocks=JACKKNIFE_BLOCKS).name == "cpu"
