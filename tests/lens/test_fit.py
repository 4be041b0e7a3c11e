"""The fast tuned lens: closed form against a numpy ridge solution and planted maps, the refinement's
stops and history, the halves, the cache; the model is never changed."""

import numpy as np
import pandas as pd
import pytest
import torch

import geolens.lens.fit as fit_module
from geolens.lens import TunedLens, cached_tuned_lens, evaluate, fit_tuned_lens
from geolens.lens import residual_stream
from geolens.lens.fit import _closed_form, _normal_equations, _target
from geolens.model import as_adapter
from geolens.lens.train import _kl_of_logits, kl_rows
from tests.helpers import hook_count, same_weights, weights

pytestmark = pytest.mark.filterwarnings("ignore:.*positions")


def _numpy_ridge(train: np.ndarray, ridge: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer: ``(A, b)`` minimising ||[H_l, 1] W - (H_L - H_l)||^2 + lam ||A||^2, lam = ridge * mean diag(H_l^T H_l)."""
    out = []
    final = train[-1]
    for h in train[:-1]:
        x = np.hstack([h, np.ones((h.shape[0], 1))])
        gram = x.T @ x
        d = h.shape[1]
        lam = ridge * np.mean(np.diag(gram)[:d])
        penalty = np.diag(np.r_[np.full(d, lam), 0.0])
        w = np.linalg.solve(gram + penalty, x.T @ (final - h))
        out.append((w[:d].T, w[d]))
    return out


def _planted_states(lens: TunedLens, n: int, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``[L + 1, n, d]`` states whose last layer is an exact affine image of every other layer."""
    g = torch.Generator().manual_seed(seed)
    d, layers = lens.d_model, lens.n_layers
    final = torch.randn(n, d, generator=g, dtype=torch.float64)
    maps, states = [], []
    for _ in range(layers):
        m = torch.eye(d, dtype=torch.float64) + 0.3 * torch.randn(d, d, generator=g, dtype=torch.float64)
        c = torch.randn(d, generator=g, dtype=torch.float64)
        states.append(torch.linalg.solve(m, (final - c).T).T)  # final = m h + c
        maps.append((m, c))
    return torch.stack(states + [final]), maps


def test_closed_form_recovers_a_planted_affine_map(native_bridge):
    lens = TunedLens(native_bridge)
    states, maps = _planted_states(lens, 400)
    _closed_form(lens, states.float(), ridge=0.0)
    for layer, (m, c) in enumerate(maps):
        eye = torch.eye(lens.d_model)
        torch.testing.assert_close(lens.linear_map(layer).double(), m, atol=2e-3, rtol=0)
        torch.testing.assert_close(lens.translators[layer].bias.double(), c, atol=2e-3, rtol=0)
        h = states[layer].float()
        torch.testing.assert_close(lens.transform(h, layer), states[-1].float(), atol=5e-3, rtol=0)
        assert not torch.equal(lens.linear_map(layer), eye)


@pytest.mark.parametrize("ridge", [0.0, 0.01, 1.0])
def test_closed_form_equals_numpy_ridge_in_any_chunking(native_bridge, monkeypatch, ridge):
    lens = TunedLens(native_bridge)
    g = torch.Generator().manual_seed(1)
    train = torch.randn(lens.n_layers + 1, 300, lens.d_model, generator=g) * torch.linspace(0.5, 3, lens.d_model)
    train[-1] += 0.5 * train[0] @ torch.randn(lens.d_model, lens.d_model, generator=g)
    expected = _numpy_ridge(train.double().numpy(), ridge)
    for chunk in (7, 2048):  # rows accumulated in chunks give the one-shot normal equations
        monkeypatch.setattr(fit_module, "_CLOSED_FORM_CHUNK", chunk)
        _closed_form(lens, train, ridge)
        for layer, (a, b) in enumerate(expected):
            np.testing.assert_allclose(lens.translators[layer].weight.detach().double().numpy(), a, atol=2e-5)
            np.testing.assert_allclose(lens.translators[layer].bias.detach().double().numpy(), b, atol=2e-5)
    # The equations of disjoint row sets add up to the whole's: fit_tuned_lens(halves=True) sums the halves'.
    odd = torch.arange(train.shape[1]) % 2 == 1
    parts = [_normal_equations(train[:, rows]) for rows in (odd, ~odd)]
    for whole, a, b in zip(_normal_equations(train), *parts):
        torch.testing.assert_close(a + b, whole, rtol=1e-12, atol=1e-9)


def test_fused_kl_and_its_gradient_match_scipy_and_autograd(native_bridge):
    from scipy.special import rel_entr, softmax

    g = torch.Generator().manual_seed(3)
    adapter_lens = TunedLens(native_bridge)
    last = torch.randn(5, adapter_lens.d_model, generator=g) * 3
    p, p_log_p = _target(adapter_lens.adapter, last, None, None)
    logits = (torch.randn(5, adapter_lens.d_vocab, generator=g) * 4).requires_grad_(True)
    kl, lse = _kl_of_logits(p, p_log_p, logits.detach())
    expected = rel_entr(p.double().numpy(), softmax(logits.detach().double().numpy(), axis=-1)).sum(-1)
    np.testing.assert_allclose(kl.numpy(), expected, rtol=1e-4, atol=1e-5)
    # The refinement's hand-made gradient (softmax(z) - p) / n is autograd's gradient of the mean KL.
    kl_rows(p.log(), logits).mean().backward()
    manual = logits.detach().sub(lse).exp_().sub_(p).div_(logits.shape[0])
    torch.testing.assert_close(manual, logits.grad, atol=1e-7, rtol=1e-4)


def test_refinement_in_bf16_follows_float32_and_is_recorded(native_bridge, train_texts):
    common = dict(n_tokens=96, max_steps=6, eval_every=2, patience=10, tol=0.0, seq_len=16, progress=False)
    curves = {}
    for dtype, name in ((None, "float32"), (torch.bfloat16, "bfloat16")):
        lens = fit_tuned_lens(native_bridge, train_texts, matmul_dtype=dtype, **common)
        assert lens.training_info["matmul_dtype"] == name
        curves[name] = lens.history.query("split == 'held_out'").groupby("step").kl.mean()
    # The same minibatches with bf16 vocabulary products: the held-out KL (always float32) tracks float32's.
    np.testing.assert_allclose(curves["bfloat16"].values, curves["float32"].values, rtol=0.02)
    assert curves["bfloat16"].loc[0] == curves["float32"].loc[0]  # the closed form does not use them
    with pytest.raises(TypeError, match="matmul_dtype"):
        fit_tuned_lens(native_bridge, train_texts, n_tokens=96, matmul_dtype=torch.int8, progress=False)


def test_fit_lowers_kl_records_history_and_leaves_model_unchanged(native_bridge, train_texts):
    hooks, before = hook_count(native_bridge), weights(native_bridge)
    lens = fit_tuned_lens(native_bridge, train_texts, n_tokens=96, max_steps=6, eval_every=2, patience=10,
                          tol=0.0, seq_len=16, progress=False)
    assert hook_count(native_bridge) == hooks and same_weights(before, native_bridge)
    assert all(p.grad is None for p in native_bridge.parameters())
    info = lens.training_info
    assert info["method"] == "fast" and info["stopped"] == "steps" and info["steps"] == 6
    history = lens.history
    held = history[history.split == "held_out"]
    assert sorted(held.step.unique()) == [0, 2, 4, 6]
    # Every step's training KL, at the step count of the translators it was measured on (0: the closed form).
    train = history[history.split == "train"]
    assert sorted(train.step.unique()) == [0, 1, 2, 3, 4, 5] and (train.groupby("step").layer.nunique() == lens.n_layers).all()
    assert set(held.layer) == set(range(lens.n_layers)) and (history.kl >= 0).all()
    # The best evaluated translators are kept: never worse than the closed form alone.
    by_step = held.groupby("step").kl.mean()
    assert info["best_held_out_kl_mean"] == pytest.approx(by_step.min())
    assert info["best_held_out_kl_mean"] <= by_step.loc[0]
    # held_out_kl is that of the returned translators: the best step's per-layer KL, not the last one's.
    best_step = by_step.idxmin()
    assert info["held_out_kl"] == pytest.approx(held[held.step == best_step].sort_values("layer").kl.tolist())
    assert len(info["converged"]) == lens.n_layers
    res = evaluate(native_bridge, train_texts, lens=lens, n_tokens=None, progress=False).to_pandas()
    inner = res[res.layer < lens.n_layers]
    assert inner[inner.lens == "tuned"].kl.mean() < 0.8 * inner[inner.lens == "logit"].kl.mean()
    assert lens.plot_history() is not None


def test_refinement_stops_on_plateau_on_time_or_not_at_all(native_bridge, train_texts):
    common = dict(n_tokens=96, seq_len=16, progress=False)
    plateau = fit_tuned_lens(native_bridge, train_texts, max_steps=50, eval_every=1, patience=1, tol=10.0, **common)
    assert plateau.training_info["stopped"] == "plateau" and plateau.training_info["steps"] == 1
    timed = fit_tuned_lens(native_bridge, train_texts, max_steps=50, max_seconds=0.0, **common)
    assert timed.training_info["stopped"] == "time" and timed.training_info["steps"] == 1
    # The step the budget allowed is evaluated, not run and thrown away with the closed form kept.
    assert set(timed.history.query("split == 'held_out'").step) == {0, 1}
    closed = fit_tuned_lens(native_bridge, train_texts, max_steps=0, **common)
    assert closed.training_info["stopped"] == "closed form only" and set(closed.history.step) == {0}
    no_refine = fit_tuned_lens(native_bridge, train_texts, refine=False, **common)
    assert torch.equal(no_refine.linear_map(1), closed.linear_map(1))


def test_halves_fit_disjoint_texts_and_survive_save_and_load(native_bridge, tmp_path):
    texts = [f"{a} {b}" for a in ("the cat sat on the mat", "a dog ran in the park", "my friend reads a book")
             for b in ("every night", "under the bridge", "a song", "in the park")]
    lens = fit_tuned_lens(native_bridge, texts, n_tokens=120, max_steps=0, seq_len=16, halves=True, progress=False)
    a, b = lens.halves
    info = lens.training_info
    assert a.training_info["n_train"] + b.training_info["n_train"] == info["n_train"]
    assert min(a.training_info["n_train"], b.training_info["n_train"]) > 0
    assert not torch.equal(a.linear_map(1), b.linear_map(1)) and not torch.equal(a.linear_map(1), lens.linear_map(1))
    assert len(info["data_gain"]) == lens.n_layers and len(info["halves_held_out_kl"]) == 2
    halves_kl = np.mean(info["halves_held_out_kl"], axis=0)
    np.testing.assert_allclose(info["data_gain"], (halves_kl - info["held_out_kl"]) / halves_kl)
    lens.save(tmp_path / "lens")
    loaded = TunedLens.load(tmp_path / "lens", native_bridge)
    assert loaded.halves is not None
    for mine, theirs in zip(lens.halves, loaded.halves):
        assert torch.equal(mine.linear_map(2), theirs.linear_map(2))
    assert TunedLens.load(tmp_path / "lens" / "half-0", native_bridge).halves is None


def test_history_holds_every_step_of_the_lens_and_both_halves_and_survives_save_and_load(native_bridge, tmp_path):
    texts = [f"{a} {b}" for a in ("the cat sat on the mat", "a dog ran in the park", "my friend reads a book")
             for b in ("every night", "under the bridge", "a song", "in the park")]
    lens = fit_tuned_lens(native_bridge, texts, n_tokens=120, max_steps=5, eval_every=2, patience=10, tol=0.0,
                          seq_len=16, halves=True, progress=False)
    history = lens.training_history()
    table = history.to_pandas()
    assert history.params["parts"] == ["lens", "half 0", "half 1"] and history.params["train_per_step"] is True
    for part, member in zip(history.params["parts"], (lens, *lens.halves)):
        rows = table[table.part == part]
        steps = member.training_info["steps"]
        assert steps == history.params["steps"][part] == 5 and member.training_info["stopped"] == "steps"
        # One training KL per step taken (at the updates made before it: 0 .. steps - 1), for every layer;
        # the held-out KL at the closed form, every evaluation and the last step.
        train, held = rows[rows.split == "train"], rows[rows.split == "held_out"]
        assert sorted(train.step.unique()) == list(range(steps))
        assert sorted(held.step.unique()) == [0, 2, 4, 5]
        assert (rows.groupby(["split", "step"]).layer.nunique() == lens.n_layers).all() and (rows.kl >= 0).all()
        assert rows.seconds.is_monotonic_increasing  # recorded in the order measured
        # The closed form's held-out KL is recorded as such, and the kept lens is never worse.
        start = held[held.step == 0].kl.mean()
        assert member.training_info["closed_form_held_out_kl_mean"] == pytest.approx(start)
        assert member.training_info["best_held_out_kl_mean"] <= start
    means = history.means()
    assert set(means.part) == {"lens", "half 0", "half 1"} and len(means) == 3 * (5 + 4)
    # The figure draws the lens and both halves: a training and a held-out line each (plus the lens's layers).
    named = {trace.name for trace in history.plot().data if trace.showlegend is not False}
    assert named == {f"{part}: {split}" for part in ("lens", "half 0", "half 1")
                     for split in ("training KL (every step)", "held-out KL")}
    assert {trace.name for trace in lens.plot_history().data} == {trace.name for trace in history.plot().data}
    lens.save(tmp_path / "lens")
    loaded = TunedLens.load(tmp_path / "lens", native_bridge).training_history().to_pandas()
    pd.testing.assert_frame_equal(loaded, table)


def test_histories_of_lenses_fitted_before_per_step_records_still_load_and_plot(native_bridge, tmp_path):
    """A cached lens of geolens 0.3.0 recorded the training KL only at evaluations (the mean since the last):
    it loads as it is, and its figure says what its training line is."""
    import json

    lens = fit_tuned_lens(native_bridge, ["the cat sat on the mat every night"] * 12, n_tokens=96, max_steps=0,
                          seq_len=16, progress=False)
    lens.save(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    config["training"]["history"] += [{"step": 20, "seconds": 1.0, "split": split, "layer": layer, "kl": 1.0}
                                      for split in ("train", "held_out") for layer in range(lens.n_layers)]
    del config["training"]["closed_form_held_out_kl_mean"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    old = TunedLens.load(tmp_path / "old", native_bridge).training_history()
    assert old.params["train_per_step"] is False and old.params["parts"] == ["lens"]
    assert "lens: training KL (mean since last evaluation)" in {trace.name for trace in old.plot().data}


def test_halves_need_two_texts_and_the_fast_method(native_bridge, tmp_path):
    with pytest.raises(ValueError, match="halves=True"):
        fit_tuned_lens(native_bridge, ["the cat sat on the mat " * 30], n_tokens=64, max_steps=0, seq_len=16,
                       halves=True, progress=False)
    with pytest.raises(ValueError, match="halves=True needs method='fast'"):
        cached_tuned_lens(native_bridge, ["the cat sat"] * 4, method="reference", halves=True, cache_dir=tmp_path)
    with pytest.raises(TypeError, match="halves"):
        fit_tuned_lens(native_bridge, ["the cat sat"] * 4, halves="yes", progress=False)


def test_cache_keys_the_halves(native_bridge, train_texts, tmp_path):
    common = dict(n_tokens=96, max_steps=0, seq_len=16, cache_dir=tmp_path, progress=False)
    plain = cached_tuned_lens(native_bridge, train_texts, **common)
    with_halves = cached_tuned_lens(native_bridge, train_texts, halves=True, **common)
    assert plain.halves is None and with_halves.halves is not None and plain.cache_dir != with_halves.cache_dir
    again = cached_tuned_lens(native_bridge, train_texts, halves=True, **common)
    assert again.cache_dir == with_halves.cache_dir
    assert torch.equal(again.halves[1].linear_map(0), with_halves.halves[1].linear_map(0))


def test_plateau_and_convergence_on_planted_curves():
    """The refinement's stopping rules, on held-out curves whose answer is known."""
    from geolens.lens.fit import _converged, _plateau

    falling = [torch.tensor([8.0, 4.0]) / (i + 1) for i in range(5)]  # halves, thirds, ...: still improving
    flat = [torch.tensor([2.0, 1.0]), torch.tensor([1.999, 1.0]), torch.tensor([1.998, 1.0])]
    assert not _plateau(falling, patience=2, tol=0.01) and _plateau(flat, patience=2, tol=0.01)
    assert not _plateau(flat[:2], patience=2, tol=0.01)  # fewer evaluations than the patience: no plateau yet
    # Means 6, 3, 2, 1.5, 1.2: over the last two evaluations the mean fell from 2 to 1.2, by 0.4 of itself.
    assert _plateau(falling, patience=2, tol=0.41) and not _plateau(falling, patience=2, tol=0.39)
    # Per layer: layer 1 moved by 0.5 of its largest value, layer 0 by 0.1 %.
    moving = [torch.tensor([1.0, 2.0]), torch.tensor([0.999, 1.5]), torch.tensor([1.0, 1.0])]
    assert _converged(moving, patience=2, tol=0.01, n_layers=2, closed_form_only=False) == [True, False]
    assert _converged(moving, patience=2, tol=0.6, n_layers=2, closed_form_only=False) == [True, True]
    assert _converged(moving[:1], patience=2, tol=0.01, n_layers=2, closed_form_only=True) == [True, True]
    assert _converged(moving[:2], patience=2, tol=0.01, n_layers=2, closed_form_only=False) == [False, False]


def test_one_refinement_step_descends_the_exact_kl(native_bridge):
    """With plain SGD the step is autograd's gradient of the summed mean KL (scipy-checked above) per layer."""
    from geolens.lens.fit import _refine_step

    g = torch.Generator().manual_seed(5)
    lens = TunedLens(native_bridge)
    with torch.no_grad():
        for translator in lens.translators:
            translator.weight.normal_(0, 0.05, generator=g)
    rows = torch.randn(lens.n_layers + 1, 6, lens.d_model, generator=g)
    w_u = lens.adapter.unembed_matrix("raw").float().detach()
    b_u = lens.adapter.unembed_bias()
    b_u = None if b_u is None else b_u.detach()
    reference = TunedLens(native_bridge)
    reference.translators.load_state_dict(lens.translators.state_dict())
    params = list(reference.translators.parameters())
    log_p = torch.log_softmax(reference(rows[-1], lens.n_layers, w_u=w_u, b_u=b_u).detach().float(), dim=-1)
    losses = [kl_rows(log_p, reference(rows[layer], layer, w_u=w_u, b_u=b_u)).mean() for layer in range(lens.n_layers)]
    grads = torch.autograd.grad(torch.stack(losses).sum(), params)  # the translators' only: the model keeps no grad
    lr = 0.5
    kl = _refine_step(lens, rows, torch.optim.SGD(lens.translators.parameters(), lr=lr), w_u, w_u, b_u, None)
    torch.testing.assert_close(kl, torch.stack(losses).detach(), rtol=1e-4, atol=1e-6)
    for mine, ref, grad in zip(lens.translators.parameters(), params, grads):
        torch.testing.assert_close(mine.detach(), ref.detach() - lr * grad, rtol=1e-4, atol=1e-6)
        assert grad.abs().max() > 0  # the step moved something
    assert all(p.grad is None for p in native_bridge.parameters())


def test_fit_target_is_the_models_own_output(transformed_output):
    """The tuned lens is fitted to the distribution the model outputs (soft-cap, scale, head included)."""
    model, hf = transformed_output
    tokens = model.to_tokens(["the cat sat on the mat", "a dog ran in the park"])
    resid, _ = residual_stream(model, tokens)
    adapter = as_adapter(model)
    p, p_log_p = _target(adapter, resid[-1].reshape(-1, adapter.d_model), adapter.unembed_matrix("raw"),
                         adapter.unembed_bias())
    with torch.no_grad():
        reference = torch.softmax(hf(tokens, use_cache=False).logits.float(), dim=-1).reshape(p.shape)
    torch.testing.assert_close(p, reference, atol=1e-5, rtol=1e-4)
