"""Hit@k on planted logits, the evaluate table, plots and the cached report helper."""

import math

import pytest
import torch

from geolens.lens import EvaluateResult, TunedLens, cached_tuned_lens, evaluate, hit_at_k
from geolens.lens.train import kl_rows
from tests.helpers import hook_count, same_weights, weights

pytestmark = pytest.mark.filterwarnings("ignore:the training text was read")


def test_hit_at_k_known_answer():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0],
                           [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
                           [1.0, 1.0, 1.0, 1.0, 1.0, 9.0]])
    target = torch.tensor([0, 0, 5])
    assert hit_at_k(logits, target, 1).tolist() == [1.0, 0.0, 1.0]
    assert hit_at_k(logits, target, 5).tolist() == [1.0, 0.0, 1.0]
    assert hit_at_k(logits, target, 6).tolist() == [1.0, 1.0, 1.0]
    assert hit_at_k(logits, torch.tensor([4, 1, 0]), 2).tolist() == [0.0, 0.0, 1.0]  # a tie at the 2nd value counts
    with pytest.raises(ValueError):
        hit_at_k(logits, target, 7)


def test_kl_rows_matches_formula():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    p, q = a.softmax(-1), b.softmax(-1)
    torch.testing.assert_close(kl_rows(a.log_softmax(-1), b), (p * (p.log() - q.log())).sum(-1))
    assert kl_rows(a.log_softmax(-1), a).abs().max() < 1e-6


def test_evaluate_table_and_known_layers(any_model, texts):
    hooks, before = hook_count(any_model), weights(any_model)
    lens = TunedLens(any_model)
    res = evaluate(any_model, texts, lens=lens, n_tokens=None, progress=False)
    assert hook_count(any_model) == hooks and same_weights(before, any_model)
    assert isinstance(res, EvaluateResult)
    table = res.to_pandas()
    assert list(table.columns) == ["lens", "layer", "kl", "ce", "hit@1", "hit@5", "hit@5/hit@1"]
    L = lens.n_layers
    assert len(table) == 2 * (L + 1)
    last = table[table.layer == L]
    assert (last["hit@1"] == 1.0).all() and (last.kl.abs() < 1e-5).all()
    # an untrained tuned lens is the logit lens
    tuned, logit = table[table.lens == "tuned"].reset_index(drop=True), table[table.lens == "logit"].reset_index(drop=True)
    assert (tuned.drop(columns="lens") - logit.drop(columns="lens")).abs().max().max() < 1e-6
    assert ((table["hit@5"] >= table["hit@1"])).all()
    for _, row in table.iterrows():
        if row["hit@1"] > 0:
            assert row["hit@5/hit@1"] == pytest.approx(row["hit@5"] / row["hit@1"])
        else:
            assert math.isnan(row["hit@5/hit@1"])
    fig = res.plot()
    assert len(fig.data) == 2 * 3  # per lens: hit@1, hit@5, KL
    only_logit = evaluate(any_model, texts, n_tokens=None, progress=False).to_pandas()
    assert set(only_logit.lens) == {"logit"}


def test_evaluate_ce_matches_direct_computation(native_bridge):
    tokens = torch.tensor([[0, 3, 4, 5, 6, 7]])
    res = evaluate(native_bridge, tokens, n_tokens=None, progress=False).to_pandas()
    with torch.no_grad():
        logits = native_bridge(tokens)[0]
    # positions 1..4 have a next token; position 5 (the last) does not
    ce = torch.nn.functional.cross_entropy(logits[1:5], tokens[0, 2:6])
    row = res[res.layer == native_bridge.cfg.n_layers].iloc[0]
    assert row.ce == pytest.approx(float(ce.detach()), rel=1e-5)


def test_cached_tuned_lens_trains_once(native_bridge, texts, train_texts, tmp_path):
    lens = cached_tuned_lens(native_bridge, train_texts, cache_dir=tmp_path, method="reference", max_steps=3, tokens_per_step=16,
                             progress=False)
    quality = evaluate(native_bridge, texts, lens=lens, n_tokens=None, progress=False)
    assert {"tuned", "logit"} == set(quality.to_pandas().lens)
    folders = list(tmp_path.iterdir())
    assert len(folders) == 1 and (folders[0] / "config.json").is_file()
    import geolens.lens.cache as cache

    calls = []
    real = cache.train_tuned_lens
    cache.train_tuned_lens = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        again = cached_tuned_lens(native_bridge, train_texts, cache_dir=tmp_path, method="reference", max_steps=3,
                                  tokens_per_step=16,
                                  progress=False)
    finally:
        cache.train_tuned_lens = real
    assert calls == [] and again.cache_dir == lens.cache_dir
    assert evaluate(native_bridge, texts, lens=again, n_tokens=None, progress=False).rows == quality.rows
    with pytest.raises(TypeError, match="stepz"):
        cached_tuned_lens(native_bridge, train_texts, cache_dir=tmp_path, stepz=3)
    with pytest.raises(ValueError, match="empty"):
        cached_tuned_lens(native_bridge, [], cache_dir=tmp_path)


def test_evaluate_refuses_the_old_argument_order(native_bridge, texts):
    with pytest.raises(TypeError, match="lens=lens"):
        evaluate(TunedLens(native_bridge), native_bridge)


def test_evaluate_scores_given_states_as_its_own_capture(native_bridge, texts):
    """States another analysis captured (here with the final site too) give the table of evaluate's own capture
    of the same sample, with no forward pass; states of other tokens, or without every layer, are refused."""
    from geolens.capture import capture
    from geolens.sites import FINAL_SITE, RESIDUAL_SITE

    lens = TunedLens(native_bridge)
    with torch.no_grad():
        for translator in lens.translators:  # a lens that differs from the logit lens
            translator.weight.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(0))
    own = evaluate(native_bridge, texts, lens=lens, n_tokens=10, seed=3, progress=False).to_pandas()
    states = capture(native_bridge, texts, sites=(RESIDUAL_SITE, FINAL_SITE), n_tokens=10, seed=3, progress=False)
    hooks = hook_count(native_bridge)
    given = evaluate(native_bridge, texts, lens=lens, states=states, progress=False).to_pandas()
    assert hook_count(native_bridge) == hooks
    assert given.drop(columns="lens").sub(own.drop(columns="lens")).abs().max().max() < 1e-5
    assert (given.lens == own.lens).all() and not given[given.lens == "tuned"].kl.equals(given[given.lens == "logit"].kl)
    # Fewer n_tokens than rows: a seeded sample of the rows.
    half = evaluate(native_bridge, texts, lens=lens, states=states, n_tokens=5, seed=1, progress=False)
    again = evaluate(native_bridge, texts, lens=lens, states=states, n_tokens=5, seed=1, progress=False)
    assert half.params["n_tokens"] == 5 and half.to_pandas().equals(again.to_pandas())
    assert not half.to_pandas().kl.equals(given.kl)
    with pytest.raises(ValueError, match="not captured from these tokens"):
        evaluate(native_bridge, list(reversed(texts)), lens=lens, states=states, progress=False)
    mid = capture(native_bridge, texts, sites=("mlp_out",), n_tokens=10, seed=3, progress=False)
    with pytest.raises(ValueError, match="resid_post"):
        evaluate(native_bridge, texts, states=mid, progress=False)
    with pytest.raises(TypeError, match="states must be geolens States"):
        evaluate(native_bridge, texts, states=states[RESIDUAL_SITE], progress=False)


def test_next_tokens_and_rows_steps_on_planted_positions():
    """The evaluation's steps: the next token of each position (none past the end or at padding), and the means."""
    from geolens._sampling import seeded_subset
    from geolens.lens.evaluate import _next_tokens, _rows, _subsample

    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    rows_b, position = torch.tensor([0, 0, 1, 1]), torch.tensor([1, 2, 0, 3])
    next_ids, has_next = _next_tokens(ids, mask, rows_b, position)
    assert next_ids.tolist() == [7, 0, 9, 0] and has_next.tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="no sampled position has a next token"):
        _next_tokens(ids, mask, torch.tensor([0]), torch.tensor([2]))
    sums = {("logit", 0): torch.tensor([2.0, 3.0, 1.0, 4.0], dtype=torch.float64),
            ("logit", 1): torch.tensor([0.0, 1.0, 0.0, 4.0], dtype=torch.float64)}
    rows = _rows(sums, n=4, n_valid=2, ks=[1, 5])
    assert rows[0] == {"lens": "logit", "layer": 0, "kl": 0.5, "ce": 1.5, "hit@1": 0.25, "hit@5": 1.0, "hit@5/hit@1": 4.0}
    assert math.isnan(rows[1]["hit@5/hit@1"])  # no hit@1 at all: the ratio is undefined
    assert _subsample(10, None, 0) == slice(None) and _subsample(10, 10, 0) == slice(None)
    assert torch.equal(_subsample(10, 4, 3), seeded_subset(10, 4, 3))


def test_evaluate_measures_against_the_models_own_output(transformed_output):
    """Cross-entropy and Hit@1 at the last layer from the Hugging Face model's own logits, KL there 0."""
    model, hf = transformed_output
    tokens = model.to_tokens(["the cat sat on the mat", "a dog ran in the park"])
    with torch.no_grad():
        log_p = torch.log_softmax(hf(tokens, use_cache=False).logits.float(), dim=-1)[:, 1:-1]  # rows with a next token
    ce = -log_p.gather(-1, tokens[:, 2:].unsqueeze(-1)).mean()
    last = evaluate(model, tokens, n_tokens=None, progress=False).to_pandas().iloc[-1]
    assert last["kl"] == pytest.approx(0.0, abs=1e-6) and last["hit@1"] == 1.0
    assert last["ce"] == pytest.approx(float(ce), rel=1e-5)
