"""The CPU float32 rank kernel and the torch kernel give the same numbers, ties and signed zeros included."""

import pytest
import torch

from geolens.metrics._rank_kernels import _ranked_dots_numpy, _ranked_dots_torch
from geolens.metrics.distances import condensed_indices, rank_data


@pytest.mark.parametrize("coarse", [False, True])
def test_numpy_and_torch_kernels_agree(coarse):
    g = torch.Generator().manual_seed(0)
    n = 40
    mats = torch.randn(3, n, n, generator=g)
    if coarse:  # many exact ties, and both signed zeros
        mats = torch.round(mats * 2) / 2
        mats[0, 0, 1:5] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    idx = condensed_indices(n)
    full = rank_data(torch.randn(idx.numel(), generator=g, dtype=torch.float64))
    full = full - full.mean()
    dots_np, sq_np = _ranked_dots_numpy(mats.flatten(-2), idx, full)
    dots_t, sq_t = _ranked_dots_torch(mats.flatten(-2).index_select(-1, idx), full)
    torch.testing.assert_close(dots_np, dots_t, rtol=1e-12, atol=1e-6)
    torch.testing.assert_close(sq_np, sq_t, rtol=1e-12, atol=1e-6)
    # Direct formula from average ranks.
    ranks = rank_data(mats.flatten(-2).index_select(-1, idx).double())
    centred = ranks - ranks.mean(-1, keepdim=True)
    torch.testing.assert_close(dots_np, centred @ full, rtol=1e-12, atol=1e-6)
    torch.testing.assert_close(sq_np, centred.pow(2).sum(-1), rtol=1e-12, atol=1e-6)
