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


# ---------------------------------------------------------------- pair samples (approximate PGA)
def test_condensed_pairs_invert_condensed_order():
    from geolens.metrics.distances import condensed_pairs

    for n in (2, 3, 7, 64):
        i, j = condensed_pairs(torch.arange(n * (n - 1) // 2), n)
        ref_i, ref_j = torch.triu_indices(n, n, offset=1)
        assert torch.equal(i, ref_i) and torch.equal(j, ref_j)
    n = 200_000  # large positions: the float root is corrected to the exact row
    total = n * (n - 1) // 2
    c = torch.tensor([0, total - 1, total // 2, 12_345_678_901])
    i, j = condensed_pairs(c, n)
    assert torch.equal(i * (2 * n - i - 1) // 2 + j - i - 1, c) and bool((i < j).all())


@pytest.mark.parametrize("n, n_pairs", [(50, 100), (50, 1000), (1000, 20_000)])  # sparse, dense (> M/2), larger
def test_sample_pairs_distinct_sorted_and_seeded(n, n_pairs):
    from geolens.metrics._ranking.pairs import PAIR_TILE, sample_pairs

    s = sample_pairs(n, n_pairs, seed=3)
    flat = s.i * n + s.j
    assert s.n_pairs == n_pairs and s.total == n * (n - 1) // 2 and not s.exact
    assert bool((s.i < s.j).all()) and flat.unique().numel() == n_pairs  # distinct
    # Tile order: tiles in row-major order, pdist order inside each (a direct sort by those keys).
    t = PAIR_TILE
    key = ((s.i // t) * n + s.j // t) * n * n + flat
    assert bool((key[1:] > key[:-1]).all())
    assert (n > t) == bool((flat[1:] < flat[:-1]).any())  # pdist order when one tile holds every point
    again = sample_pairs(n, n_pairs, seed=3)
    assert torch.equal(again.i, s.i) and torch.equal(again.j, s.j)
    assert not torch.equal(sample_pairs(n, n_pairs, seed=4).j, s.j)


def test_sample_pairs_is_uniform():
    """Every pair is drawn equally often across seeds (chi-square on 10 points, 45 pairs, both regimes)."""
    from scipy.stats import chisquare

    from geolens.metrics._ranking.pairs import sample_pairs

    for n_pairs in (9, 30):  # below and above half of the 45 pairs
        counts = torch.zeros(45)
        for seed in range(600):
            s = sample_pairs(10, n_pairs, seed=seed)
            counts.index_add_(0, s.i * 9 - s.i * (s.i + 1) // 2 + s.j - 1, torch.ones(n_pairs))
        assert chisquare(counts.numpy()).pvalue > 1e-3


def test_pair_runs_and_pdist_order_describe_the_sample():
    from geolens.metrics._ranking.pairs import sample_pairs

    s = sample_pairs(700, 30_000, seed=2)  # three tiles a side
    first, starts, second = s.runs()
    assert starts[0] == 0 and starts[-1] == s.n_pairs and bool((np.diff(starts) > 0).all())
    lengths = np.diff(starts)
    np.testing.assert_array_equal(np.repeat(first, lengths), s.i.numpy())
    np.testing.assert_array_equal(second.astype(np.int64), s.j.numpy())
    assert bool((first[1:] != first[:-1]).all())  # maximal runs
    o = s.pdist_order()
    flat = (s.i * 700 + s.j).numpy()
    np.testing.assert_array_equal(flat[o], np.sort(flat))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sampled_cosines_in_tile_order_on_every_path(dtype, monkeypatch):
    """The compiled loop (split over the workers, and in one thread) and the CSR product (the CUDA path,
    run here on the CPU) give each pair its own cosine, in the sample's (tile) order: a direct formula."""
    from geolens.metrics._ranking import products
    from geolens.metrics._ranking.pairs import sample_pairs
    from geolens.metrics._ranking.products import pair_negated_cosines
    from geolens.metrics._ranking.products import sampled_dots as _sampled_dots

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 600, 9, generator=g, dtype=torch.float64)
    s = sample_pairs(600, 100_000, seed=4)
    unit = x / x.norm(dim=-1, keepdim=True)
    ref = -(unit[:, s.i] * unit[:, s.j]).sum(-1)
    tol = dict(rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-13)
    torch.testing.assert_close(pair_negated_cosines(x.to(dtype), s).double(), ref, **tol)  # split over the workers
    torch.testing.assert_close(_sampled_dots(unit.to(dtype), s).double(), ref, **tol)
    monkeypatch.setattr(products, "_PARALLEL_PAIRS", 10**9)
    torch.testing.assert_close(pair_negated_cosines(x.to(dtype), s).double(), ref, **tol)  # one thread


def test_pair_negated_cosines_equal_the_condensed_ones():
    from geolens.metrics._ranking.pairs import sample_pairs
    from geolens.metrics._ranking.products import pair_negated_cosines
    from geolens.metrics.distances import negated_cosines

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, 5, generator=g, dtype=torch.float64)
    s = sample_pairs(40, 300, seed=1)
    full = negated_cosines(x)  # [3, 780]
    torch.testing.assert_close(pair_negated_cosines(x, s), full[:, s.i * 40 - s.i * (s.i + 1) // 2 + s.j - s.i - 1])
    with pytest.raises(ValueError, match="zero norm"):
        pair_negated_cosines(torch.zeros(40, 5), s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_negated_cosine_upper_is_the_gram_above_the_diagonal(dtype):
    """The BLAS syrk triangle equals scipy's cosine distances (minus one) above the diagonal, into a reused buffer."""
    from geolens.metrics._ranking.products import negated_cosine_upper
    from geolens.metrics.distances import negated_cosine_gram

    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 50, 6, generator=g, dtype=dtype)
    buffer = torch.full((3, 50, 50), float("nan"), dtype=dtype)
    out = negated_cosine_upper(x, out=buffer)
    assert out.data_ptr() == buffer.data_ptr()
    i, j = torch.triu_indices(50, 50, offset=1)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    for b in range(3):
        np.testing.assert_allclose(out[b, i, j].double().numpy(), pdist(x[b].double().numpy(), "cosine") - 1.0, atol=tol)
    torch.testing.assert_close(out[:, i, j], negated_cosine_gram(x)[:, i, j], atol=tol, rtol=0)
    with pytest.raises(ValueError, match="out must be"):
        negated_cosine_upper(x, out=torch.empty(3, 50, 49, dtype=dtype))
