"""Ablation hooks: exact edits, planted no-ops, composition with user hooks, no hook or weight left behind."""

import numpy as np
import pytest
import torch

import geolens
from geolens.interventions import (
    ablate,
    ablate_pcs,
    ablation_hooks,
    edit_hook_name,
    reference_pcs,
    remove_subspace,
    replace_subspace,
    subspace_basis,
)
from geolens.metrics import remove_common_components
from geolens.model import as_adapter
from tests.helpers import hook_count, same_weights, weights


def _tokens(adapter, shape=(3, 10), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, adapter.d_vocab, shape, generator=g)


def _random_basis(d, m, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d, m, generator=g)


# ------------------------------------------------------------------ pure edits
def test_remove_and_replace_subspace_match_numpy():
    g = np.random.default_rng(0)
    h, a, mu = g.normal(size=(7, 6)), g.normal(size=(6, 2)), g.normal(size=6)
    q, _ = np.linalg.qr(a)
    p = q @ q.T
    expected_remove = h - h @ p
    expected_replace = h - (h - mu) @ p
    qt = torch.from_numpy(q)
    np.testing.assert_allclose(remove_subspace(torch.from_numpy(h), qt).numpy(), expected_remove, atol=1e-12)
    np.testing.assert_allclose(replace_subspace(torch.from_numpy(h), qt, torch.from_numpy(mu)).numpy(),
                               expected_replace, atol=1e-12)


def test_subspace_basis_orthonormalises_and_checks_shape():
    q = subspace_basis(torch.tensor([[2.0, 1.0], [0.0, 1.0], [0.0, 0.0]]), 3)
    torch.testing.assert_close(q.T @ q, torch.eye(2))
    assert subspace_basis(torch.zeros(3, 0), 3).shape == (3, 0)
    assert subspace_basis(torch.tensor([1.0, 0.0, 0.0]), 3).shape == (3, 1)  # a vector is one direction
    with pytest.raises(ValueError, match=r"\[d_model=3, m\]"):
        subspace_basis(torch.zeros(4, 1), 3)
    with pytest.raises(ValueError, match="rank-deficient"):
        subspace_basis(torch.ones(3, 2), 3)
    with pytest.raises(ValueError, match="NaN"):
        subspace_basis(torch.full((3, 1), float("nan")), 3)


# ------------------------------------------------------------------ hooks on models
@pytest.mark.parametrize("site,layer", [("resid_post", 0), ("attn_out", 2)])
def test_project_mode_removes_the_component_exactly(any_model, site, layer):
    adapter = as_adapter(any_model)
    tokens = _tokens(adapter, shape=(2, 8))
    basis = subspace_basis(_random_basis(adapter.d_model, 3), adapter.d_model)
    before_hooks, before_weights = hook_count(any_model), weights(any_model)
    clean = geolens.capture(any_model, tokens, sites=(site,), layers=[layer], progress=False).layer(site, layer)
    with ablate(any_model, basis, layer=layer, site=site):
        ablated = geolens.capture(any_model, tokens, sites=(site,), layers=[layer], progress=False).layer(site, layer)
    assert float((clean @ basis).abs().max()) > 1e-2  # the component was there
    assert float((ablated @ basis).abs().max()) < 1e-5
    torch.testing.assert_close(ablated, remove_subspace(clean, basis), atol=1e-5, rtol=1e-5)
    assert hook_count(any_model) == before_hooks
    assert same_weights(before_weights, any_model)


def test_hook_names_follow_the_layer_convention(native_bridge):
    adapter = as_adapter(native_bridge)
    assert edit_hook_name(adapter, "resid_post", 0) == "blocks.0.hook_resid_pre"
    assert edit_hook_name(adapter, "resid_post", 2) == "blocks.1.hook_resid_post"
    assert edit_hook_name(adapter, "mlp_out", 1) == "blocks.0.hook_mlp_out"
    with pytest.raises(ValueError, match="valid layers: 1..2"):
        edit_hook_name(adapter, "attn_out", 0)
    with pytest.raises(ValueError, match="final"):
        edit_hook_name(adapter, "final", 2)


def test_mean_ablation_of_a_direction_without_variance_is_a_no_op(any_model):
    adapter = as_adapter(any_model)
    tokens = _tokens(adapter, shape=(1, 12))  # 11 states (BOS skipped) in d = 32: a null direction exists
    layer = 1
    states = geolens.capture(any_model, tokens, layers=[layer], progress=False).layer("resid_post", layer).double()
    centred = states - states.mean(0)
    _, _, vh = torch.linalg.svd(centred)
    null_dir = vh[-1].float()  # every state has the same coordinate along it
    spread = (states.float() @ null_dir).std()
    assert float(spread) < 1e-4 * float((states.float() @ null_dir).abs().mean())
    clean = adapter.run_with_hooks(tokens)
    with ablate(any_model, null_dir, layer=layer, mode="mean", reference_tokens=states.float()):
        mean_ablated = adapter.run_with_hooks(tokens)
    with ablate(any_model, null_dir, layer=layer, mode="project"):
        projected = adapter.run_with_hooks(tokens)
    torch.testing.assert_close(mean_ablated, clean, atol=1e-4, rtol=1e-4)
    assert float((projected - clean).abs().max()) > 1e-3  # the same direction does matter when removed


def test_mean_mode_from_reference_tokens_matches_states(native_bridge):
    adapter = as_adapter(native_bridge)
    ref_tokens, tokens = _tokens(adapter, seed=1), _tokens(adapter, seed=2)
    basis = _random_basis(adapter.d_model, 2)
    ref_states = geolens.capture(native_bridge, ref_tokens, layers=[2], progress=False).layer("resid_post", 2)
    with ablate(native_bridge, basis, layer=2, mode="mean", reference_tokens=ref_tokens):
        from_tokens = adapter.run_with_hooks(tokens)
    with ablate(native_bridge, basis, layer=2, mode="mean", reference_tokens=ref_states):
        from_states = adapter.run_with_hooks(tokens)
    torch.testing.assert_close(from_tokens, from_states)
    q = subspace_basis(basis, adapter.d_model)
    with ablate(native_bridge, basis, layer=2, mode="mean", reference_tokens=ref_states):
        got = geolens.capture(native_bridge, tokens, layers=[2], progress=False).layer("resid_post", 2)
    torch.testing.assert_close(got @ q, (ref_states.mean(0) @ q).expand(got.shape[0], -1), atol=1e-5, rtol=1e-5)


def test_first_position_is_left_alone_by_default(native_bridge):
    adapter = as_adapter(native_bridge)
    tokens = _tokens(adapter)
    basis = _random_basis(adapter.d_model, 4)
    seen = {}

    def grab(act, hook=None):
        seen["act"] = act.clone()

    name = edit_hook_name(adapter, "resid_post", 1)
    adapter.run_with_hooks(tokens, fwd_hooks=[(name, grab)])
    clean = seen["act"]
    for skip_first in (True, False):
        hooks = ablation_hooks(native_bridge, basis, layer=1, skip_first=skip_first) + [(name, grab)]
        adapter.run_with_hooks(tokens, fwd_hooks=hooks)  # user hooks after ours see the edited activation
        torch.testing.assert_close(seen["act"][:, 0].eq(clean[:, 0]).all(), torch.tensor(skip_first))
        q = subspace_basis(basis, adapter.d_model)
        assert float((seen["act"][:, 1:] @ q).abs().max()) < 1e-5


def test_ablate_pcs_equals_ccr_on_the_reference_tokens(any_model):
    adapter = as_adapter(any_model)
    tokens = _tokens(adapter, shape=(4, 12))
    layer, m = 2, 2
    clean = geolens.capture(any_model, tokens, layers=[layer], progress=False).layer("resid_post", layer)
    # Independent reference: numpy SVD of the centred states.
    x = clean.double().numpy()
    _, _, vt = np.linalg.svd(x - x.mean(0), full_matrices=False)
    projector = vt[:m].T @ vt[:m]
    with ablate_pcs(any_model, tokens, layer=layer, n_components=m) as pcs:
        ablated = geolens.capture(any_model, tokens, layers=[layer], progress=False).layer("resid_post", layer)
    np.testing.assert_allclose((pcs @ pcs.T).double().numpy(), projector, atol=1e-5)
    # Removing the PCs from uncentred states, then centring, is CCR-m of the clean states.
    torch.testing.assert_close(ablated - ablated.mean(0), remove_common_components(clean, m), atol=1e-4, rtol=1e-4)


def test_reference_pcs_returns_states_and_validates(native_bridge):
    basis, states = reference_pcs(native_bridge, _tokens(as_adapter(native_bridge)), layer=1, n_components=3,
                                  n_tokens=20)
    assert basis.shape == (32, 3) and states.shape == (20, 32)
    with pytest.raises(ValueError, match="more than 5 reference states"):
        reference_pcs(native_bridge, torch.randint(3, 100, (1, 6)), layer=1, n_components=5)


def test_hooks_removed_on_exception_and_weights_unchanged(any_model):
    adapter = as_adapter(any_model)
    before_hooks, before_weights = hook_count(any_model), weights(any_model)
    basis = _random_basis(adapter.d_model, 1)
    with pytest.raises(RuntimeError, match="boom"):
        with ablate(any_model, basis, layer=1):
            assert hook_count(any_model) > before_hooks
            raise RuntimeError("boom")
    assert hook_count(any_model) == before_hooks

    def bad_hook(act, hook=None):
        raise KeyError("user hook fails")

    with pytest.raises(KeyError):
        with ablate(any_model, basis, layer=1):
            adapter.run_with_hooks(_tokens(adapter), fwd_hooks=[(edit_hook_name(adapter, "resid_post", 2), bad_hook)])
    with pytest.raises(ValueError):
        with ablate_pcs(any_model, _tokens(adapter), layer=1, n_components=40):  # n_components > N states: raises first
            pass
    assert hook_count(any_model) == before_hooks
    assert same_weights(before_weights, any_model)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(mode="zero"), ValueError, "mode must be one of"),
        (dict(mode="mean"), ValueError, "needs reference"),
        (dict(reference_tokens=torch.zeros(3, 32)), ValueError, "only used with mode='mean'"),
        (dict(mode="mean", reference_tokens=torch.zeros(3, 31)), ValueError, "d_model=32"),
        (dict(layer=3), ValueError, "valid layers: 0..2"),
        (dict(site="nowhere"), ValueError, "unknown site"),
        (dict(basis=torch.zeros(31, 1)), ValueError, "d_model=32"),
    ],
)
def test_bad_arguments_raise_clear_errors(native_bridge, kwargs, error, match):
    args = dict(layer=1, basis=torch.eye(32)[:, :1])
    args.update(kwargs)
    before = hook_count(native_bridge)
    with pytest.raises(error, match=match):
        with ablate(native_bridge, **args):
            pass
    assert hook_count(native_bridge) == before
