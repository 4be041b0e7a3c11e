"""The PGA z of a text resample from a layer's statistics made once (geolens.metrics.resampling), against
the plain steps on the resample's own rows: centre, CCR by SVD, cosine distances, Spearman."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

from geolens.metrics import random_subspaces
from geolens._validation import DegenerateError
from geolens.metrics import resampling
from geolens.metrics.preprocess import check_spread
from geolens.metrics._ranking.products import resampled_negated_cosines
from geolens.metrics.resampling import LayerResampler, resample_pairs, resampled_z, text_resamples


def plain_z(rows: np.ndarray, source: np.ndarray, subspaces: np.ndarray, m: int, pairs=None) -> float:
    """z of resampled rows by numpy and scipy on the resample's own rows (pairs of a row with its copy left out;
    ``pairs``: only those positions of the pdist order)."""
    c = rows - rows.mean(0)
    if m:
        vt = np.linalg.svd(c, full_matrices=False)[2][:m]
        c = c - c @ vt.T @ vt
    _, first_copy, inverse = np.unique(source, return_index=True, return_inverse=True)
    c = c[first_copy][inverse]  # copies bit for bit equal (a product may round two equal rows apart)
    # (the clouds here have no two equal rows of different sources)
    i, j = np.triu_indices(len(rows), 1)
    keep = source[i] != source[j]
    full = pdist(c, "cosine")[keep]
    rhos = np.array([spearmanr(full, pdist(c @ q, "cosine")[keep]).statistic for q in subspaces])
    return float((rhos[0] - rhos[1:].mean()) / rhos[1:].std(ddof=1))


def clouds(dtype, n_texts=14, per_text=6, d=12, k=3, n_null=10, seed=0):
    """Texts of correlated rows (a topic per text plus noise) with a dominant direction and an offset, as a
    residual stream has; the subspaces (readout first) and the rows' text index."""
    g = torch.Generator().manual_seed(seed)
    topics = torch.randn(n_texts, d, generator=g, dtype=torch.float64)
    rows = topics.repeat_interleave(per_text, 0) + 0.7 * torch.randn(n_texts * per_text, d, generator=g,
                                                                      dtype=torch.float64)
    rows = rows * torch.linspace(3, 0.5, d, dtype=torch.float64) + 5.0
    readout = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))[0]
    subspaces = torch.cat([readout[None], random_subspaces(d, k, n_null, seed=seed + 1, dtype=torch.float64)])
    return rows.to(dtype), subspaces.to(dtype), torch.arange(n_texts).repeat_interleave(per_text)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-8), (torch.float32, 2e-3)])
def test_a_resample_with_copies_equals_scipy_on_its_own_rows(dtype, tol):
    rows, subspaces, texts = clouds(dtype)
    layer = LayerResampler(rows, subspaces)
    resamples = text_resamples(texts, 4, seed=1)
    assert all(len(set(r.tolist())) < len(r) for r in resamples)  # every resample holds copies
    for source in resamples:
        got = layer.z(source, resample_pairs(source), [0, 1, 4])
        for m, value in zip((0, 1, 4), got):
            expected = plain_z(rows.double().numpy()[source.numpy()], source.numpy(), subspaces.double().numpy(), m)
            assert value == pytest.approx(expected, abs=tol)


def test_text_gram_matrices_give_the_resamples_z_and_step_aside_for_other_rows():
    rows, subspaces, texts = clouds(torch.float32)
    plain = LayerResampler(rows, subspaces)
    by_text = LayerResampler(rows, subspaces, texts=texts)
    assert by_text.text_grams is not None and plain.text_grams is None
    resamples = text_resamples(texts, 4, seed=3)
    pairs = [resample_pairs(source) for source in resamples]
    many = list(by_text.z_many(resamples, pairs.__getitem__, [0, 1, 4]))
    for source, p, got in zip(resamples, pairs, many):
        counts = by_text.text_counts(source)
        assert counts is not None and float(counts.sum()) == texts.unique().numel()
        assert got == pytest.approx(plain.z(source, p, [0, 1, 4]), abs=1e-4)  # float32 rounding of the CCR rows
        for m, value in zip((0, 1, 4), got):
            expected = plain_z(rows.double().numpy()[source.numpy()], source.numpy(), subspaces.double().numpy(), m)
            assert value == pytest.approx(expected, abs=2e-3)
    part = torch.cat([resamples[0], torch.tensor([0])])  # one row of a text drawn once more than its text
    assert by_text.text_counts(part) is None
    assert by_text.z(part, resample_pairs(part), [1]) == pytest.approx(plain.z(part, resample_pairs(part), [1]))
    # Float64 rows rank by the SVD of the rows; their text Gram matrices are not made.
    assert LayerResampler(rows.double(), subspaces.double(), texts=texts).text_grams is None
    with pytest.raises(ValueError, match="texts must give the text of each"):
        LayerResampler(rows, subspaces, texts=texts[:-1])


def test_sampled_pairs_rank_the_same_pairs_as_the_rows_themselves():
    rows, subspaces, texts = clouds(torch.float64, n_texts=30, per_text=8)
    source = text_resamples(texts, 1, seed=2)[0]
    pairs = resample_pairs(source, 4000, seed=3)
    assert not pairs.exact
    # The same pairs on the resample's rows written out, every row its own: the products of two copies may
    # round apart there, which splits a few ties between their pairs (a rank moves by 1/2).
    gathered = resampled_z(rows[source], subspaces, [0, 2], pairs)
    assert layer_z(rows, subspaces, source, pairs) == pytest.approx(gathered, abs=1e-5)


def layer_z(rows, subspaces, source, pairs):
    return LayerResampler(rows, subspaces).z(source, pairs, [0, 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_loop_and_the_torch_gathers_give_the_same_values(dtype):
    rows, subspaces, texts = clouds(dtype)
    layer = LayerResampler(rows, subspaces)
    source = text_resamples(texts, 1, seed=0)[0]
    pairs = resample_pairs(source, 1000, seed=0)
    x = layer.x[source]
    delta = x.mean(0)
    vh = torch.linalg.svd(x - delta, full_matrices=False)[2][:4]
    comps = (layer.x - delta) @ vh.T
    terms = layer._resampled_rows(delta, vh, comps, [0, 1, 4], torch.arange(rows.shape[0]))
    first, second = source[pairs.i], source[pairs.j]
    host = resampled_negated_cosines(terms, first, second, 0, subspaces.shape[0], host=True)
    gathers = resampled_negated_cosines(terms, first, second, 0, subspaces.shape[0], host=False)
    assert host.dtype == dtype and host.shape == (3, subspaces.shape[0], pairs.n_pairs)
    # The compiled loop sums a float32 pair's k-long dot in float32 (the gathers in float64): after a removal
    # that cancels most of a row, that rounding shows at the float32 coordinates' own scale (below).
    torch.testing.assert_close(host, gathers, rtol=0, atol=1e-12 if dtype == torch.float64 else 5e-5)
    # Against the cosines of the processed rows themselves.
    for c, m in enumerate((0, 1, 4)):
        processed = (layer.x - delta) - ((layer.x - delta) @ vh[:m].T) @ vh[:m]
        coords = processed.to(dtype) @ subspaces
        unit = coords / coords.norm(dim=-1, keepdim=True)
        direct = -(unit[:, first] * unit[:, second]).sum(-1)
        torch.testing.assert_close(host[c], direct, rtol=0, atol=1e-10 if dtype == torch.float64 else 1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_row_terms_and_the_torch_products_agree(dtype):
    rows, subspaces, texts = clouds(dtype)
    layer = LayerResampler(rows, subspaces)
    source = text_resamples(texts, 1, seed=1)[0]
    x = layer.x[source]
    delta = x.mean(0)
    vh = torch.linalg.svd(x - delta, full_matrices=False)[2][:4]
    comps = (layer.x - delta) @ vh.T
    used = torch.unique(source)
    captured = {}
    original = resampling.resampled_row_terms

    def spy(*args, **kwargs):
        captured["args"] = args
        return original(*args, **kwargs)

    resampling.resampled_row_terms = spy
    try:
        layer._resampled_rows(delta, vh, comps, [0, 1, 4], used)
    finally:
        resampling.resampled_row_terms = original
    host = original(*captured["args"], host=True)
    gathers = original(*captured["args"], host=False)
    assert host.shape == gathers.shape == (subspaces.shape[0], rows.shape[0], 1 + 3 + 5)
    torch.testing.assert_close(host[:, used], gathers[:, used], rtol=1e-10, atol=1e-12)
    unused = torch.ones(rows.shape[0], dtype=torch.bool)
    unused[used] = False
    assert bool((host[:, unused] == 0).all())  # terms are made for the rows the pairs use only
    # A zero row after the removal raises on both paths.
    args = list(captured["args"])
    args[2] = torch.zeros_like(args[2])  # |p_i|^2 = 0: every row at zero norm
    for on_host in (True, False):
        with pytest.raises(ValueError, match="zero norm"):
            original(*args, host=on_host)


def test_pairs_of_identical_rows_get_identical_values():
    rows, subspaces, texts = clouds(torch.float32)
    rows[7] = rows[30]  # two texts share a row, as texts that open with the same token do
    layer = LayerResampler(rows, subspaces)
    assert int(layer.canonical[30]) == 7 and int(layer.canonical[31]) == 31  # equal rows are one captured row
    source = torch.arange(rows.shape[0])
    x = layer.x
    vh = torch.linalg.svd(x - x.mean(0), full_matrices=False)[2][:2]
    terms = layer._resampled_rows(x.mean(0), vh, (x - x.mean(0)) @ vh.T, [0, 2], torch.arange(rows.shape[0]))
    others = torch.tensor([1, 12, 50, 60])
    values = resampled_negated_cosines(terms, torch.cat([torch.full((4,), 7), others]),
                                       torch.cat([others, torch.full((4,), 30)]), 0, subspaces.shape[0])
    assert torch.equal(values[..., :4], values[..., 4:])  # (7, j) and (j, 30): bit for bit
    assert len(source) == rows.shape[0]


def test_degenerate_resamples_give_nan_not_an_error():
    rows, subspaces, texts = clouds(torch.float64, n_texts=6, per_text=4, d=6, k=2, n_null=5)
    flat = rows.clone()
    flat[:] = flat[0]  # every row the same: no spread
    source = torch.arange(24)
    assert all(math.isnan(v) for v in resampled_z(flat, subspaces, [0, 1], resample_pairs(source)))
    line = rows[:, :1] * torch.tensor([[1.0, 2.0, 0, 0, 0, 0]], dtype=torch.float64)  # one direction only
    z = resampled_z(line, subspaces, [0, 1], resample_pairs(source))
    assert all(math.isnan(v) for v in z)
    z = resampled_z(rows, subspaces, [0, 5, 23], resample_pairs(source))  # CCR-5 leaves 1 of d = 6 directions
    assert math.isfinite(z[0]) and math.isnan(z[1]) and math.isnan(z[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_resample_without_spread_at_its_dtype_has_no_z(dtype):
    """The spread check of a resample (check_spread's rule): rows that differ by their dtype's rounding only, and a
    resample of copies of one row, give NaN; a float32 resample takes it from the rows' squared norms."""
    rows, subspaces, texts = clouds(dtype, n_texts=6, per_text=4, d=6, k=2, n_null=5)
    layer = LayerResampler(rows, subspaces, texts=texts)
    copies = torch.full((24,), 5)
    assert all(math.isnan(v) for v in layer.z(copies, resample_pairs(torch.arange(24)), [0, 1]))
    near = torch.full((24, 6), 1000.0, dtype=dtype)
    rounding = 1000 * torch.finfo(dtype).eps  # a step of the dtype's rounding at 1000
    near[0, 0] += rounding
    source = torch.arange(24)
    assert all(math.isnan(v) for v in LayerResampler(near, subspaces).z(source, resample_pairs(source), [0, 1]))
    # The rule itself, both ways: check_spread's verdict on the resampled rows, re-centred.
    for step in (rounding, 1.0):
        near[0, 0] = 1000.0 + step
        checked = LayerResampler(near, subspaces)
        weights = torch.ones(24, dtype=torch.float64)
        delta = checked.x.mean(0)
        total = float((checked.x - delta).pow(2).sum())
        centred = checked.x - delta if dtype == torch.float64 else None
        try:
            check_spread(near, near.double() - near.double().mean(0), dtype=dtype, what="rows")
            expected = True
        except DegenerateError:
            expected = False
        assert checked._spread_ok(source, weights, total, centred) == expected == (step == 1.0)

