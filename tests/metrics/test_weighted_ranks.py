"""Spearman on weighted pairs (geolens.metrics.weighted_ranks): a resample's rhos without re-ranking.

Checked against scipy's Spearman on the pairs written out as many times as their weights say
(ties averaged), against re-ranked deletions for the jackknife replicates, and against the
unweighted sampled kernel with every weight 1.
"""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from geolens.metrics.bootstrap import text_counts, text_resamples
from geolens.metrics.pga import _jackknife_blocks, sample_pairs, sampled_rank_alignment
from geolens.metrics.weighted_ranks import SortedValues, pair_weights, weighted_rank_alignment
from geolens.metrics.grassmann import random_subspaces
from geolens.metrics.distances import unit_rows


def _written_out(x, y, w):
    rows = np.repeat(np.arange(x.size), w.astype(int))
    return spearmanr(x[rows], y[rows]).statistic


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_spearman_is_scipys_on_the_pairs_written_out_with_ties(seed):
    rng = np.random.default_rng(seed)
    p, s = 300, 6
    x = rng.normal(size=p)
    x[:40] = x[0]  # a block of ties in the full space (duplicated tokens at layer 0)
    y = rng.normal(size=(s, p)) + 0.4 * x
    y[2, 10:60] = y[2, 10]  # and in one subspace
    w = rng.integers(0, 4, size=(4, p)).astype(float)  # 0: a pair whose texts were not drawn
    blocks = torch.as_tensor(rng.integers(0, 8, size=p))
    rhos, deleted = weighted_rank_alignment(SortedValues(torch.tensor(x)[None]), SortedValues(torch.tensor(y)),
                                            torch.tensor(w), blocks, 8)
    assert tuple(deleted.shape) == (4, s, 8)
    for b in range(4):
        expected = [_written_out(x, y[k], w[b]) for k in range(s)]
        np.testing.assert_allclose(rhos[b].numpy(), expected, atol=1e-12)


def test_jackknife_replicates_follow_re_ranked_deletions_to_first_order():
    rng = np.random.default_rng(5)
    p, s, g = 6000, 4, 16
    x = rng.normal(size=p)
    y = rng.normal(size=(s, p)) + np.linspace(0.2, 1.5, s)[:, None] * x
    w = rng.integers(0, 3, size=(1, p)).astype(float)
    blocks = torch.as_tensor(rng.permutation(p) % g)
    rhos, deleted = weighted_rank_alignment(SortedValues(torch.tensor(x)[None]), SortedValues(torch.tensor(y)),
                                            torch.tensor(w), blocks, g)
    moves, errors = [], []
    for block in range(g):
        kept = w[0] * (blocks.numpy() != block)
        exact = np.array([_written_out(x, y[k], kept) for k in range(s)])
        moves.append(np.abs(exact - rhos[0].numpy()))
        errors.append(np.abs(exact - deleted[0, :, block].numpy()))
    assert np.mean(errors) < 0.05 * np.mean(moves)  # a first-order replicate: a few % of the move it makes


def test_unit_weights_give_the_sampled_kernels_rhos_and_replicates():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(400, 12, dtype=torch.float64, generator=g) @ torch.randn(12, 12, dtype=torch.float64, generator=g)
    q = random_subspaces(12, 3, 6, seed=0, dtype=torch.float64)
    pairs = sample_pairs(400, 5000, seed=0)
    rhos, deleted = sampled_rank_alignment(h, q, pairs, seed=0, backend="torch")
    u, c = unit_rows(h), unit_rows(h @ q)
    full = (u[pairs.i] * u[pairs.j]).sum(1)[None]
    spaces = (c[:, pairs.i] * c[:, pairs.j]).sum(2)
    blocks, _ = _jackknife_blocks(pairs.n_pairs, 32, seed=0)
    got, got_deleted = weighted_rank_alignment(SortedValues(full), SortedValues(spaces),
                                               torch.ones(1, pairs.n_pairs, dtype=torch.float64), blocks, 32)
    torch.testing.assert_close(got[0], rhos, atol=1e-12, rtol=0)
    # The two differ only in the ranks' half-step convention (rank / P against (rank - 1/2) / P).
    move = (deleted - rhos[:, None]).abs().mean()
    assert float((got_deleted[0] - deleted).abs().max()) < 0.02 * float(move)


def test_pair_weights_count_the_copies_of_each_pair():
    counts = torch.tensor([[2, 0, 1], [1, 1, 1]])
    w = pair_weights(counts, torch.tensor([0, 0, 1]), torch.tensor([0, 2, 2]))
    assert w.tolist() == [[4.0, 2.0, 0.0], [1.0, 1.0, 1.0]]


def test_text_counts_are_the_text_resamples_counted():
    index = torch.tensor([3, 3, 0, 7, 7, 7, 9])
    texts, counts = text_counts(index, 30, seed=4)
    for picked, count in zip(text_resamples(index, 30, seed=4), counts):
        drawn = torch.bincount(texts[picked], minlength=4) // torch.bincount(texts, minlength=4)
        assert drawn.tolist() == count.tolist()
    assert bool((counts.sum(1) == 4).all())


def test_a_space_without_spread_under_a_weighting_gives_nan():
    x = torch.arange(5, dtype=torch.float64)[None]
    y = torch.tensor([[1.0, 1.0, 1.0, 2.0, 3.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)  # only the tied values weigh
    rhos, _ = weighted_rank_alignment(SortedValues(x), SortedValues(y), w, torch.zeros(5, dtype=torch.int64), 1)
    assert bool(torch.isnan(rhos).all())


def test_sorted_values_refuse_a_bad_shape():
    with pytest.raises(ValueError, match=r"values must be \[R, P\]"):
        SortedValues(torch.zeros(5))


def test_the_torch_path_gives_the_compiled_loops_numbers():
    from geolens.metrics import weighted_ranks

    rng = np.random.default_rng(3)
    p, s, b, g = 2000, 5, 3, 8
    x = torch.tensor(rng.normal(size=(1, p)))
    x[0, :100] = x[0, 0]
    y = torch.tensor(rng.normal(size=(s, p))) + 0.3 * x
    y[1, 50:90] = y[1, 50]
    w = torch.tensor(rng.integers(0, 4, size=(b, p)).astype(float))
    blocks = torch.as_tensor(rng.integers(0, g, size=p))
    full, spaces = SortedValues(x), SortedValues(y)
    rhos, deleted = weighted_rank_alignment(full, spaces, w, blocks, g)  # CPU: the compiled loops
    totals = w.sum(1)
    block_weights = torch.zeros(b, g, dtype=torch.float64).index_add_(1, blocks, w)
    for k in range(b):
        rho, replicates = weighted_ranks._one_weighting(full, spaces, w[k], totals[k], blocks, block_weights[k])
        torch.testing.assert_close(rho, rhos[k], atol=1e-12, rtol=0)
        torch.testing.assert_close(replicates, deleted[k], atol=1e-12, rtol=0)
