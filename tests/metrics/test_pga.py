"""Subspace PGA against scipy (pdist + spearmanr) and against planted ground truth."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

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
    from geolens.metrics.distances import negated_cosines

    # Same distance values (so the same float ties), ranked by scipy.
    ref = spearmanr(negated_cosines(h).numpy(), negated_cosines(h @ axes[0]).numpy()).statistic
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
