"""Lens and update geometry on the real offline default model (SmolLM2-135M, RMSNorm): slow."""

import math

import pytest
import torch

import geolens
from geolens.analyses.updates import updates
from geolens.lens import TunedLens, evaluate, layer_logits, residual_stream
from geolens.model import as_adapter
from tests.helpers import hook_count, same_weights, weights

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default_model():
    try:
        return geolens.load_default_model(device="cpu", progress=False)
    except RuntimeError as error:
        pytest.skip(str(error))


def test_logit_lens_matches_hand_rmsnorm_and_tl(default_model):
    adapter = as_adapter(default_model)
    tokens, _ = adapter.tokenize(["The bank raised interest rates on Tuesday."])
    resid, logits = residual_stream(default_model, tokens)
    ours = layer_logits(default_model, tokens)
    ln = default_model.ln_final
    eps = float(getattr(ln.original_component, "variance_epsilon", default_model.cfg.eps))
    h = resid.double()
    normed = h / (h.pow(2).mean(-1, keepdim=True) + eps).sqrt() * ln.weight.double()  # RMSNorm: no centring, no bias
    by_hand = normed @ adapter.unembed_matrix("raw").double()
    torch.testing.assert_close(ours.double(), by_hand, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(ours[-1], logits, atol=2e-4, rtol=1e-4)
    _, cache = default_model.run_with_cache(tokens)
    if hasattr(cache, "accumulated_resid"):
        stack = cache.accumulated_resid(apply_ln=True) @ adapter.unembed_matrix("raw")
        torch.testing.assert_close(ours, stack, atol=2e-4, rtol=1e-4)


def test_updates_and_evaluate_on_default_model(default_model):
    texts = geolens.default_texts(n=4, seed=0)
    hooks, before = hook_count(default_model), weights(default_model)
    upd = updates(default_model, texts, n_tokens=150, max_length=48, progress=False).to_pandas()
    assert len(upd) == 30 and upd.drop(columns="layer").map(math.isfinite).all().all()
    assert ((upd.orthogonality >= 0) & (upd.orthogonality <= 1)).all()
    res = evaluate(default_model, texts, lens=TunedLens(default_model), n_tokens=100, max_length=48,
                   progress=False).to_pandas()
    assert hook_count(default_model) == hooks and same_weights(before, default_model)
    last = res[res.layer == 30]
    assert (last["hit@1"] == 1.0).all() and (last.kl < 1e-4).all()
    assert res[res.layer == 0]["hit@1"].max() < 0.5
