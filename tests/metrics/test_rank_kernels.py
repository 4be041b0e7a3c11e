"""The CPU float32 rank kernel and the torch kernel give the same numbers, ties and signed zeros included."""

import numpy as np
import pytest
import torch

from geolens.metrics._ranking import cpu, torch_kernel
from geolens.metrics._ranking.pool import inline
from geolens.metrics._ranking.ranks import FullRanks
from geolens.metrics.distances import condensed_indices, rank_data

_ranked_dots_numpy = cpu.ranked_dots  # the compiled kernel on given rows
_ranked_dots_torch = torch_kernel.ranked_dots  # the torch kernel, ties handled on the host
_sampled_torch = torch_kernel._sampled_torch


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


@pytest.fixture(params=["radix", "numpy", "numpy chunks"])
def sort_kind(request, monkeypatch):
    """The sampled rows' sort every way, whichever this CPU would take: the compiled radix sort scoring bucket
    by bucket, or NumPy's sort of the whole keys then one scoring pass (cpu.vector_sort), row by row in the
    rank pool or, where the calling thread runs the pool's jobs itself (a resample's), a chunk of rows a call."""
    monkeypatch.setattr(cpu, "vector_sort", lambda: request.param != "radix")
    if request.param != "numpy chunks":
        yield request.param
        return
    monkeypatch.setattr(cpu, "_CHUNK_KEYS", 2 * 3000)  # chunks of two rows (and one) in the tests below
    calls = []
    chunks = cpu._sampled_chunks
    monkeypatch.setattr(cpu, "_sampled_chunks", lambda *args: calls.append(args[0]) or chunks(*args))
    with inline():
        yield request.param
    assert calls  # the chunked path ran


@pytest.mark.parametrize("coarse", [False, True])
def test_sampled_kernels_agree(coarse, sort_kind):
    """The sampled-pair statistics (dots, squared norms, influence block sums) of the NumPy and torch kernels."""
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
    ranks = FullRanks.from_centred(full)
    assert ranks.has_ties == coarse
    got = cpu.SampledRanks(ranks, blocks, n_blocks).stats(values)  # float32 on the CPU: the compiled kernel
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



def test_long_runs_of_ties_and_signed_zeros():
    """Rows that are mostly ties (few distinct values, both zeros): the compiled pass against average ranks."""
    g = torch.Generator().manual_seed(2)
    n = 120
    mats = torch.round(torch.randn(2, n, n, generator=g) * 2) / 3
    mats[1] = torch.where(mats[1] == 0, torch.tensor(-0.0), mats[1])  # -0.0 and +0.0 are one value
    mats[1, ::2] = torch.where(mats[1, ::2] == -0.0, torch.tensor(0.0), mats[1, ::2])
    idx = condensed_indices(n)
    full = rank_data(torch.randn(idx.numel(), generator=g, dtype=torch.float64))
    full = full - full.mean()
    dots, sq = _ranked_dots_numpy(mats.flatten(-2), idx, FullRanks.from_centred(full))
    ranks = rank_data(mats.flatten(-2).index_select(-1, idx).double())
    centred = ranks - ranks.mean(-1, keepdim=True)
    assert torch.unique(ranks[0]).numel() < 30  # a few tie groups of hundreds of pairs each
    torch.testing.assert_close(dots, centred @ full, rtol=1e-12, atol=1e-6)
    torch.testing.assert_close(sq, centred.pow(2).sum(-1), rtol=1e-12, atol=1e-6)


def test_sampled_pairs_path_equals_the_values_path():
    """``submit_pairs`` (values made per row inside the compiled kernel) equals ``submit`` on the same values."""
    from geolens.metrics._ranking.pairs import sample_pairs
    from geolens.metrics._ranking.products import pair_negated_cosines

    g = torch.Generator().manual_seed(3)
    coords = torch.randn(3, 200, 8, generator=g)
    pairs = sample_pairs(200, 4000, seed=1)
    full = rank_data(torch.randn(pairs.n_pairs, generator=g, dtype=torch.float64))
    ranks = cpu.SampledRanks(FullRanks.from_centred(full - full.mean()), torch.arange(pairs.n_pairs) % 5, 5)
    values = pair_negated_cosines(coords, pairs)
    fused, plain = ranks.submit_pairs(coords, pairs)(), ranks.stats(values)
    rank_of = rank_data(values.double())
    assert not torch.equal(rank_of[0], rank_of[1])
    for a, b in zip(fused, plain):  # the same compiled pair products both ways: the same values
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    ref = torch_kernel.SampledRanks(FullRanks.from_centred(full - full.mean()), torch.arange(pairs.n_pairs) % 5, 5,
                                    host=True)
    for a, b in zip(ref.submit_pairs(coords.double(), pairs)(), ref.stats(pair_negated_cosines(coords.double(), pairs))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-9)  # float64: the torch kernel both ways


def test_dense_tie_ranks_match_scipy_on_heavily_tied_rows():
    """The accelerator's tie bookkeeping (dense passes on the device) against scipy's average ranks."""
    from scipy.stats import rankdata

    from geolens.metrics._ranking.torch_kernel import _centred_average_ranks_dense

    g = torch.Generator().manual_seed(0)
    for m, levels in ((1, 1), (2, 1), (7, 2), (300, 5), (1000, 997)):
        values = torch.randint(0, levels, (3, m), generator=g).float().sort(-1).values
        expected = torch.from_numpy(rankdata(values.numpy(), axis=-1)) - (m + 1) / 2.0
        assert torch.equal(_centred_average_ranks_dense(values), expected), (m, levels)


def test_dense_tie_branch_gives_the_host_branchs_pga():
    """The branch CUDA takes (ties found on the device), chosen on the CPU by a backend object: the same
    PGA. Repeated rows make many exactly tied distances (as float32 rounding does at large N)."""
    from geolens.metrics import random_subspaces, subspace_pga
    from geolens.metrics._ranking.select import TorchBackend, select_backend

    g = torch.Generator().manual_seed(3)
    h = (torch.randn(60, 12, generator=g, dtype=torch.float64) * torch.linspace(2.0, 0.5, 12, dtype=torch.float64))
    h = h[torch.randint(0, 60, (160,), generator=g)]
    readout = torch.linalg.qr(torch.randn(12, 3, generator=g, dtype=torch.float64))[0]
    nulls = random_subspaces(12, 3, 10, seed=0, dtype=torch.float64)
    host = subspace_pga(h, readout, null_subspaces=nulls)  # float64 on the CPU: torch, ties one by one
    assert select_backend(device="cpu", dtype=h.dtype, n_values=160 * 159 // 2) == TorchBackend(host=True, dense_ties=False)
    dense = subspace_pga(h, readout, null_subspaces=nulls, backend=TorchBackend(host=True, dense_ties=True))
    torch.testing.assert_close(dense.null_rhos, host.null_rhos, rtol=0, atol=1e-12)
    assert dense.rho_readout == pytest.approx(host.rho_readout, abs=1e-12)


@pytest.mark.parametrize("low, high", [(-(2**63), 2**63 - 1), (0, 2**40), (-(5 << 32), 5 << 32)])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 5000])
def test_radix_sort_by_high_bits_equals_a_stable_numpy_sort(n, low, high):
    """The CPU kernel's sort: by the signed high 32 bits, stable; digits every key shares are skipped
    (the narrow ranges), and the result may come back in either buffer."""
    _check_radix_sort(np.random.default_rng(n).integers(low, high, n, dtype=np.int64) if n else np.zeros(0, np.int64))


def _float_keys(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.int32).astype(np.int64)
    ordered = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered << 32) | np.random.default_rng(0).integers(0, 2**32, values.size)


def _check_radix_sort(keys: np.ndarray) -> None:
    from geolens.metrics._ranking import compiled as _compiled

    expected = keys[np.argsort(keys >> 32, kind="stable")]
    counts = np.zeros(_compiled.RADIX_PASSES << _compiled.RADIX_BITS, np.int64)
    result = _compiled.sort_by_high_bits(keys.copy(), np.empty_like(keys), counts)
    assert np.array_equal(result, expected)


@pytest.mark.parametrize("case", ["cosines", "near -1", "grid ties", "one value", "narrow", "wide"])
def test_radix_sort_on_large_rows_of_every_shape(case):
    """Rows large enough that the top digit's buckets are sorted by counting passes (not insertion): values
    spread over both signs, all in one top-11-bit bucket (the top digit is taken below their common
    bits), heavy ties, a single value, a 12-bit range (one inner pass) and uniform 64-bit keys."""
    rng = np.random.default_rng(5)
    n = 200_000
    if case == "cosines":
        keys = _float_keys(rng.normal(0.0, 0.2, n))
    elif case == "near -1":  # states with a common offset: every value shares its sign, exponent and more
        keys = _float_keys(-1.0 + np.abs(rng.normal(0.0, 1e-3, n)))
    elif case == "grid ties":
        keys = _float_keys(rng.integers(0, 40, n) / 7.0)
    elif case == "one value":
        keys = _float_keys(np.full(n, 0.25))
    elif case == "narrow":
        keys = (rng.integers(1000, 1000 + 4096, n) << 32) | rng.integers(0, 2**32, n)
    else:
        keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    _check_radix_sort(keys)


@pytest.mark.parametrize("coarse", [False, True])
def test_whole_subspace_tasks_give_the_batched_kernels_numbers(coarse):
    """``subspace_ranked_dots`` (projection, BLAS triangle and ranks in one pool task per subspace) against
    the batched path (``negated_cosine_upper`` of all projections, then ``_ranked_dots_numpy``), and
    against average ranks computed directly; a zero projected row raises the cosine's error."""
    from geolens.metrics._ranking.cpu import subspace_ranked_dots
    from geolens.metrics._ranking.products import negated_cosine_upper

    g = torch.Generator().manual_seed(1)
    n, d, k = 60, 12, 3
    states = torch.randn(n, d, generator=g) + 0.5
    if coarse:  # a grid: many exactly tied projected distances
        states = torch.randint(1, 4, (n, d), generator=g).float()
    bases = torch.linalg.qr(torch.randn(5, d, k, generator=g))[0]
    if coarse:
        bases[0] = torch.eye(d)[:, :k]
    idx = condensed_indices(n)
    full = rank_data(torch.randn(idx.numel(), generator=g, dtype=torch.float64))
    ranks = FullRanks.from_centred(full - full.mean())
    dots, sq = subspace_ranked_dots(states, bases, idx, ranks)
    matrices = negated_cosine_upper(states @ bases)
    dots_ref, sq_ref = _ranked_dots_numpy(matrices.flatten(-2), idx, ranks)
    direct = rank_data(matrices.flatten(-2).index_select(-1, idx).double())
    centred = direct - direct.mean(-1, keepdim=True)
    for got, batched, formula in ((dots, dots_ref, centred @ ranks.centred()), (sq, sq_ref, centred.pow(2).sum(-1))):
        # The projections come from another BLAS call, so exact ties may fall an ulp apart on some kernels.
        torch.testing.assert_close(got, batched, rtol=1e-5, atol=1e-3 * float(sq_ref.max()))
        torch.testing.assert_close(got, formula, rtol=1e-5, atol=1e-3 * float(sq_ref.max()))
    assert dots.shape == (5,) and (sq > 0).all()
    states[7] = 0.0
    with pytest.raises(ValueError, match="zero norm"):
        subspace_ranked_dots(states, bases, idx, ranks)


@pytest.mark.parametrize("case", ["cosines", "near -1", "grid ties", "one value", "wide"])
@pytest.mark.parametrize("full_ties", [False, True])
def test_fused_sort_and_score_agrees_with_the_torch_kernel_in_every_sort_mode(case, full_ties, sort_kind):
    """The compiled kernel (each bucket of the sort scored right after it is sorted) against the torch
    kernel, on rows long enough for every mode of the sort: buckets of a top digit over both signs, a top
    digit taken below bits every value shares, heavy ties, one value, and the plain LSD sort for thinly
    spread values; with and without ties in the full space."""
    rng = np.random.default_rng(11)
    p, n_blocks = 60_000, 20
    values = {"cosines": rng.normal(0.0, 0.2, p), "near -1": -1.0 + np.abs(rng.normal(0.0, 1e-3, p)),
              "grid ties": rng.integers(0, 40, p) / 7.0, "one value": np.full(p, 0.25),
              "wide": rng.uniform(-1e30, 1e30, p)}[case]
    values = torch.from_numpy(values.astype(np.float32)).unsqueeze(0)
    full_values = torch.from_numpy(rng.normal(size=p))
    if full_ties:
        full_values = torch.round(full_values * 3)
    full = rank_data(full_values)
    full = full - full.mean()
    blocks = torch.from_numpy(rng.integers(0, n_blocks, p))
    ranks = FullRanks.from_centred(full)
    assert ranks.has_ties == full_ties
    got = cpu.SampledRanks(ranks, blocks, n_blocks).stats(values)  # float32 on the CPU: the compiled kernel
    ref = _sampled_torch(values.double(), full, torch.argsort(full_values), blocks, n_blocks)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-6)
