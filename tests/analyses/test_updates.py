"""geolens.updates end to end on the tiny models (sequential and parallel blocks)."""

import numpy as np
import pytest
import torch

from geolens.analyses.updates import UpdatesResult, updates
from geolens.capture import capture
from geolens.model import as_adapter
from tests.helpers import hook_count, padded_tokens, same_weights, weights


def _tokens(model):
    return padded_tokens(as_adapter(model).d_vocab, lengths=(16, 12, 16, 9))


def test_update_is_attn_plus_mlp(any_model):
    """Delta_l == attn_out_l + mlp_out_l for sequential and for parallel (GPT-NeoX) blocks."""
    tokens, mask = _tokens(any_model)
    states = capture(any_model, tokens, sites=("resid_post", "attn_out", "mlp_out"), attention_mask=mask,
                     progress=False)
    resid = states["resid_post"]
    torch.testing.assert_close(resid[1:] - resid[:-1], states["attn_out"] + states["mlp_out"], atol=1e-5, rtol=1e-5)


def test_updates_table_matches_numpy_on_captured_states(any_model):
    tokens, mask = _tokens(any_model)
    hooks, before = hook_count(any_model), weights(any_model)
    res = updates(any_model, tokens, n_tokens=30, seed=3, attention_mask=mask, progress=False)
    assert hook_count(any_model) == hooks and same_weights(before, any_model)
    assert isinstance(res, UpdatesResult)
    table = res.to_pandas()
    adapter = as_adapter(any_model)
    assert table.layer.tolist() == list(range(1, adapter.n_layers + 1))
    states = capture(any_model, tokens, sites=("resid_post", "attn_out", "mlp_out"), n_tokens=30, seed=3,
                     attention_mask=mask, progress=False)
    h = states["resid_post"].double().numpy()
    for l in range(1, adapter.n_layers + 1):
        prev, d = h[l - 1], h[l] - h[l - 1]
        row = table[table.layer == l].iloc[0]
        cos = np.abs((d * prev).sum(1)) / (np.linalg.norm(d, axis=1) * np.linalg.norm(prev, axis=1))
        assert row.orthogonality == pytest.approx(cos.mean(), rel=1e-4)
        assert row.update_norm == pytest.approx(np.linalg.norm(d, axis=1).mean(), rel=1e-4)
        a = states.layer("attn_out", l).double().numpy()
        m = states.layer("mlp_out", l).double().numpy()
        assert row.ffn_mha_ratio == pytest.approx((np.linalg.norm(m, axis=1) / np.linalg.norm(a, axis=1)).mean(),
                                                  rel=1e-4)
        s = np.linalg.svd(h[l], compute_uv=False)
        p = s / s.sum()
        assert row.erank_states == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-4)
    assert res.params["parallel_attn_mlp"] == adapter.parallel_attn_mlp
    fig = res.plot()
    assert len(fig.data) == 6
    assert "UpdatesResult" in repr(res)


def test_updates_rejects_too_few_tokens(native_bridge):
    tokens, mask = _tokens(native_bridge)
    with pytest.raises(ValueError, match="n_tokens"):
        updates(native_bridge, tokens, n_tokens=10_000, attention_mask=mask, progress=False)


def test_updates_of_captured_states_equal_those_of_the_tokens_and_bad_states_are_named(native_bridge):
    tokens, mask = _tokens(native_bridge)
    states = capture(native_bridge, tokens, sites=("resid_post", "attn_out", "mlp_out", "final"), n_tokens=30,
                     seed=3, attention_mask=mask, progress=False)
    direct = updates(native_bridge, tokens, n_tokens=30, seed=3, attention_mask=mask, progress=False)
    shared = updates(native_bridge, states, progress=False)
    assert shared.to_pandas().equals(direct.to_pandas()) and shared.params == direct.params
    with pytest.raises(ValueError, match="not 'mlp_out'"):
        updates(native_bridge, states.select(["resid_post", "attn_out"]), progress=False)
    some = capture(native_bridge, tokens, sites=("resid_post", "attn_out", "mlp_out"), layers=[1, 2], n_tokens=30,
                   attention_mask=mask, progress=False)
    with pytest.raises(ValueError, match="every layer of 'resid_post'"):
        updates(native_bridge, some, progress=False)


def test_the_report_scores_updates_on_its_shared_capture(native_bridge, monkeypatch, tmp_path):
    import sys

    import geolens.report
    from geolens.report import ReportRun, ReportSettings

    texts = ["the cat sat on the mat and looked at the door " * 3, "a dog ran in the park after a red ball " * 3,
             "rain fell on the old town all night long " * 3]
    settings = ReportSettings(n_tokens=40, progress=False)
    direct = updates(native_bridge, texts, n_tokens=40, seed=0, max_length=settings.max_length, progress=False)

    def no_capture(*args, **kwargs):
        raise AssertionError("the updates section captured states of its own")

    module = sys.modules["geolens.analyses.updates"]  # the package's name `updates` is the function
    monkeypatch.setattr(module, "capture", no_capture)
    run = ReportRun(as_adapter(native_bridge), texts, settings, sections=("pga", "updates"))
    assert run.shared_sites() == ("resid_post", "final", "attn_out", "mlp_out")
    result, _ = module.report_section(run, {})
    assert result.to_pandas().equals(direct.to_pandas())
    assert ReportRun(as_adapter(native_bridge), texts, settings, sections=("pga",)).shared_sites() == (
        "resid_post", "final")
    paths = geolens.report.report(native_bridge, texts, tmp_path, sections=["updates"], n_tokens=40, progress=False)
    assert "updates.csv" in paths
