"""Distances, ranks and Spearman against scipy."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import rankdata, spearmanr

from geolens.metrics import condensed_indices, pairwise_cosine_distances, rank_data, spearman
from geolens.metrics.distances import tie_rank_offsets


def test_condensed_distances_equal_pdist():
    x = torch.randn(40, 7, dtype=torch.float64)
    np.testing.assert_allclose(pairwise_cosine_distances(x).numpy(), pdist(x.numpy(), "cosine"), atol=1e-12)


def test_batched_distances_equal_per_cloud():
    x = torch.randn(3, 20, 5, dtype=torch.float64)
    batched = pairwise_cosine_distances(x)
    for b in range(3):
        torch.testing.assert_close(batched[b], pairwise_cosine_distances(x[b]))


def test_condensed_indices_order_is_pdist_order():
    n = 6
    i, j = np.triu_indices(n, k=1)
    assert condensed_indices(n).tolist() == (i * n + j).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_rank_data_equals_scipy_average_ranks_with_ties(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 6, (3, 50), generator=g).float()
    expected = np.stack([rankdata(row, method="average") for row in x.numpy()])
    np.testing.assert_array_equal(rank_data(x).numpy(), expected)


def test_tie_offsets_only_cover_tied_entries():
    rows, cols, offsets = tie_rank_offsets(torch.tensor([[0.0, 1.0, 1.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]]))
    assert rows.tolist() == [0, 0, 0] and cols.tolist() == [1, 2, 3]
    assert offsets.tolist() == [1.0, 0.0, -1.0]


def test_spearman_equals_scipy():
    a, b = torch.randn(500, dtype=torch.float64), torch.randn(500, dtype=torch.float64)
    b = a + b
    assert float(spearman(a, b)) == pytest.approx(spearmanr(a.numpy(), b.numpy()).statistic, abs=1e-12)


def test_zero_row_raises():
    x = torch.randn(5, 3)
    x[2] = 0.0
    with pytest.raises(ValueError, match="zero norm"):
        pairwise_cosine_distances(x)


def test_constant_input_spearman_raises():
    with pytest.raises(ValueError, match="constant"):
        spearman(torch.ones(5), torch.randn(5))
