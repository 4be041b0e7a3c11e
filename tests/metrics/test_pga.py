"""Subspace PGA against scipy (pdist + spearmanr) and against planted ground truth."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

from geolens._validation import DegenerateError
from geolens.metrics import (
    random_subspaces,
    rank_alignment,
    readout_basis,
    remove_common_components,
    subspace_pga,
)


def _scipy_rho(states: np.ndarray, basis: np.ndarray) -> float:
    return spearmanr(pdist(states, "cosine"), pdist(states @ basis, "cosine")).statistic


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("ccr", [0, 1, 3])
def test_rhos_equal_scipy_reference(dtype, ccr):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(150, 24, generator=g, dtype=torch.float64) + 2.0
    w_u = torch.randn(24, 300, generator=g, dtype=torch.float64)
    q = readout_basis(w_u, 6)
    score = subspace_pga(h.to(dtype), q.to(dtype), n_null=12, ccr=ccr, seed=3)

    processed = remove_common_components(h, ccr).numpy()  # float64 reference path
    nulls = random_subspaces(24, 6, 12, seed=3).numpy()
    ref_readout = _scipy_rho(processed, q.numpy())
    ref_null = np.array([_scipy_rho(processed, b) for b in nulls])
    assert abs(score.rho_readout - ref_readout) < 1e-6
    np.testing.assert_allclose(score.null_rhos.numpy(), ref_null, atol=1e-6, rtol=0)
    # z and p follow the spec's formulas (sample std, ddof=1; one-sided empirical p).
    assert score.z == pytest.approx((ref_readout - ref_null.mean()) / ref_null.std(ddof=1), abs=1e-4)
    assert score.p_value == pytest.approx((1 + (ref_null >= ref_readout).sum()) / 13)


def test_rank_alignment_handles_ties_like_scipy():
    # Coordinates on a coarse grid give many exactly tied projected distances.
    g = torch.Generator().manual_seed(0)
    h = torch.randint(1, 4, (40, 5), generator=g).double()
    axes = torch.eye(5, dtype=torch.float64)[:, :2].unsqueeze(0)
    got = float(rank_alignment(h, axes)[0])
    from geolens.metrics._ranking.products import negated_cosine_upper
    from geolens.metrics.distances import negated_cosines

    # The very values geolens ranks (so the same float ties), ranked by scipy: the full space by
    # negated_cosines, the subspace by the BLAS triangle. Two summation orders can put exact ties
    # one ulp apart (they do with OpenBLAS's Zen 4 kernels), so the reference must not recompute them.
    upper = negated_cosine_upper((h @ axes[0]).unsqueeze(0))[0]
    i, j = torch.triu_indices(40, 40, offset=1)
    ref = spearmanr(negated_cosines(h).numpy(), upper[i, j].numpy()).statistic
    # A planted tie count: the grid gives many exactly equal projected distances.
    assert np.unique(upper[i, j].numpy()).size < 0.2 * i.numel()
    assert got == pytest.approx(ref, abs=1e-12)


def _planted(n=300, d=32, k=4, seed=0):
    """States whose distance structure lives in a known k-dim subspace B."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
    inside, outside = basis[:, :k], basis[:, k:]
    signal = torch.randn(n, k, generator=g, dtype=torch.float64) * 3.0
    noise = torch.randn(n, d - k, generator=g, dtype=torch.float64) * 0.5
    states = signal @ inside.T + noise @ outside.T + 5.0 * basis[:, 0]
    return states, inside, outside, g


def test_planted_subspace_gives_large_z_and_dominant_direction_masks_it():
    states, inside, outside, g = _planted()
    aligned = subspace_pga(states, inside, n_null=50, ccr=0)
    assert aligned.z > 4.0 and aligned.rho_readout > 0.95
    assert aligned.p_value == pytest.approx(1 / 51)

    # A dominant high-variance direction orthogonal to the readout subspace.
    dark = outside[:, 0]
    masked_states = states + torch.randn(states.shape[0], 1, generator=g, dtype=torch.float64) * 30.0 * dark
    masked = subspace_pga(masked_states, inside, n_null=50, ccr=0)
    assert masked.z < -5.0
    assert masked.pc1_readout_energy < 1e-3 < aligned.pc1_readout_energy
    # CCR-1 removes the dark direction and brings the alignment back.
    restored = subspace_pga(masked_states, inside, n_null=50, ccr=1)
    assert restored.z > 4.0
    assert restored.z == pytest.approx(aligned.z, rel=0.2)


def test_pc1_energy_against_direct_formula():
    states, inside, _, _ = _planted()
    score = subspace_pga(states, inside, n_null=5, ccr=0)
    centred = (states - states.mean(0)).numpy()
    pc1 = np.linalg.svd(centred, full_matrices=False)[2][0]
    assert score.pc1_readout_energy == pytest.approx(float(np.sum((inside.numpy().T @ pc1) ** 2)), abs=1e-10)
    assert score.random_energy == pytest.approx(4 / 32)


def test_same_seed_same_numbers_and_seed_changes_null():
    states, inside, _, _ = _planted()
    a = subspace_pga(states, inside, n_null=10, seed=5)
    b = subspace_pga(states, inside, n_null=10, seed=5)
    c = subspace_pga(states, inside, n_null=10, seed=6)
    assert torch.equal(a.null_rhos, b.null_rhos) and a.z == b.z
    assert not torch.equal(a.null_rhos, c.null_rhos)


def test_chunking_does_not_change_result():
    states, inside, _, _ = _planted(n=120)
    whole = subspace_pga(states, inside, n_null=9)
    tiny_chunks = subspace_pga(states, inside, n_null=9, chunk_bytes=1)
    torch.testing.assert_close(whole.null_rhos, tiny_chunks.null_rhos, rtol=0, atol=1e-12)


def test_non_orthonormal_readout_is_orthonormalised():
    states, inside, _, _ = _planted(n=100)
    skewed = inside @ torch.tensor([[2.0, 1.0, 0, 0], [0, 1.0, 0, 0], [0, 0, 3.0, 0], [0, 0, 1.0, 1.0]],
                                   dtype=torch.float64)
    a = subspace_pga(states, inside, n_null=5)
    b = subspace_pga(states, skewed, n_null=5)
    assert a.rho_readout == pytest.approx(b.rho_readout, abs=1e-12)


@pytest.mark.parametrize(
    "states, readout, kwargs, error, match",
    [
        (torch.randn(10, 8, 2), torch.randn(8, 2), {}, ValueError, "2-D"),
        (torch.randint(0, 3, (10, 8)), torch.randn(8, 2), {}, TypeError, "floating-point"),
        (torch.randn(2, 8), torch.randn(8, 2), {}, ValueError, "at least 3 rows"),
        (torch.randn(10, 8), torch.randn(7, 2), {}, ValueError, "d = 8"),
        (torch.randn(10, 8), torch.randn(8, 8), {}, ValueError, "k must be < d"),
        (torch.randn(10, 8), torch.randn(8, 2), {"n_null": 1}, ValueError, "n_null must be >= 2"),
        (torch.randn(10, 8), torch.randn(8, 2), {"ccr": 8}, ValueError, "ccr = 8"),
        (torch.randn(10, 8), torch.randn(8, 2), {"ccr": -1}, ValueError, "ccr must be >= 0"),
        (torch.ones(10, 8), torch.randn(8, 2), {"ccr": 0}, ValueError, "zero norm"),
        ("not a tensor", torch.randn(8, 2), {}, TypeError, "torch.Tensor"),
    ],
)
def test_bad_input_raises_clear_errors(states, readout, kwargs, error, match):
    with pytest.raises(error, match=match):
        subspace_pga(states, readout, **kwargs)


def test_non_finite_states_raise():
    h = torch.randn(10, 8)
    h[3, 2] = float("nan")
    h[4, 1] = float("inf")
    with pytest.raises(ValueError, match="1 NaN and 1 infinite"):
        subspace_pga(h, torch.randn(8, 2))


def test_rank_deficient_readout_raises():
    basis = torch.zeros(8, 2)
    basis[0, 0] = basis[0, 1] = 1.0
    with pytest.raises(ValueError, match="rank-deficient"):
        subspace_pga(torch.randn(10, 8), basis)


# ---------------------------------------------------------------- approximate PGA (n_pairs)
def test_n_pairs_covering_every_pair_is_exact():
    states, inside, _, _ = _planted(n=60)
    exact = subspace_pga(states, inside, n_null=8, seed=2)
    for n_pairs in (60 * 59 // 2, 10**9):
        same = subspace_pga(states, inside, n_null=8, seed=2, n_pairs=n_pairs)
        assert torch.equal(same.null_rhos, exact.null_rhos) and same.z == exact.z
        assert same.rho_readout == exact.rho_readout and same.p_value == exact.p_value
        assert same.n_pairs == exact.n_pairs == 60 * 59 // 2 and same.exact
        assert same.rho_se == same.z_se == 0.0


def test_sampled_rhos_are_spearman_on_the_sampled_pairs():
    from geolens.metrics._ranking.pairs import sample_pairs
    from geolens.metrics._ranking.products import pair_negated_cosines
    from geolens.metrics.pga import sampled_rank_alignment

    g = torch.Generator().manual_seed(4)
    h = torch.randn(200, 12, generator=g, dtype=torch.float64)
    subs = random_subspaces(12, 3, 4, seed=1)
    pairs = sample_pairs(200, 5000, seed=7)
    for dtype in (torch.float32, torch.float64):  # the NumPy kernel and the torch kernel
        rhos, _ = sampled_rank_alignment(h.to(dtype), subs.to(dtype), pairs)
        full = pair_negated_cosines(h.to(dtype), pairs).numpy()
        ref = [spearmanr(full, pair_negated_cosines(h.to(dtype) @ b.to(dtype), pairs).numpy()).statistic for b in subs]
        np.testing.assert_allclose(rhos.numpy(), ref, atol=1e-12, rtol=0)


def test_linearised_jackknife_matches_deleting_each_block():
    """The delete-a-group replicates, computed to first order from the influence function, against a re-ranking."""
    from geolens.metrics._ranking.pairs import sample_pairs
    from geolens.metrics._ranking.products import pair_negated_cosines
    from geolens.metrics.pga import JACKKNIFE_BLOCKS, sampled_rank_alignment

    states, inside, _, _ = _planted(n=300)
    subs = torch.cat([inside.unsqueeze(0), random_subspaces(32, 4, 3, seed=0)])
    pairs = sample_pairs(300, 20_000, seed=1)
    rhos, deleted = sampled_rank_alignment(states.float(), subs.float(), pairs, seed=3)
    perm = torch.randperm(pairs.n_pairs, generator=torch.Generator().manual_seed(3 + 0x5EED))
    blocks = torch.empty(pairs.n_pairs, dtype=torch.int64)
    blocks[perm] = torch.arange(pairs.n_pairs) % JACKKNIFE_BLOCKS
    blocks = blocks.numpy()
    full = pair_negated_cosines(states.float(), pairs).numpy()
    for s, basis in enumerate(subs):
        proj = pair_negated_cosines(states.float() @ basis.float(), pairs).numpy()
        exact = np.array([spearmanr(full[blocks != g], proj[blocks != g]).statistic for g in range(JACKKNIFE_BLOCKS)])
        spread = exact.std()
        assert spread > 0
        np.testing.assert_allclose(deleted[s].numpy(), exact, atol=0.05 * spread, rtol=0)


def test_approximate_z_is_within_tolerance_and_its_error_estimate_is_honest():
    """Planted states (a known subspace, z >> 0): across pair samples, |z_approx - z_exact| <= 0.3 + 0.05 |z|,
    and the jackknife standard error describes the real error: most errors lie within 3 SE, and the
    mean SE is within a factor of 2 of the errors' spread. Tolerances: the documented target; the
    factor 2 allows for the 19 degrees of freedom of a 20-group jackknife and 24 samples."""
    states, inside, _, _ = _planted(n=400, seed=1)
    nulls = random_subspaces(32, 4, 30, seed=0, dtype=torch.float32)
    h = states.float()
    exact = subspace_pga(h, inside.float(), null_subspaces=nulls, ccr=0)
    assert exact.z > 4
    z_err, rho_err, z_se, rho_se = [], [], [], []
    for seed in range(24):
        approx = subspace_pga(h, inside.float(), null_subspaces=nulls, ccr=0, seed=seed, n_pairs=8000)
        assert approx.n_pairs == 8000 and not approx.exact
        assert abs(approx.z - exact.z) <= 0.3 + 0.05 * abs(exact.z)
        z_err.append(approx.z - exact.z)
        rho_err.append(approx.rho_readout - exact.rho_readout)
        z_se.append(approx.z_se)
        rho_se.append(approx.rho_se)
    z_err, rho_err, z_se, rho_se = map(np.array, (z_err, rho_err, z_se, rho_se))
    assert (z_se > 0).all() and (rho_se > 0).all()
    assert np.mean(np.abs(z_err) <= 3 * z_se) >= 0.9
    assert np.mean(np.abs(rho_err) <= 3 * rho_se) >= 0.9
    for err, se in ((z_err, z_se), (rho_err, rho_se)):
        spread = np.sqrt(np.mean(err**2))
        assert 0.5 < se.mean() / spread < 2.0


def test_approximate_pga_is_deterministic_per_seed():
    states, inside, _, _ = _planted(n=200)
    a = subspace_pga(states, inside, n_null=10, seed=5, n_pairs=3000)
    b = subspace_pga(states, inside, n_null=10, seed=5, n_pairs=3000)
    c = subspace_pga(states, inside, n_null=10, seed=6, n_pairs=3000)
    assert torch.equal(a.null_rhos, b.null_rhos) and (a.z, a.z_se, a.rho_se) == (b.z, b.z_se, b.rho_se)
    assert a.rho_readout != c.rho_readout  # other pairs
    assert "±" in repr(a) and "n_pairs=3000" in repr(a)


@pytest.mark.parametrize(
    "n_pairs, error, match",
    [(0, ValueError, "n_pairs must be >= 2"), (1, ValueError, "n_pairs must be >= 2"),
     (5e5, TypeError, "n_pairs must be an int"), (500, ValueError, "n_pairs = 500"), (True, TypeError, "n_pairs")],
)
def test_bad_n_pairs_raise_naming_it(n_pairs, error, match):
    states, inside, _, _ = _planted(n=100)
    with pytest.raises(error, match=match):
        subspace_pga(states, inside, n_null=5, n_pairs=n_pairs)


@pytest.mark.parametrize("shape, dtype", [((300, 40), torch.float32), ((30, 80), torch.float32),
                                          ((300, 40), torch.float64)])
def test_singular_values_and_top_vectors_match_an_svd(shape, dtype):
    """float32 goes through the float64 Gram matrix (fast on CPUs; its top ``top + 2`` values); same numbers as
    a float64 SVD."""
    from geolens.metrics.preprocess import principal_components

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g, dtype=torch.float64) * torch.logspace(1, -3, shape[1], dtype=torch.float64))
    sv, vh = principal_components(x.to(dtype), 3)
    _, ref_sv, ref_vh = torch.linalg.svd(x, full_matrices=False)
    assert sv.dtype == vh.dtype == dtype and vh.shape == (3, shape[1])
    assert sv.shape == (ref_sv.shape if dtype == torch.float64 else (5,))
    torch.testing.assert_close(sv.double(), ref_sv[: sv.numel()], rtol=0, atol=1e-6 * float(ref_sv[0]))
    torch.testing.assert_close((vh.double() @ ref_vh[:3].T).abs(), torch.eye(3, dtype=torch.float64), atol=1e-5,
                               rtol=0)


@pytest.mark.parametrize("case", ["distinct", "repeated top", "repeated inside", "axis aligned", "wide centred"])
def test_largest_eigenpairs_by_lanczos_match_lapack(case):
    """The Lanczos path (a matrix of 256 rows or more, a few pairs) against LAPACK's partial eigh: the same
    eigenvalues and the same spanned subspaces, also where eigenvalues repeat (Lanczos must find every copy);
    and the same numbers on every call."""
    import scipy.linalg

    from geolens.metrics.preprocess import _LANCZOS_MIN_SIZE, largest_eigenpairs

    rng = np.random.default_rng(3)
    size, count = 576, 12
    basis = np.linalg.qr(rng.standard_normal((size, size)))[0]
    lam = np.sort(rng.uniform(0.0, 1.0, size))[::-1].copy()
    if case == "repeated top":
        lam[:3] = 5.0
    elif case == "repeated inside":
        lam[4:9] = 2.0
    elif case == "axis aligned":
        basis, lam[:3] = np.eye(size), 5.0
    matrix = (basis * lam) @ basis.T
    if case == "wide centred":  # an N x N Gram of centred rows (N < d): the ones vector is in its null space
        x = rng.standard_normal((size, 2 * size)) * np.logspace(0, -2, 2 * size)
        x -= x.mean(0)
        matrix = x @ x.T
    assert size >= _LANCZOS_MIN_SIZE and count <= size // 8  # the Lanczos path
    got, vectors = largest_eigenpairs(matrix, count)
    ref, ref_vectors = scipy.linalg.eigh(matrix, subset_by_index=[size - count, size - 1])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * ref[-1])
    assert np.all(np.diff(got) >= 0)  # ascending, as eigh gives them
    # Each group of equal eigenvalues spans the same subspace (a lone vector up to sign); the smallest group
    # may be cut by the range, so it is checked through the residuals alone.
    for value in np.unique(np.round(got, 9))[1:]:
        same = np.isclose(got, value, rtol=1e-9)
        np.testing.assert_allclose(vectors[:, same] @ vectors[:, same].T, ref_vectors[:, same] @ ref_vectors[:, same].T,
                                   atol=1e-8)
    np.testing.assert_allclose(matrix @ vectors - vectors * got, 0.0, atol=1e-10 * ref[-1])
    again = largest_eigenpairs(matrix, count)
    assert np.array_equal(again[0], got) and np.array_equal(again[1], vectors)
    matrix[0, 1] = matrix[1, 0] = np.nan  # not finite: refused, as LAPACK refuses it
    with pytest.raises(ValueError, match="infs or NaNs"):
        largest_eigenpairs(matrix, count)


def test_states_with_nothing_in_the_readout_subspace_are_degenerate_not_a_z():
    # X - X Q Q^T: the readout part is rounding noise, whose distances rank nothing (before: a finite z, unflagged)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 16, generator=g, dtype=torch.float64)
    q = torch.linalg.qr(torch.randn(16, 3, generator=g, dtype=torch.float64))[0]
    empty = (x - x @ q @ q.T + 1e-8 * torch.randn(200, 16, generator=g, dtype=torch.float64)).float()
    with pytest.raises(DegenerateError, match="nothing in the readout subspace"):
        subspace_pga(empty, q.float(), n_null=10, ccr=0)
    small = (x - 0.999 * (x @ q @ q.T)).float()  # a small but real readout part still scores
    assert math.isfinite(subspace_pga(small, q.float(), n_null=10, ccr=0).z)
