"""geolens.pga end to end on tiny models: table shape, agreement with the pure metric, errors."""

import json

import pandas as pd
import pytest
import torch

import geolens
from geolens.metrics import readout_basis, subspace_pga
from geolens.model import as_adapter
from tests.helpers import hook_count, padded_tokens, same_weights, weights

COLUMNS = ["layer", "site", "ccr", "rho_readout", "null_mean", "null_std", "z", "p_value",
           "pc1_readout_energy", "random_energy"]


def test_pga_table_matches_pure_metric_on_captured_states(any_model):
    adapter = as_adapter(any_model)
    tokens, mask = padded_tokens(adapter.d_vocab, lengths=(16, 16, 12, 16))
    before_hooks, before = hook_count(any_model), weights(any_model)
    res = geolens.pga(any_model, tokens, k=4, n_null=10, ccr=[0, 1], n_tokens=40, attention_mask=mask,
                      progress=False)
    assert hook_count(any_model) == before_hooks and same_weights(before, any_model)
    table = res.to_pandas()
    assert list(table.columns) == COLUMNS
    assert len(table) == (adapter.n_layers + 2) * 2  # layers 0..L, plus final, for two CCR values
    assert table[table.site == "final"].layer.unique().tolist() == [adapter.n_layers]

    states = geolens.capture(any_model, tokens, sites=("resid_post",), attention_mask=mask, n_tokens=40,
                             progress=False)
    basis = readout_basis(adapter.unembed_matrix("raw"), 4)
    for layer in (0, adapter.n_layers):
        direct = subspace_pga(states.layer("resid_post", layer), basis, n_null=10, ccr=1, seed=0)
        row = table[(table.layer == layer) & (table.site == "resid_post") & (table.ccr == 1)].iloc[0]
        assert row.z == pytest.approx(direct.z, abs=1e-9)
        assert row.rho_readout == pytest.approx(direct.rho_readout, abs=1e-12)
    assert (table.random_energy == 4 / adapter.d_model).all()


def test_pga_result_is_jupyter_friendly(native_bridge, tmp_path):
    adapter = as_adapter(native_bridge)
    res = geolens.pga(native_bridge, torch.randint(0, adapter.d_vocab, (3, 12)), k=4, n_null=5, n_tokens=20,
                      progress=False)
    assert "PGAResult" in repr(res) and "<table" in res._repr_html_()
    figure = res.plot()
    assert len(figure.data) >= 2 and figure.layout.yaxis.title.text == "PGA z-score"
    assert res.plot(kind="rho").layout.yaxis.title.text.startswith("Spearman")
    path = res.save(tmp_path / "pga.json")
    again = geolens.PGAResult.load(path)
    pd.testing.assert_frame_equal(again.to_pandas(), res.to_pandas())
    assert len(again.null_rhos) == len(res.rows) and len(again.null_rhos[0]["rhos"]) == 5
    assert json.loads(path.read_text())["params"]["k"] == 4


def test_folded_readout_differs_from_raw_and_is_recorded(native_bridge):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (3, 12))
    folded = geolens.pga(native_bridge, tokens, k=4, n_null=5, n_tokens=20, readout="folded", progress=False)
    assert folded.params["readout"] == "folded"


def test_pga_bad_arguments(native_bridge):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (3, 12))
    with pytest.raises(ValueError, match="k must be < d_model"):
        geolens.pga(native_bridge, tokens, k=adapter.d_model, progress=False)
    with pytest.raises(ValueError, match="n_tokens = 1000"):
        geolens.pga(native_bridge, tokens, k=4, n_tokens=1000, progress=False)
    with pytest.raises(ValueError, match="ccr is an empty list"):
        geolens.pga(native_bridge, tokens, k=4, ccr=[], n_tokens=20, progress=False)
    with pytest.raises(ValueError, match="readout"):
        geolens.pga(native_bridge, tokens, k=4, readout="centred", n_tokens=20, progress=False)


def test_pga_of_given_states_equals_pga_of_tokens(native_bridge):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (3, 12))
    direct = geolens.pga(native_bridge, tokens, k=4, n_null=6, n_tokens=20, progress=False)
    states = geolens.capture(native_bridge, tokens, sites=("resid_post", "final", "attn_out"), n_tokens=20,
                             progress=False)
    reused = geolens.pga(native_bridge, states, k=4, n_null=6, progress=False)
    pd.testing.assert_frame_equal(direct.to_pandas(), reused.to_pandas())
    with pytest.raises(ValueError, match="not 'mlp_out'"):
        geolens.pga(native_bridge, states, k=4, site="mlp_out", progress=False)


def test_approximate_pga_table_has_errors_next_to_the_numbers(native_bridge):
    adapter = as_adapter(native_bridge)
    tokens = torch.randint(0, adapter.d_vocab, (8, 16))
    exact = geolens.pga(native_bridge, tokens, k=4, n_null=8, ccr=[0, 1], n_tokens=100, progress=False)
    approx = geolens.pga(native_bridge, tokens, k=4, n_null=8, ccr=[0, 1], n_tokens=100, n_pairs=2000,
                         progress=False)
    table, ref = approx.to_pandas(), exact.to_pandas()
    assert list(table.columns) == ["layer", "site", "ccr", "rho_readout", "rho_se", "null_mean", "null_std",
                                   "null_std_raw", "pair_noise_std", "z", "z_se", "p_value", "pc1_readout_energy",
                                   "random_energy"]
    # the null's spread as used is the observed one less the pair-sampling noise
    assert ((table.null_std**2 - (table.null_std_raw**2 - table.pair_noise_std**2).clip(
        lower=0.05 * table.null_std_raw**2)).abs() <= 1e-12).all()
    assert approx.params["n_pairs"] == 2000 and approx.params["exact"] is False and "n_pairs" not in exact.params
    assert (table.z_se > 0).all() and (table.rho_se > 0).all()
    # the same pairs for every layer: the error of each z is its own, the tolerance the target's
    assert ((table.z - ref.z).abs() <= 0.3 + 0.05 * ref.z.abs() + 4 * table.z_se).all()
    # n_pairs covering all 4950 pairs: the exact table, with zero errors
    full = geolens.pga(native_bridge, tokens, k=4, n_null=8, ccr=[0, 1], n_tokens=100, n_pairs=10_000,
                       progress=False).to_pandas()
    pd.testing.assert_frame_equal(full.drop(columns=["rho_se", "z_se", "null_std_raw", "pair_noise_std"]), ref)
    assert (full.null_std_raw == full.null_std).all() and (full.pair_noise_std == 0).all()
    assert (full.z_se == 0).all() and (full.rho_se == 0).all()


@pytest.mark.parametrize("n_pairs, error", [(0, ValueError), (1, ValueError), (1e6, TypeError), (500, ValueError)])
def test_bad_n_pairs_raise_naming_it(native_bridge, n_pairs, error):
    tokens = torch.randint(0, as_adapter(native_bridge).d_vocab, (8, 16))
    with pytest.raises(error, match="n_pairs"):
        geolens.pga(native_bridge, tokens, k=4, n_null=5, n_tokens=100, n_pairs=n_pairs, progress=False)
