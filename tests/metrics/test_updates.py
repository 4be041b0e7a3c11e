"""Pure update-geometry metrics against direct numpy formulas and planted answers."""

import numpy as np
import pytest
import torch

from geolens.metrics.updates import norm_ratio, update, update_norms, update_orthogonality, update_summary


def _np_erank(x):
    s = np.linalg.svd(x, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def test_orthogonality_norms_ratio_match_numpy():
    g = torch.Generator().manual_seed(0)
    prev, nxt = torch.randn(40, 7, generator=g, dtype=torch.float64), torch.randn(40, 7, generator=g, dtype=torch.float64)
    p, n = prev.numpy(), nxt.numpy()
    d = n - p
    cos = np.abs((d * p).sum(1)) / (np.linalg.norm(d, axis=1) * np.linalg.norm(p, axis=1))
    np.testing.assert_allclose(update_orthogonality(prev, nxt).numpy(), cos, rtol=1e-12)
    absolute, relative = update_norms(prev, nxt)
    np.testing.assert_allclose(absolute.numpy(), np.linalg.norm(d, axis=1), rtol=1e-12)
    np.testing.assert_allclose(relative.numpy(), np.linalg.norm(d, axis=1) / np.linalg.norm(p, axis=1), rtol=1e-12)
    np.testing.assert_allclose(norm_ratio(nxt, prev).numpy(), np.linalg.norm(n, axis=1) / np.linalg.norm(p, axis=1),
                               rtol=1e-12)
    torch.testing.assert_close(update(prev, nxt), nxt - prev)


def test_planted_orthogonal_and_parallel_updates():
    prev = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 1.0, 0.0]])
    delta = torch.tensor([[0.0, 5.0, 1.0], [0.0, -4.0, 0.0], [2.0, 2.0, 0.0]])
    torch.testing.assert_close(update_orthogonality(prev, prev + delta), torch.tensor([0.0, 1.0, 1.0]))
    absolute, relative = update_norms(prev, prev + delta)
    torch.testing.assert_close(absolute, torch.tensor([26 ** 0.5, 4.0, 8 ** 0.5]))
    torch.testing.assert_close(relative, torch.tensor([26 ** 0.5 / 3, 2.0, 2.0]))


def test_batched_layers_axis():
    x = torch.randn(3, 10, 4, generator=torch.Generator().manual_seed(1))
    out = update_orthogonality(x[:-1], x[1:])
    assert out.shape == (2, 10)
    torch.testing.assert_close(out[1], update_orthogonality(x[1], x[2]))


def test_bad_input_raises():
    x = torch.randn(5, 4)
    with pytest.raises(ValueError, match="same shape"):
        update_orthogonality(x, torch.randn(5, 3))
    with pytest.raises(ValueError, match="zero norm"):
        update_orthogonality(x, x.clone())  # zero update: no angle
    zero = x.clone()
    zero[2] = 0
    with pytest.raises(ValueError, match="zero norm"):
        update_norms(zero, x)
    with pytest.raises(ValueError, match="zero norm"):
        norm_ratio(x, zero)
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        update_norms(bad, x)
    with pytest.raises(TypeError, match="floating"):
        norm_ratio(torch.ones(2, 2, dtype=torch.long), x[:2])


def test_update_summary_matches_numpy_and_planted_rank():
    g = torch.Generator().manual_seed(2)
    resid = torch.randn(3, 30, 6, generator=g, dtype=torch.float64)
    attn, mlp = torch.randn(2, 30, 6, generator=g, dtype=torch.float64), torch.randn(2, 30, 6, generator=g, dtype=torch.float64)
    rows = update_summary(resid, attn, mlp)
    r = resid.numpy()
    for i, row in enumerate(rows):
        p, n = r[i], r[i + 1]
        d = n - p
        assert row["layer"] == i + 1
        assert row["orthogonality"] == pytest.approx(
            np.mean(np.abs((d * p).sum(1)) / (np.linalg.norm(d, axis=1) * np.linalg.norm(p, axis=1))), rel=1e-12)
        assert row["update_norm"] == pytest.approx(np.linalg.norm(d, axis=1).mean(), rel=1e-12)
        assert row["relative_update_norm"] == pytest.approx(
            (np.linalg.norm(d, axis=1) / np.linalg.norm(p, axis=1)).mean(), rel=1e-12)
        ratio = np.linalg.norm(mlp[i].numpy(), axis=1) / np.linalg.norm(attn[i].numpy(), axis=1)
        assert row["ffn_mha_ratio"] == pytest.approx(ratio.mean(), rel=1e-12)
        assert row["erank_states"] == pytest.approx(_np_erank(n), rel=1e-9)
        assert row["erank_updates"] == pytest.approx(_np_erank(d), rel=1e-9)
    # planted: states spanning exactly 2 equal directions have effective rank 2
    planted = torch.zeros(2, 8, 5, dtype=torch.float64)
    planted[0] = torch.randn(8, 5, generator=g, dtype=torch.float64)
    planted[1] = planted[0]
    planted[1, :4, 0] += 1.0
    planted[1, 4:, 1] += 1.0
    row = update_summary(planted)[0]
    assert row["erank_updates"] == pytest.approx(2.0, abs=1e-9)
    assert np.isnan(row["ffn_mha_ratio"])
    with pytest.raises(ValueError, match="L \\+ 1"):
        update_summary(torch.randn(1, 4, 3))
    with pytest.raises(ValueError, match="attn_out"):
        update_summary(resid, attn[:1], mlp)
