"""Cross-model convergence of distance structure: against scipy, and invariances with known answers."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

from geolens.metrics import random_subspaces, readout_basis, remove_common_components
from geolens.metrics.convergence import centred_unit_ranks, distance_convergence, rank_correlation_matrix


def _cloud(n=80, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) + 1.0


def test_full_and_readout_rhos_equal_scipy():
    a, b = _cloud(seed=0), _cloud(d=10, seed=1)
    b = b + 0.5 * torch.nn.functional.pad(a[:, :10], (0, 0))  # correlated structure
    qa, qb = readout_basis(torch.randn(12, 40, dtype=torch.float64), 3), readout_basis(torch.randn(10, 40, dtype=torch.float64), 3)
    out = distance_convergence(a, b, qa, qb, n_null=6, ccr=1, seed=2)
    pa, pb = remove_common_components(a, 1).numpy(), remove_common_components(b, 1).numpy()
    assert out["spearman_full"] == pytest.approx(spearmanr(pdist(pa, "cosine"), pdist(pb, "cosine")).statistic, abs=1e-9)
    ref = spearmanr(pdist(pa @ qa.numpy(), "cosine"), pdist(pb @ qb.numpy(), "cosine")).statistic
    assert out["spearman_readout"] == pytest.approx(ref, abs=1e-9)
    na, nb = random_subspaces(12, 3, 6, seed=2).numpy(), random_subspaces(10, 3, 6, seed=3).numpy()
    null = [spearmanr(pdist(pa @ x, "cosine"), pdist(pb @ y, "cosine")).statistic for x, y in zip(na, nb)]
    assert out["spearman_random_mean"] == pytest.approx(np.mean(null), abs=1e-9)
    assert out["spearman_random_std"] == pytest.approx(np.std(null, ddof=1), abs=1e-9)


def test_self_convergence_is_one_and_rotation_invariant():
    a = _cloud()
    q = torch.linalg.qr(torch.randn(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(5)))[0]
    readout = readout_basis(torch.randn(12, 40, dtype=torch.float64), 4)
    same = distance_convergence(a, a, readout, readout, n_null=0, ccr=1)
    assert same["spearman_full"] == pytest.approx(1.0, abs=1e-12) and same["spearman_readout"] == pytest.approx(1.0, abs=1e-12)
    rotated = distance_convergence(a, a @ q, readout, q.T @ readout, n_null=0, ccr=1)
    assert rotated["spearman_full"] == pytest.approx(1.0, abs=1e-9)
    assert rotated["spearman_readout"] == pytest.approx(1.0, abs=1e-9)


def test_grid_is_a_matrix_of_spearmans():
    clouds = torch.stack([_cloud(seed=s) for s in range(3)])
    units = centred_unit_ranks(clouds)
    grid = rank_correlation_matrix(units, units)
    torch.testing.assert_close(torch.diagonal(grid), torch.ones(3, dtype=torch.float64))
    ref = spearmanr(pdist(clouds[0].numpy(), "cosine"), pdist(clouds[2].numpy(), "cosine")).statistic
    assert float(grid[0, 2]) == pytest.approx(ref, abs=1e-9)


def test_convergence_errors():
    with pytest.raises(ValueError, match="same positions"):
        distance_convergence(_cloud(n=10), _cloud(n=11))
    with pytest.raises(ValueError, match="both readouts"):
        distance_convergence(_cloud(), _cloud(), readout_a=torch.eye(12, dtype=torch.float64)[:, :2])
    with pytest.raises(ValueError, match="same k"):
        distance_convergence(_cloud(), _cloud(), torch.eye(12)[:, :2].double(), torch.eye(12)[:, :3].double())
