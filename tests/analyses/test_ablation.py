"""ablation_effect: loss/KL against a direct computation, PGA against geolens.pga, planted no-op, hygiene."""

import pytest
import torch

import geolens
from geolens.analyses.ablation import AblationEffectResult, ablation_effect
from geolens.interventions import ablation_hooks, reference_pcs
from geolens.model import as_adapter
from tests.helpers import hook_count, same_weights, weights

KW = dict(k=6, n_null=10, n_tokens=24, progress=False)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(3, 101, (3, 10), generator=torch.Generator().manual_seed(3))


def _loss_by_hand(adapter, ids, mask, fwd_hooks=()):
    logits = adapter.run_with_hooks(ids, mask, fwd_hooks=list(fwd_hooks)).double()
    valid = (mask[:, :-1] == 1) & (mask[:, 1:] == 1)
    return torch.nn.functional.cross_entropy(logits[:, :-1][valid], ids[:, 1:][valid]), logits[:, :-1][valid]


def test_loss_kl_and_pga_match_independent_computations(native_bridge, tokens):
    adapter = as_adapter(native_bridge)
    ids, layer = tokens, 1
    before_hooks, before_weights = hook_count(native_bridge), weights(native_bridge)
    res = ablation_effect(native_bridge, ids, layer=layer, n_components=1, batch_size=3, **KW)
    assert isinstance(res, AblationEffectResult)
    # Independent loss: the same PCs ablated by hand, cross-entropy with torch.
    basis, _ = reference_pcs(native_bridge, ids, layer=layer, n_components=1, n_tokens=KW["n_tokens"])
    ce_clean, lp_clean = _loss_by_hand(adapter, ids, torch.ones_like(ids))
    hooks = ablation_hooks(native_bridge, basis, layer=layer)
    ce_abl, lp_abl = _loss_by_hand(adapter, ids, torch.ones_like(ids), hooks)
    assert res.params["ce_clean"] == pytest.approx(float(ce_clean), abs=1e-5)
    assert res.params["delta_ce"] == pytest.approx(float(ce_abl - ce_clean), abs=1e-5)
    kl = (lp_clean.log_softmax(-1).exp() * (lp_clean.log_softmax(-1) - lp_abl.log_softmax(-1))).sum(-1).mean()
    assert res.params["kl"] == pytest.approx(float(kl), abs=1e-6)
    # The clean PGA equals geolens.pga on the same positions, readout and nulls.
    table = res.to_pandas()
    reference = geolens.pga(native_bridge, ids, ccr=0, layers=list(range(layer, 3)), seed=0, **KW).to_pandas()
    torch.testing.assert_close(torch.tensor(table["z_clean"].to_numpy()), torch.tensor(reference["z"].to_numpy()))
    assert table["layer"].tolist() == [1, 2, 2] and table["site"].tolist()[-1] == "final"
    assert not table["z_ablated"].equals(table["z_clean"])
    assert hook_count(native_bridge) == before_hooks
    assert same_weights(before_weights, native_bridge)


def test_padding_is_excluded_from_the_loss(neox_bridge):
    adapter = as_adapter(neox_bridge)
    texts = ["the cat sat on the mat", "a dog ran", "the bird sang a song"]
    res = ablation_effect(neox_bridge, texts, layer=2, n_components=1, **dict(KW, n_tokens=8))
    lengths = [len(adapter.tokenize([t])[0][0]) for t in texts]
    assert res.params["n_predicted"] == sum(n - 1 for n in lengths)


def test_mean_mode_and_result_object(native_bridge, tokens, tmp_path):
    res = ablation_effect(native_bridge, tokens, layer=2, n_components=2, mode="mean", **KW)
    assert res.params["mode"] == "mean" and len(res.params["pc_readout_energy"]) == 2
    assert all(0.0 <= e <= 1.0 + 1e-6 for e in res.params["pc_readout_energy"])
    assert res.params["random_energy"] == pytest.approx(6 / 32)
    assert "delta_ce" in repr(res) and "AblationEffectResult" in repr(res)
    fig = res.plot()
    assert {t.name for t in fig.data} >= {"clean", "ablated"}
    back = AblationEffectResult.load(res.save(tmp_path / "ablation.json"))
    assert back.rows == res.rows


@pytest.mark.parametrize(
    "kwargs,match",
    [(dict(mode="zero"), "mode"), (dict(layer=5), "valid layers"), (dict(n_components=0), "n_components must be"),
     (dict(site="final"), "final")],
)
def test_bad_arguments(native_bridge, tokens, kwargs, match):
    args = dict(layer=1, **KW)
    args.update(kwargs)
    before = hook_count(native_bridge)
    with pytest.raises(ValueError, match=match):
        ablation_effect(native_bridge, tokens, **args)
    assert hook_count(native_bridge) == before


def test_effect_rows_pair_clean_and_ablated_cells_and_refuse_a_mismatch():
    from geolens.analyses.ablation import _effect_rows

    clean = [{"layer": l, "site": "resid_post", "z": 2.0 + l, "rho_readout": 0.1 * l} for l in (1, 2)]
    ablated = [{"layer": l, "site": "resid_post", "z": -1.0 * l, "rho_readout": 0.05 * l} for l in (1, 2)]
    rows = _effect_rows(clean, ablated)
    assert [row["delta_z"] for row in rows] == [-1.0 - 3.0, -2.0 - 4.0]
    assert [(row["rho_clean"], row["rho_ablated"]) for row in rows] == [(0.1, 0.05), (0.2, 0.1)]
    with pytest.raises(ValueError, match="clean and ablated rows differ"):
        _effect_rows(clean, ablated[::-1])
