"""Activation patching: equals TransformerLens's own patching, subspace identities, batching, errors, hygiene."""

import numpy as np
import pytest
import torch

from geolens.analyses.patching import PatchResult, kl, logit_diff, patch, prob
from geolens.interventions import edit_hook_name, patch_subspace
from geolens.metrics import readout_basis
from geolens.model import as_adapter
from tests.helpers import hook_count, same_weights, weights

CORRECT, WRONG = 5, 7


def _pair(adapter, n_pairs=1, length=6, seed=0):
    """Clean and corrupted ids that differ at two positions (not BOS)."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, adapter.d_vocab, (n_pairs, length), generator=g)
    clean[:, 0] = 0
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 11) % (adapter.d_vocab - 3) + 3
    corrupted[:, 4] = (clean[:, 4] + 23) % (adapter.d_vocab - 3) + 3
    return clean, corrupted


def _ld(logits):
    return logits[:, -1, CORRECT] - logits[:, -1, WRONG]


@pytest.mark.parametrize("site", ["resid_pre", "attn_out", "mlp_out"])
def test_equals_transformer_lens_patching(any_model, site):
    tl_patching = pytest.importorskip("transformer_lens.patching")
    reference_fn = getattr(tl_patching, f"get_act_patch_{site}", None)
    if reference_fn is None:
        pytest.skip(f"transformer_lens.patching has no get_act_patch_{site} in this version")
    pd = pytest.importorskip("pandas")
    adapter = as_adapter(any_model)
    clean, corrupted = _pair(adapter, n_pairs=2)
    _, cache = any_model.run_with_cache(clean)
    # TL runs one forward per cell (slow on bridges): compare a 2 x 3 grid of cells.
    # TL indexes blocks 0..L-1; geolens layer l is block l-1.
    blocks, positions = [0, 1], [2, 5]
    index_df = pd.DataFrame([(b, p) for b in blocks for p in positions], columns=["layer", "pos"])
    # TL scores the whole batch with one scalar; ours is per row, then averaged over pairs.
    expected = reference_fn(any_model, corrupted, cache, lambda logits: _ld(logits).mean(), index_df=index_df,
                            index_axis_names=None)
    result = patch(any_model, clean, corrupted, metric=_ld, sites=site, layers=[b + 1 for b in blocks],
                   positions=positions, batch_size=5, progress=False)
    got = result.values(site)  # [layers 1..L, positions]
    assert got.shape == (len(blocks), len(positions))
    np.testing.assert_allclose(got.reshape(-1).numpy(), expected.detach().double().numpy(), atol=1e-5, rtol=1e-5)
    assert sorted(result.to_pandas()["layer"].unique()) == [1, 2]


def test_metric_values_of_the_unpatched_runs(native_bridge):
    adapter = as_adapter(native_bridge)
    clean, corrupted = _pair(adapter)
    res = patch(native_bridge, clean, corrupted, metric=logit_diff(CORRECT, WRONG), sites="resid_pre", progress=False)
    assert res.params["clean_value"] == pytest.approx(float(_ld(adapter.run_with_hooks(clean))[0]), abs=1e-5)
    assert res.params["corrupted_value"] == pytest.approx(float(_ld(adapter.run_with_hooks(corrupted))[0]), abs=1e-5)
    # The BOS position is the same in both prompts: patching it does nothing.
    table = res.to_pandas()
    bos = table[(table.layer == 1) & (table.position == 0)]["value"].item()
    assert bos == pytest.approx(res.params["corrupted_value"], abs=1e-5)
    # The last block's input at the last position carries everything the output reads.
    last = table[(table.layer == 2) & (table.position == clean.shape[1] - 1)]["value"].item()
    assert last != pytest.approx(res.params["corrupted_value"], abs=1e-6)


def test_full_subspace_equals_plain_patching_and_empty_subspace_changes_nothing(any_model):
    adapter = as_adapter(any_model)
    clean, corrupted = _pair(adapter)
    d = adapter.d_model
    kw = dict(sites=("resid_pre", "mlp_out"), positions=[2, 4, 5], progress=False)
    plain = patch(any_model, clean, corrupted, metric=_ld, **kw).to_pandas()["value"].to_numpy()
    full = patch(any_model, clean, corrupted, metric=_ld, subspace=torch.eye(d), **kw).to_pandas()["value"].to_numpy()
    np.testing.assert_allclose(full, plain, atol=1e-5)
    empty = patch(any_model, clean, corrupted, metric=_ld, subspace=torch.zeros(d, 0), **kw)
    np.testing.assert_allclose(empty.to_pandas()["value"].to_numpy(), empty.params["corrupted_value"], atol=1e-5)
    # The complement of the empty subspace is the whole space.
    whole = patch(any_model, clean, corrupted, metric=_ld, subspace=torch.zeros(d, 0), complement=True, **kw)
    np.testing.assert_allclose(whole.to_pandas()["value"].to_numpy(), plain, atol=1e-5)


def test_subspace_then_complement_gives_the_clean_activation():
    g = torch.Generator().manual_seed(0)
    corr, clean = torch.randn(5, 16, generator=g, dtype=torch.float64), torch.randn(5, 16, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(16, 4, generator=g, dtype=torch.float64))
    inside = patch_subspace(corr, clean, q)
    both = patch_subspace(inside, clean, q, complement=True)
    torch.testing.assert_close(both, clean)
    # Reverse order too, and each part touches only its own component.
    torch.testing.assert_close(patch_subspace(patch_subspace(corr, clean, q, complement=True), clean, q), clean)
    p = q @ q.T
    torch.testing.assert_close(inside @ p, clean @ p)
    torch.testing.assert_close(inside - inside @ p, corr - corr @ p)


def test_subspace_patch_equals_a_hand_written_hook(neox_bridge):
    adapter = as_adapter(neox_bridge)
    clean, corrupted = _pair(adapter, n_pairs=2)
    basis = readout_basis(adapter.unembed_matrix(), 6)
    layer, position = 2, 4
    name = edit_hook_name(adapter, "resid_pre", layer)
    _, cache = neox_bridge.run_with_cache(clean)
    clean_act = cache[name]
    p = (basis @ basis.T).double()

    def by_hand(complement):
        def hook(act, hook=None):
            act = act.clone()
            diff = (clean_act[:, position] - act[:, position]).double()
            part = diff - diff @ p if complement else diff @ p
            act[:, position] = (act[:, position].double() + part).to(act.dtype)
            return act
        return float(_ld(adapter.run_with_hooks(corrupted, fwd_hooks=[(name, hook)])).mean())

    for complement in (False, True):
        res = patch(neox_bridge, clean, corrupted, metric=_ld, sites="resid_pre", layers=[layer], positions=[position],
                    subspace=basis, complement=complement, progress=False)
        assert res.rows[0]["value"] == pytest.approx(by_hand(complement), abs=1e-5)
        assert res.params["subspace_dim"] == 6 and res.params["complement"] is complement


def test_batch_size_does_not_change_values_and_forward_count(native_bridge):
    adapter = as_adapter(native_bridge)
    clean, corrupted = _pair(adapter, n_pairs=3)
    kw = dict(sites="attn_out", positions=[1, 2, 4, 5], progress=False)
    one = patch(native_bridge, clean, corrupted, metric=_ld, batch_size=1, **kw)
    many = patch(native_bridge, clean, corrupted, metric=_ld, batch_size=64, **kw)
    np.testing.assert_allclose(one.to_pandas()["value"], many.to_pandas()["value"], atol=1e-5)
    n_cells = adapter.n_layers * 4
    assert one.params["n_forward"] == 1 + (n_cells + 1)  # batch below n_pairs: one cell per forward
    assert many.params["n_forward"] == 1 + int(np.ceil((n_cells + 1) / (64 // 3)))


def test_builtin_metrics(native_bridge):
    adapter = as_adapter(native_bridge)
    clean, corrupted = _pair(adapter, n_pairs=2)
    logits_clean, logits_corr = adapter.run_with_hooks(clean), adapter.run_with_hooks(corrupted)
    kw = dict(sites="resid_pre", layers=[1], positions=[0], progress=False)  # BOS patch: no effect
    res = patch(native_bridge, clean, corrupted, metric=prob(CORRECT), **kw)
    expected = logits_corr[:, -1].softmax(-1)[:, CORRECT].mean()
    assert res.rows[0]["value"] == pytest.approx(float(expected), abs=1e-6)
    # KL(p_clean || p_patched), computed by hand with scipy-free numpy.
    res = patch(native_bridge, clean, corrupted, metric=kl, **kw)
    pc = logits_clean[:, -1].double().softmax(-1).numpy()
    pp = logits_corr[:, -1].double().softmax(-1).numpy()
    assert res.rows[0]["value"] == pytest.approx(float((pc * np.log(pc / pp)).sum(-1).mean()), abs=1e-6)
    assert res.params["clean_value"] == pytest.approx(0.0, abs=1e-9)
    assert patch(native_bridge, clean, corrupted, metric="kl", **kw).rows[0]["value"] == res.rows[0]["value"]
    # Per-pair target tokens.
    res = patch(native_bridge, clean, corrupted, metric=logit_diff([CORRECT, 8], [WRONG, 9]), **kw)
    last = logits_corr[:, -1]
    expected = ((last[0, CORRECT] - last[0, WRONG]) + (last[1, 8] - last[1, 9])) / 2
    assert res.rows[0]["value"] == pytest.approx(float(expected), abs=1e-5)


def test_identical_inputs_give_zero_kl_everywhere(native_bridge):
    adapter = as_adapter(native_bridge)
    clean, _ = _pair(adapter)
    res = patch(native_bridge, clean, clean, metric=kl, progress=False)
    assert float(res.to_pandas()["value"].abs().max()) < 1e-6


def test_text_prompts_and_string_tokens(native_bridge):
    res = patch(native_bridge, "the cat sat on the mat", "the dog sat on the mat", metric=logit_diff(" cat", " dog"),
                sites="resid_pre", progress=False)
    assert res.params["n_positions"] == len(res.params["position_labels"])
    assert any("/" in label for label in res.params["position_labels"])  # the differing token is labelled
    with pytest.raises(ValueError, match="not one"):
        patch(native_bridge, "the cat", "the dog", metric=logit_diff("the cat", " dog"), progress=False)


def test_different_lengths_raise_a_clear_error(native_bridge):
    before = hook_count(native_bridge)
    with pytest.raises(ValueError, match="same shape"):
        patch(native_bridge, "the cat sat on the mat", "the cat sat", metric=kl, progress=False)
    with pytest.raises(ValueError, match="same shape"):
        patch(native_bridge, torch.randint(3, 100, (1, 6)), torch.randint(3, 100, (2, 6)), metric=kl, progress=False)
    with pytest.raises(ValueError, match="padding"):
        patch(native_bridge, ["the cat sat", "a dog ran in the park"], ["the cat sat", "a dog ran in the park"], metric=kl,
              progress=False)
    assert hook_count(native_bridge) == before


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(sites="nowhere"), ValueError, "unknown site"),
        (dict(sites="attn_out", layers=[0]), ValueError, "valid layers: 1..2"),
        (dict(positions=[6]), ValueError, "position"),
        (dict(complement=True), ValueError, "needs subspace"),
        (dict(subspace=torch.zeros(31, 2)), ValueError, "d_model=32"),
        (dict(metric=lambda logits: logits[:, -1]), ValueError, "one value per row"),
        (dict(metric=lambda logits: logits[:, -1, 0] * float("nan")), ValueError, "NaN"),
        (dict(metric="loss"), ValueError, "unknown metric"),
        (dict(metric=3), TypeError, "metric must be"),
        (dict(batch_size=0), ValueError, "batch_size"),
    ],
)
def test_bad_arguments(native_bridge, kwargs, error, match):
    adapter = as_adapter(native_bridge)
    clean, corrupted = _pair(adapter)
    args = dict(metric=_ld, progress=False)
    args.update(kwargs)
    before_hooks, before_weights = hook_count(native_bridge), weights(native_bridge)
    with pytest.raises(error, match=match):
        patch(native_bridge, clean, corrupted, **args)
    assert hook_count(native_bridge) == before_hooks
    assert same_weights(before_weights, native_bridge)


def test_no_hooks_or_weight_changes_left_also_when_the_metric_raises(any_model):
    adapter = as_adapter(any_model)
    clean, corrupted = _pair(adapter)
    before_hooks, before_weights = hook_count(any_model), weights(any_model)
    patch(any_model, clean, corrupted, metric=_ld, positions=[2, 5], subspace=torch.randn(adapter.d_model, 3), progress=False)
    assert hook_count(any_model) == before_hooks
    calls = []

    def flaky(logits):
        calls.append(1)
        if len(calls) > 1:  # the clean run succeeds, a patched run fails
            raise RuntimeError("metric failed")
        return _ld(logits)

    with pytest.raises(RuntimeError, match="metric failed"):
        patch(any_model, clean, corrupted, metric=flaky, positions=[2, 5], batch_size=2, progress=False)
    assert hook_count(any_model) == before_hooks
    assert same_weights(before_weights, any_model)


def test_result_table_plot_and_round_trip(native_bridge, tmp_path):
    adapter = as_adapter(native_bridge)
    clean, corrupted = _pair(adapter)
    res = patch(native_bridge, clean, corrupted, metric=logit_diff(CORRECT, WRONG), progress=False)
    table = res.to_pandas()
    assert list(table.columns) == ["site", "layer", "position", "value"]
    assert len(table) == 3 * adapter.n_layers * clean.shape[1]
    fig = res.plot()
    assert len(fig.data) == 3
    assert "PatchResult" in repr(res) and "logit_diff" in repr(res)
    norm = res.normalized().to_pandas()
    bos = norm[(norm.site == "resid_pre") & (norm.position == 0)]["value"]
    assert norm["value"].notna().all() and bool((bos.abs() < 1e-5).all())  # 0 = no effect after normalising
    back = PatchResult.load(res.save(tmp_path / "patch.json"))
    assert back.rows == res.rows
    with pytest.raises(KeyError, match="was not patched"):
        res.values("resid_post")


def test_resid_post_site_uses_the_residual_convention(native_bridge):
    adapter = as_adapter(native_bridge)
    clean, corrupted = _pair(adapter)
    res = patch(native_bridge, clean, corrupted, metric=_ld, sites=("resid_post", "resid_pre"), progress=False)
    post, pre = res.values("resid_post"), res.values("resid_pre")
    assert post.shape[0] == adapter.n_layers + 1
    # resid_post layer l-1 and resid_pre layer l are the same tensor (the input of block l-1).
    np.testing.assert_allclose(post[:-1].numpy(), pre.numpy(), atol=1e-5)
