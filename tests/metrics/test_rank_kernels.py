"""The CPU float32 rank kernel and the torch kernel give the same numbers, ties and signed zeros included."""

import pytest
import torch

from geolens.metrics._rank_kernels import FullRanks, _ranked_dots_numpy, _ranked_dots_torch
from geolens.metrics.distances import condensed_indices, rank_data


@pytest.mark.parametrize("full_ties", [False, True])
@pytest.mark.parametrize("coarse", [False, True])
def test_numpy_and_torch_kernels_agree(coarse, full_ties):
    """Ties in the rows (coarse values) and in the full space (the kernel then gathers the full ranks
    instead of reading them off the keys' positions)."""
    g = torch.Generator().manual_seed(0)
    n = 40
    mats = torch.randn(3, n, n, generator=g)
    if coarse:  # many exact ties, and both signed zeros
        mats = torch.round(mats * 2) / 2
        mats[0, 0, 1:5] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    idx = condensed_indices(n)
    values = torch.randn(idx.numel(), generator=g, dtype=torch.float64)
    if full_ties:
        values = torch.round(values * 4)
    full = rank_data(values)
    full = full - full.mean()
    ranks = FullRanks.from_centred(full)
    assert ranks.has_ties == full_ties and torch.equal(ranks.centred(), full)
    dots_np, sq_np = _ranked_dots_numpy(mats.flatten(-2), idx, ranks)
    dots_t, sq_t = _ranked_dots_torch(mats.flatten(-2).index_select(-1, idx), full)
    torch.testing.assert_close(dots_np, dots_t, rtol=1e-12, atol=1e-6)
    torch.testing.assert_close(sq_np, sq_t, rtol=1e-12, atol=1e-6)
    # Direct formula from average ranks.
    ranks = rank_data(mats.flatten(-2).index_select(-1, idx).double())
    centred = ranks - ranks.mean(-1, keepdim=True)
    torch.testing.assert_close(dots_np, centred @ full, rtol=1e-12, atol=1e-6)
    torch.testing.assert_close(sq_np, centred.pow(2).sum(-1), rtol=1e-12, atol=1e-6)


@pytest.mark.parametrize("coarse", [False, True])
def test_sampled_kernels_agree(coarse):
    """The sampled-pair statistics (dots, squared norms, influence block sums) of the NumPy and torch kernels."""
    from geolens.metrics._rank_kernels import SampledRanks, _sampled_torch

    g = torch.Generator().manual_seed(1)
    p, n_blocks = 3000, 7
    values = torch.randn(4, p, generator=g)
    if coarse:
        values = torch.round(values * 4) / 4
        values[0, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    full_values = torch.randn(p, generator=g, dtype=torch.float64)
    if coarse:
        full_values = torch.round(full_values * 8) / 8
    full = rank_data(full_values)
    full = full - full.mean()
    full_order = torch.argsort(full_values)
    blocks = torch.randint(0, n_blocks, (p,), generator=g)
    got = SampledRanks(full, full_order, blocks, n_blocks).stats(values)  # float32 on the CPU: the NumPy kernel
    ref = _sampled_torch(values.double(), full, full_order, blocks, n_blocks)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-6)
    # Direct formula of phi (ties: average ranks, ">=" counts every tied value).
    if True:
        u = (full + (p + 1) / 2) / p
        for row in range(4):
            v = rank_data(values[row].double()) / p
            a = torch.tensor([v[full_values >= full_values[q]].sum() for q in range(p)], dtype=torch.float64) / p
            c = torch.tensor([u[values[row] >= values[row, q]].sum() for q in range(p)], dtype=torch.float64) / p
            phi = torch.zeros(n_blocks, dtype=torch.float64).index_add_(0, blocks, u * v + a + c)
            torch.testing.assert_close(got[2][row], phi, rtol=1e-10, atol=1e-8)


def test_tie_corrections_by_chunks_of_runs():
    """Tie groups are corrected a chunk of whole runs at a time (bounded memory): any chunk size, same numbers."""
    import numpy as np

    from geolens.metrics._rank_kernels import _Scratch, _sort_keys, _tie_terms

    g = torch.Generator().manual_seed(2)
    row = (torch.round(torch.randn(5000, generator=g) * 3) / 3).numpy()  # long runs of ties
    full = torch.randn(5000, generator=g, dtype=torch.float64).numpy()
    buf = _Scratch().buffers(5000)
    packed = _sort_keys(row, None, buf).copy()
    ref = _tie_terms(packed, full, buf)
    for chunk in (1, 7, 100, 4999):
        np.testing.assert_allclose(_tie_terms(packed, full, buf, chunk=chunk), ref, rtol=1e-12)
