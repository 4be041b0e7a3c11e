"""The named steps of subspace PGA, each against an independent reference (numpy/scipy) or planted truth."""

import numpy as np
import pytest
import torch
from scipy.stats import rankdata, spearmanr

from geolens._validation import DegenerateError
from geolens.metrics.pga import (
    _centred_and_reduced,
    _centred_full_ranks,
    _checked_readout,
    _deleted_rhos,
    _jackknife_blocks,
    _null_statistics,
    _null_subspaces,
    sample_pairs,
    sampled_rank_alignment,
)


def test_checked_readout_orthonormalises_and_names_bad_shapes():
    basis = _checked_readout(torch.randn(6, 2, dtype=torch.float64) * 3.0, 6)
    assert torch.allclose(basis.T @ basis, torch.eye(2, dtype=torch.float64), atol=1e-12)
    with pytest.raises(ValueError, match=r"readout must be \[d, k\] with d = 5"):
        _checked_readout(torch.randn(6, 2), 5)
    with pytest.raises(ValueError, match="k must be < d = 4"):
        _checked_readout(torch.randn(4, 4), 4)


def test_null_subspaces_given_or_drawn():
    like = torch.zeros(1, dtype=torch.float64)
    drawn = _null_subspaces(None, 3, 6, 2, seed=0, like=like)
    assert drawn.shape == (3, 6, 2) and drawn.dtype == torch.float64
    assert torch.equal(drawn, _null_subspaces(None, 3, 6, 2, seed=0, like=like))  # seeded
    given = torch.randn(4, 6, 2)
    assert torch.equal(_null_subspaces(given, 99, 6, 2, seed=0, like=like), given.double())  # n_null ignored
    with pytest.raises(ValueError, match=r"null_subspaces must be \[R, 6, 2\]"):
        _null_subspaces(torch.randn(4, 6, 3), 3, 6, 2, seed=0, like=like)
    with pytest.raises(ValueError, match="number of null subspaces must be >= 2"):
        _null_subspaces(torch.randn(1, 6, 2), 3, 6, 2, seed=0, like=like)
    with pytest.raises(ValueError, match="n_null must be >= 2"):
        _null_subspaces(None, 1, 6, 2, seed=0, like=like)


def test_centred_and_reduced_against_numpy_svd():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(80, 6)) * np.array([9.0, 4.0, 1.0, 1.0, 1.0, 1.0]) + 5.0
    readout = np.eye(6)[:, :2]
    centred = h - h.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    for ccr in (0, 1, 2):
        expected = centred - centred @ vt[:ccr].T @ vt[:ccr]
        reduced, energy = _centred_and_reduced(torch.from_numpy(h), torch.from_numpy(readout), ccr, torch.float64)
        np.testing.assert_allclose(reduced.numpy(), expected, atol=1e-10)
        assert energy == pytest.approx(float(np.sum((readout.T @ vt[0]) ** 2)), abs=1e-12)
    line = torch.arange(10, dtype=torch.float64)[:, None] * torch.tensor([[1.0, 2.0, 0.5]], dtype=torch.float64)
    with pytest.raises(DegenerateError, match="span"):
        _centred_and_reduced(line + 1e-3 * torch.randn(10, 3, dtype=torch.float64), torch.eye(3)[:, :1].double(), 2,
                             torch.float64)


def test_centred_full_ranks_are_scipys_average_ranks():
    values = torch.tensor([0.4, 0.1, 0.4, 0.2, 0.9], dtype=torch.float64)  # one tie
    full, norm = _centred_full_ranks(values, "full-space")
    expected = rankdata(values.numpy()) - 3.0
    np.testing.assert_allclose(full.centred().numpy(), expected)
    assert float(norm) == pytest.approx(float(np.linalg.norm(expected)))
    with pytest.raises(DegenerateError, match="all sampled full-space distances are equal"):
        _centred_full_ranks(torch.ones(4, dtype=torch.float64), "sampled full-space")


def test_jackknife_blocks_are_seeded_and_equal_sized():
    blocks, sizes = _jackknife_blocks(1003, 32, seed=3)
    assert blocks.dtype == torch.int64 and sizes.dtype == torch.float64
    assert torch.equal(torch.bincount(blocks, minlength=32).double(), sizes)
    assert float(sizes.max() - sizes.min()) <= 1.0 and float(sizes.sum()) == 1003
    assert torch.equal(blocks, _jackknife_blocks(1003, 32, seed=3)[0])
    assert not torch.equal(blocks, _jackknife_blocks(1003, 32, seed=4)[0])


def test_deleted_rhos_match_the_influence_formula_block_by_block():
    gen = torch.Generator().manual_seed(0)
    rho = torch.rand(3, generator=gen, dtype=torch.float64)
    phi = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    sizes = torch.tensor([4.0, 4.0, 4.0, 3.0, 3.0], dtype=torch.float64)
    p = 18.0
    deleted = _deleted_rhos(rho, phi, sizes)
    for s in range(3):
        for g in range(5):
            move = 12.0 * (float(phi[s, g]) - float(sizes[g]) * float(phi[s].sum()) / p) / (p - float(sizes[g]))
            assert float(deleted[s, g]) == pytest.approx(float(rho[s]) - move, rel=1e-12)


def test_deleted_rhos_track_the_recomputed_spearman():
    """First order: each replicate is close to Spearman recomputed with its block left out (scipy)."""
    _ = torch.manual_seed(0)
    n = 120
    h = torch.randn(n, 5, dtype=torch.float64)
    q = torch.linalg.qr(torch.randn(5, 2, dtype=torch.float64))[0]
    pairs = sample_pairs(n, 4000, seed=0)
    rho, deleted = sampled_rank_alignment(h, q.unsqueeze(0), pairs, seed=0, n_blocks=8, backend="torch")
    blocks, _ = _jackknife_blocks(pairs.n_pairs, 8, seed=0)
    i, j = pairs.i.numpy(), pairs.j.numpy()

    def cos_dist(x):
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        return 1.0 - np.sum(x[i] * x[j], axis=1)

    full, proj = cos_dist(h.numpy()), cos_dist((h @ q).numpy())
    assert float(rho[0]) == pytest.approx(spearmanr(full, proj)[0], abs=1e-10)
    for g in range(8):
        keep = blocks.numpy() != g
        assert float(deleted[0, g]) == pytest.approx(spearmanr(full[keep], proj[keep])[0], abs=2e-4)


def test_null_statistics_exact_against_numpy():
    rhos = torch.tensor([0.7, 0.1, 0.3, 0.2, 0.25], dtype=torch.float64)
    stats = _null_statistics(rhos, None, n_tokens=10, n_pairs=45)
    null = rhos[1:].numpy()
    assert stats.z == pytest.approx((0.7 - null.mean()) / null.std(ddof=1))
    assert stats.null_std == stats.null_std_raw == pytest.approx(null.std(ddof=1))
    assert (stats.rho_se, stats.z_se, stats.pair_noise_std, stats.floored) == (0.0, 0.0, 0.0, False)
    with pytest.raises(DegenerateError, match="zero spread"):
        _null_statistics(torch.tensor([0.5, 0.2, 0.2, 0.2], dtype=torch.float64), None, n_tokens=10, n_pairs=45)


def test_null_statistics_sampled_warns_when_floored():
    rhos = torch.tensor([0.5, 0.1, 0.2, 0.3], dtype=torch.float64)
    # Replicates whose spread across subspaces is far larger than the rhos' own: the noise swamps the null.
    noise = torch.tensor([[0.0] * 4, [1.0, -1.0, 1.0, -1.0], [-1.0, 1.0, -1.0, 1.0], [0.5, 0.5, -0.5, -0.5]],
                         dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="floored"):
        stats = _null_statistics(rhos, rhos.unsqueeze(1) + noise, n_tokens=1000, n_pairs=5000)
    assert stats.floored
    assert stats.null_std_raw == pytest.approx(float(rhos[1:].std()))
