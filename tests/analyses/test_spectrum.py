"""geolens.spectrum / weight_geometry on the tiny fixtures: equal to the pure metrics on captured states."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
import torch

from geolens.analyses.spectrum import (
    METRICS,
    SpectrumResult,
    WeightGeometryResult,
    _spectrum_of_states,
    spectrum,
    weight_geometry,
)
from geolens.capture import capture
from geolens.metrics.spectral import spectral_summary
from geolens.model import as_adapter
from tests.helpers import hook_count, padded_tokens, same_weights, weights

FIT = (2, 20)


def _tokens(model):
    return padded_tokens(as_adapter(model).d_vocab, lengths=(40, 33, 40, 25), seed=1)


@pytest.mark.parametrize("centre", [True, False])
def test_spectrum_equals_pure_metrics_on_captured_states(any_model, centre):
    tokens, mask = _tokens(any_model)
    before, hooks = weights(any_model), hook_count(any_model)
    res = spectrum(any_model, tokens, attention_mask=mask, n_tokens=100, centre=centre, seed=3,
                   alpha_fit_range=FIT, progress=False)
    assert isinstance(res, SpectrumResult)
    states = capture(any_model, tokens, attention_mask=mask, n_tokens=100, seed=3, progress=False)
    table = res.to_pandas()
    assert table["layer"].tolist() == [0, 1, 2] and set(table["site"]) == {"resid_post"}
    assert list(table.columns) == ["layer", "site", *METRICS]
    for row in res.rows:
        ref = spectral_summary(states.layer("resid_post", row["layer"]), centre=centre, alpha_fit_range=FIT)
        for key, value in ref.items():
            assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (row["layer"], key)
    assert res.params["n_tokens"] == 100 and res.params["centre"] is centre
    assert hook_count(any_model) == hooks and same_weights(before, any_model)


def test_spectrum_sites_layers_and_plot(native_bridge):
    tokens, mask = _tokens(native_bridge)
    res = spectrum(native_bridge, tokens, site="mlp_out", layers=[2], attention_mask=mask, n_tokens=60,
                   alpha_fit_range=FIT, progress=False)
    assert res.to_pandas()[["layer", "site"]].values.tolist() == [[2, "mlp_out"]]
    fig = res.plot()
    assert isinstance(fig, go.Figure) and len(fig.data) == 7
    assert "SpectrumResult" in repr(res) and "<b>" in res._repr_html_()
    with pytest.raises(ValueError, match="unknown metrics"):
        res.plot(kind=["nope"])


def test_spectrum_same_seed_same_numbers_and_save(native_bridge, tmp_path):
    tokens, mask = _tokens(native_bridge)
    kw = dict(attention_mask=mask, n_tokens=80, alpha_fit_range=FIT, progress=False)
    a, b = spectrum(native_bridge, tokens, seed=5, **kw), spectrum(native_bridge, tokens, seed=5, **kw)
    assert a.rows == b.rows
    back = SpectrumResult.load(a.save(tmp_path / "s.json"))
    assert back.to_pandas().equals(a.to_pandas())


def test_spectrum_errors_name_the_layer(native_bridge):
    tokens, mask = _tokens(native_bridge)
    with pytest.raises(ValueError, match="resid_post layer 0: alpha-ReQ fit range"):
        spectrum(native_bridge, tokens, attention_mask=mask, n_tokens=80, alpha_fit_range=(5, 100),
                 progress=False)  # explicit (5, 100) > d = 32: raises; the default would be clipped
    with pytest.raises(ValueError, match="n_tokens"):
        spectrum(native_bridge, tokens, attention_mask=mask, n_tokens=10_000, alpha_fit_range=FIT, progress=False)


def test_spectrum_of_states_all_sites(native_bridge):
    tokens, mask = _tokens(native_bridge)
    states = capture(native_bridge, tokens, sites=("resid_post", "attn_out"), attention_mask=mask, n_tokens=60,
                     progress=False)
    res = _spectrum_of_states(states, alpha_fit_range=FIT, progress=False)
    assert [(r["site"], r["layer"]) for r in res.rows] == [("resid_post", 0), ("resid_post", 1), ("resid_post", 2),
                                                         ("attn_out", 1), ("attn_out", 2)]
    assert len(res.plot(kind=["effective_rank"]).data) == 2  # one line per site
    # the public spelling, geolens.spectrum(model, states, site=...), gives the same rows site by site
    for site in ("resid_post", "attn_out"):
        one = spectrum(native_bridge, states, site=site, alpha_fit_range=FIT, progress=False)
        assert one.rows == [r for r in res.rows if r["site"] == site]


def _reference_w_e(model):
    for get in (lambda: model.W_E, lambda: model.embed.W_E):
        try:
            return get().detach()
        except AttributeError:
            continue
    raise AssertionError("no W_E")


def test_weight_geometry(any_model):
    adapter = as_adapter(any_model)
    before = weights(any_model)
    res = weight_geometry(any_model, alpha_fit_range=FIT, progress=False)
    assert isinstance(res, WeightGeometryResult)
    table = res.to_pandas()
    assert table["matrix"].tolist() == ["W_U raw", "W_U folded", "W_E"]
    w_e = _reference_w_e(any_model)
    assert torch.equal(as_adapter(any_model).embedding_matrix(), w_e) and tuple(w_e.shape) == (adapter.d_vocab, adapter.d_model)
    refs = {
        "W_U raw": adapter.unembed_matrix("raw").T,
        "W_U folded": adapter.unembed_matrix("folded").T,
        "W_E": w_e,
    }
    for row in res.rows:
        ref = spectral_summary(refs[row["matrix"]], centre=False, alpha_fit_range=FIT)
        assert (row["rows"], row["cols"]) == (adapter.d_vocab, adapter.d_model)
        for key, value in ref.items():
            assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (row["matrix"], key)
    # ln_final is jittered in the fixtures, so folding changes the geometry of W_U.
    assert table.loc[0, "effective_rank"] != table.loc[1, "effective_rank"]
    assert isinstance(res.plot(), go.Figure)
    assert same_weights(before, any_model)


# ------------------------------------------------------------------ compare (PGA vs spectra)
def test_compare_joins_and_standardises(native_bridge):
    from geolens.analyses.compare import CompareResult, compare
    from geolens.analyses.pga import pga

    tokens, mask = _tokens(native_bridge)
    kw = dict(attention_mask=mask, n_tokens=80, progress=False)
    p = pga(native_bridge, tokens, k=8, n_null=10, ccr=[0, 1], **kw)
    s = spectrum(native_bridge, tokens, alpha_fit_range=FIT, **kw)
    cmp = compare(p, s)
    assert isinstance(cmp, CompareResult) and cmp.params["ccr"] == 0
    table = cmp.to_pandas()
    assert table["layer"].tolist() == [0, 1, 2]  # the PGA "final" row does not join resid_post layers
    pga_table = p.to_pandas()
    want = pga_table[(pga_table.site == "resid_post") & (pga_table.ccr == 0)]["z"].tolist()
    assert table["pga_z"].tolist() == pytest.approx(want)
    assert table["effective_rank"].tolist() == pytest.approx(s.to_pandas()["effective_rank"].tolist())
    for col in cmp.columns:
        x = table[col]
        assert table[col + "_sd"].tolist() == pytest.approx(((x - x.mean()) / x.std(ddof=1)).tolist())
        assert cmp.params["range"][col] == pytest.approx(x.max() - x.min())
    assert "isotropy" not in cmp.columns and "log_isotropy" in cmp.columns
    one = compare(p, s, ccr=1)
    assert one.to_pandas()["pga_z"].tolist() == pytest.approx(
        pga_table[(pga_table.site == "resid_post") & (pga_table.ccr == 1)]["z"].tolist())
    fig = cmp.plot()
    assert isinstance(fig, go.Figure) and len(fig.data) == len(cmp.columns)
    with pytest.raises(ValueError, match="ccr=5"):
        compare(p, s, ccr=5)
    with pytest.raises(ValueError, match="unknown spectral metrics"):
        compare(p, s, metrics=["nope"])
    with pytest.raises(TypeError):
        compare("p", s)


def test_compare_flat_column_and_layer_mismatch():
    import pandas as pd

    from geolens.analyses.compare import compare

    p = pd.DataFrame({"layer": [0, 1, 2], "site": "resid_post", "ccr": 1, "z": [1.0, 40.0, -3.0]})
    s = pd.DataFrame({"layer": [0, 1, 2], "site": "resid_post", "rankme": [5.0, 5.0, 5.0],
                      "effective_rank": [1.0, 2.0, 3.0]})
    cmp = compare(p, s, metrics=["rankme", "effective_rank"])
    assert cmp.params["flat"] == ["rankme"] and cmp.to_pandas()["rankme_sd"].tolist() == [0.0, 0.0, 0.0]
    assert cmp.params["range"] == {"pga_z": 43.0, "rankme": 0.0, "effective_rank": 2.0}
    with pytest.raises(ValueError, match="share 0 layers"):
        compare(p.assign(layer=[5, 6, 7]), s, metrics=["rankme"])
    # several sites: the message names the public way to measure one (no removed function)
    two = pd.concat([s, s.assign(site="attn_out")])
    with pytest.raises(ValueError, match=r"several sites .*geolens\.spectrum\(model, states, site=") as err:
        compare(p, two, metrics=["rankme"])
    assert "spectrum_of_states" not in str(err.value)


@pytest.mark.slow
def test_default_model_weights_and_spectrum():
    """SmolLM2 ties its embeddings: W_E and the raw W_U rows are the same vectors, so the same geometry."""
    import geolens

    model = geolens.load_default_model()
    res = weight_geometry(model, progress=False).to_pandas().set_index("matrix")
    assert res.loc["W_E", "effective_rank"] == pytest.approx(res.loc["W_U raw", "effective_rank"], rel=1e-9)
    assert res.loc["W_U raw", "rows"] == 49152 and res.loc["W_U raw", "cols"] == 576
    spec = spectrum(model, geolens.default_texts(n=4), layers=[0, 15, 30], n_tokens=256, max_length=96,
                    progress=False).to_pandas()
    assert spec["layer"].tolist() == [0, 15, 30]
    assert (spec["effective_rank"] > 50).all() and (spec["alpha_req_r2"] > 0.8).all()
