"""Logit lens against TransformerLens's own accumulated_resid(apply_ln=True) @ W_U + b_U."""

import pytest
import torch

from geolens.lens import LogitLens, layer_logits, residual_stream
from geolens.model import as_adapter
from tests.helpers import hook_count, padded_tokens, same_weights, weights


def _reference(model, tokens):
    """TL's logit lens: the accumulated residual stream with ln_final applied, times W_U (+ b_U)."""
    _, cache = model.run_with_cache(tokens)
    stack = cache.accumulated_resid(apply_ln=True)  # [L + 1, B, T, d]
    adapter = as_adapter(model)
    out = stack @ adapter.unembed_matrix("raw")
    bias = adapter.unembed_bias()
    return out + bias if bias is not None else out


def test_logit_lens_equals_transformer_lens_accumulated_resid(any_model):
    adapter = as_adapter(any_model)
    tokens, _ = padded_tokens(adapter.d_vocab, lengths=(10, 10))
    hooks, before = hook_count(any_model), weights(any_model)
    ours = layer_logits(any_model, tokens)
    assert hook_count(any_model) == hooks and same_weights(before, any_model)
    assert ours.shape == (adapter.n_layers + 1, 2, 10, adapter.d_vocab)
    torch.testing.assert_close(ours, _reference(any_model, tokens), atol=1e-5, rtol=1e-5)


def test_logit_lens_equals_hand_normalisation(native_bridge):
    """ln_final applied by hand (LayerNorm: centre, divide by the rms, times w, plus b)."""
    adapter = as_adapter(native_bridge)
    tokens, _ = padded_tokens(adapter.d_vocab, lengths=(8,))
    resid, logits = residual_stream(native_bridge, tokens)
    ln = native_bridge.ln_final
    eps = native_bridge.cfg.eps
    h = resid.double()
    x = h - h.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    x = x * ln.weight.double() + ln.bias.double()
    by_hand = x @ adapter.unembed_matrix("raw").double() + adapter.unembed_bias().double()
    torch.testing.assert_close(layer_logits(native_bridge, tokens).double(), by_hand, atol=1e-5, rtol=1e-5)
    # the last layer is the model's own output
    torch.testing.assert_close(by_hand[-1].float(), logits, atol=1e-5, rtol=1e-5)


def test_logit_lens_last_layer_is_the_logits_of_an_offset_rmsnorm_model(gemma3_bridge):
    """Gemma-3 (ln_final multiplies by 1 + w): the raw readout at layer L is the model's own output."""
    adapter = as_adapter(gemma3_bridge)
    tokens = gemma3_bridge.to_tokens("the cat sat on the mat")
    resid, logits = residual_stream(gemma3_bridge, tokens)
    torch.testing.assert_close(LogitLens(adapter)(resid[-1], layer=adapter.n_layers), logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer_logits(gemma3_bridge, tokens)[-1], logits, atol=1e-5, rtol=1e-5)


def test_bad_layer_and_width(native_bridge):
    lens = LogitLens(native_bridge)
    with pytest.raises(ValueError, match="layer"):
        lens(torch.zeros(3, lens.d_model), layer=lens.n_layers + 1)
    with pytest.raises(ValueError, match="d_model"):
        lens(torch.zeros(3, lens.d_model + 1), layer=0)
    assert list(lens.parameters()) == [] and lens.state_dict() == {}


def test_logit_lens_reads_the_models_output_transform(transformed_output):
    """At the last layer the lens gives the Hugging Face model's own log-probabilities, which the plain
    ``ln_final(h) @ W_U + b_U`` misses (soft-cap, logit scale, logit divisor, prediction head)."""
    model, hf = transformed_output
    adapter = as_adapter(model)
    tokens = model.to_tokens(["the cat sat on the mat", "a dog ran in the park"])
    with torch.no_grad():
        reference = torch.log_softmax(hf(tokens, use_cache=False).logits.float(), dim=-1)
    resid, _ = residual_stream(model, tokens)
    ours = torch.log_softmax(LogitLens(model)(resid[-1], layer=adapter.n_layers), dim=-1)
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=0)
    with torch.no_grad():
        plain = adapter.final_norm(resid[-1]) @ adapter.unembed_matrix("raw") + adapter.unembed_bias()
    assert float((torch.log_softmax(plain, dim=-1) - reference).abs().max()) > 0.05


@pytest.mark.parametrize("make", ["make_native_bridge", "make_hooked_model"])
def test_logit_lens_applies_a_native_final_soft_cap(make):
    """A TransformerLens-built model with ``output_logits_soft_cap``: the lens's last layer is its own output."""
    import tests.conftest as fixtures

    model = getattr(fixtures, make)(output_logits_soft_cap=0.5)
    adapter = as_adapter(model)
    tokens, _ = padded_tokens(adapter.d_vocab, lengths=(9, 9))
    resid, logits = residual_stream(model, tokens)
    ours = LogitLens(model)(resid[-1], layer=adapter.n_layers)
    torch.testing.assert_close(torch.log_softmax(ours, -1), torch.log_softmax(logits, -1), atol=1e-5, rtol=0)
    with torch.no_grad():
        plain = adapter.final_norm(resid[-1]) @ adapter.unembed_matrix("raw")
    assert float(plain.abs().max()) > 1.0  # the cap changes these logits: a lens without it would be off
