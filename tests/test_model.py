"""Tests for geolens.model.ModelAdapter over every TransformerLens model kind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from geolens.model import ModelAdapter, as_adapter, supported_kinds
from geolens.sites import FINAL_SITE, SITES as _ALL_SITES

SITES = tuple(s for s in _ALL_SITES if s != FINAL_SITE)  # the sites every block has a hook for

from tests.conftest import (
    D_MODEL, D_VOCAB, N_LAYERS, NEOX_VOCAB, make_hooked_model, make_native_bridge, warm_up,
)

ATOL = 1e-5
EXPECTED_KIND = {"hooked_model": "hooked_transformer", "native_bridge": "bridge", "neox_bridge": "bridge"}


def _fixture_name(request: pytest.FixtureRequest) -> str:
    return request.node.callspec.params["any_model"]


def _tokens(adapter: ModelAdapter, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    return adapter.tokenize(texts)


def _capture(adapter: ModelAdapter, tokens: torch.Tensor, mask: torch.Tensor, name: str):
    """Run once with one saving hook on ``name``; return (logits, activation)."""
    seen: list[torch.Tensor] = []

    def save(tensor: torch.Tensor, hook: Any) -> None:
        seen.append(tensor.detach().clone())

    logits = adapter.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[(name, save)])
    assert len(seen) == 1
    return logits, seen[0]


def _hook_counts(model: Any) -> dict[str, int]:
    return {name: len(hp.fwd_hooks) + len(hp.bwd_hooks) for name, hp in model.hook_dict.items()}


def _ln_final_params(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The final norm's weight and bias, read straight off the model (not via the adapter)."""
    ln = model.ln_final
    if hasattr(ln, "w"):
        return ln.w.detach(), ln.b.detach()
    return ln.weight.detach(), ln.bias.detach()


# --------------------------------------------------------------------------- basic facts
def test_shapes_and_kind(any_model: Any, request: pytest.FixtureRequest) -> None:
    name = _fixture_name(request)
    adapter = ModelAdapter(any_model)
    assert adapter.kind == EXPECTED_KIND[name]
    assert adapter.model is any_model
    assert adapter.n_layers == N_LAYERS
    assert adapter.d_model == D_MODEL
    assert adapter.d_vocab == (NEOX_VOCAB if name == "neox_bridge" else D_VOCAB)
    assert adapter.device == torch.device("cpu")
    assert adapter.dtype == torch.float32
    assert adapter.tokenizer is not None
    assert adapter.bos_token_id == adapter.tokenizer.bos_token_id == 0
    assert adapter.kind in supported_kinds()
    assert isinstance(adapter.name, str) and repr(adapter).startswith("ModelAdapter(")


def test_parallel_flags(any_model: Any, request: pytest.FixtureRequest) -> None:
    adapter = ModelAdapter(any_model)
    parallel = _fixture_name(request) == "neox_bridge"
    assert adapter.parallel_attn_mlp is parallel
    assert adapter.has_resid_mid is (not parallel)


def test_as_adapter_is_idempotent(native_bridge: Any) -> None:
    adapter = as_adapter(native_bridge)
    assert isinstance(adapter, ModelAdapter)
    assert as_adapter(adapter) is adapter


@pytest.mark.parametrize("bad", [torch.nn.Linear(2, 2), "gpt2", None, 3])
def test_non_model_raises_type_error_naming_kinds(bad: Any) -> None:
    with pytest.raises(TypeError) as err:
        ModelAdapter(bad)
    message = str(err.value)
    assert "TransformerBridge" in message
    assert type(bad).__name__ in message
    with pytest.raises(TypeError):
        as_adapter(bad)


# --------------------------------------------------------------------------- hook names
def test_hook_names_exist_for_every_site_and_block(any_model: Any) -> None:
    adapter = ModelAdapter(any_model)
    hooks = any_model.hook_dict
    for site in SITES:
        if site == "resid_mid" and not adapter.has_resid_mid:
            continue
        for block in range(adapter.n_layers):
            name = adapter.block_hook_name(site, block)
            assert name == f"blocks.{block}.hook_{site}"
            assert name in hooks
    assert adapter.final_hook_name in hooks
    assert adapter.block_hook_name("resid_post", torch.tensor(1).item()) == "blocks.1.hook_resid_post"
    assert adapter.block_hook_name("resid_pre", np.int64(1)) == "blocks.1.hook_resid_pre"


def test_resid_mid_absent_for_parallel_neox(neox_bridge: Any) -> None:
    adapter = ModelAdapter(neox_bridge)
    with pytest.raises(ValueError, match="parallel"):
        adapter.block_hook_name("resid_mid", 0)


def test_attn_only_model_has_no_mlp_sites() -> None:
    adapter = ModelAdapter(make_native_bridge(attn_only=True))
    assert adapter.has_resid_mid is False and adapter.parallel_attn_mlp is False
    for site in ("mlp_out", "resid_mid"):
        with pytest.raises(ValueError, match="not available"):
            adapter.block_hook_name(site, 0)
    assert adapter.block_hook_name("attn_out", 1) == "blocks.1.hook_attn_out"


def test_parallel_hooked_transformer_has_no_resid_mid() -> None:
    adapter = ModelAdapter(make_hooked_model(parallel_attn_mlp=True))
    assert adapter.parallel_attn_mlp is True and adapter.has_resid_mid is False
    with pytest.raises(ValueError, match="parallel"):
        adapter.block_hook_name("resid_mid", 0)


@pytest.mark.parametrize("site, block", [("resid", 0), ("hook_resid_post", 0), ("resid_post", N_LAYERS), ("resid_post", -1), ("resid_post", 1.0), ("resid_post", True)])
def test_hook_name_rejects_bad_arguments(native_bridge: Any, site: str, block: Any) -> None:
    with pytest.raises(ValueError):
        ModelAdapter(native_bridge).block_hook_name(site, block)


# --------------------------------------------------------------------------- readout
def test_final_hook_times_unembed_equals_logits(any_model: Any, texts: list[str]) -> None:
    adapter = ModelAdapter(any_model)
    tokens, mask = _tokens(adapter, texts)
    logits, final = _capture(adapter, tokens, mask, adapter.final_hook_name)
    w_u = adapter.unembed_matrix("raw")
    b_u = adapter.unembed_bias()
    assert w_u.shape == (adapter.d_model, adapter.d_vocab)
    assert not w_u.requires_grad
    predicted = final @ w_u + (0 if b_u is None else b_u)
    torch.testing.assert_close(predicted, logits, atol=ATOL, rtol=0)


def test_folded_readout_is_diag_ln_weight_times_w_u(any_model: Any) -> None:
    adapter = ModelAdapter(any_model)
    weight, _ = _ln_final_params(any_model)
    by_hand = torch.diag(weight) @ any_model.W_U.detach()
    folded = adapter.unembed_matrix("folded")
    torch.testing.assert_close(folded, by_hand, atol=1e-6, rtol=0)
    assert not torch.allclose(folded, adapter.unembed_matrix("raw"))  # the fixtures' norms are jittered
    assert not folded.requires_grad


def test_folded_readout_reads_the_normalized_state(any_model: Any, texts: list[str]) -> None:
    """normalized @ (diag(w) W_U) + (b @ W_U + b_U) reproduces the logits."""
    adapter = ModelAdapter(any_model)
    tokens, mask = _tokens(adapter, texts)
    logits, normalized = _capture(adapter, tokens, mask, "ln_final.hook_normalized")
    _, bias = _ln_final_params(any_model)
    raw = adapter.unembed_matrix("raw")
    b_u = adapter.unembed_bias()
    predicted = normalized @ adapter.unembed_matrix("folded") + bias @ raw + (0 if b_u is None else b_u)
    torch.testing.assert_close(predicted, logits, atol=ATOL, rtol=0)


def test_unknown_readout_raises(native_bridge: Any) -> None:
    with pytest.raises(ValueError, match="readout"):
        ModelAdapter(native_bridge).unembed_matrix("centered")


def test_processing_of_raw_models(any_model: Any, request: pytest.FixtureRequest) -> None:
    processing = ModelAdapter(any_model).processing
    assert processing["fold_ln"] is False
    assert processing["center_unembed"] is False
    assert processing["normalization_type"] == "LN"
    if _fixture_name(request) != "hooked_model":
        assert processing["weights_processed"] is False
        assert processing["center_writing_weights"] is False
        assert processing["inferred"] == ()


def test_processed_hooked_transformer() -> None:
    """fold_ln turns ln_final into LNPre: folded readout == raw, logits still reproduced."""
    model = make_hooked_model()
    model.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    adapter = ModelAdapter(model)
    assert adapter.processing["fold_ln"] is True
    assert adapter.processing["normalization_type"] == "LNPre"
    assert adapter.processing["center_unembed"] is True
    assert "center_unembed" in adapter.processing["inferred"]
    torch.testing.assert_close(adapter.unembed_matrix("folded"), adapter.unembed_matrix("raw"))
    _check_final_readout(adapter)


def test_processed_bridge() -> None:
    """enable_compatibility_mode() folds and centres; the adapter infers both from the weights."""
    bridge = make_native_bridge()
    adapter = ModelAdapter(bridge)
    assert adapter.processing["fold_ln"] is False
    bridge.enable_compatibility_mode(disable_warnings=True)  # processing is re-read after this
    assert adapter.processing["weights_processed"] is True
    assert adapter.processing["compatibility_mode"] is True
    assert adapter.processing["fold_ln"] is True
    assert adapter.processing["center_unembed"] is True
    assert set(adapter.processing["inferred"]) == {"fold_ln", "center_unembed"}
    torch.testing.assert_close(adapter.unembed_matrix("folded"), adapter.unembed_matrix("raw"))
    assert adapter.block_hook_name("resid_mid", 1) == "blocks.1.hook_resid_mid"
    _check_final_readout(adapter)


def _check_final_readout(adapter: ModelAdapter) -> None:
    tokens = torch.tensor([[0, 3, 4, 5, 6]])
    logits, final = _capture(adapter, tokens, torch.ones_like(tokens), adapter.final_hook_name)
    b_u = adapter.unembed_bias()
    torch.testing.assert_close(final @ adapter.unembed_matrix() + (0 if b_u is None else b_u), logits, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------- offset RMSNorm (Gemma)
def _rms_normalize(h: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalisation without a weight: what the folded readout reads."""
    return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def test_offset_rmsnorm_folded_readout_matches_hf(gemma3_bridge: Any, gemma3_dir: Any, texts: list[str]) -> None:
    """Gemma stores ln_final's weight as ``w - 1``: the folded readout is ``diag(1 + w) @ W_U``.

    rms_normalize(h_L) @ folded + b_U reproduces the bridge's logits and those of
    Hugging Face's own Gemma3ForCausalLM; ``diag(w) @ W_U`` (the offset forgotten) does not.
    """
    from transformers import AutoModelForCausalLM

    adapter = ModelAdapter(gemma3_bridge)
    assert adapter.processing["fold_ln"] is False and adapter.processing["normalization_type"] == "RMS"
    hf = AutoModelForCausalLM.from_pretrained(str(gemma3_dir), dtype=torch.float32).eval()
    stored = hf.model.norm.weight.detach()  # w - 1, as Hugging Face keeps it
    raw, folded = adapter.unembed_matrix("raw"), adapter.unembed_matrix("folded")
    torch.testing.assert_close(folded, (1.0 + stored).unsqueeze(-1) * raw, atol=1e-6, rtol=0)
    b_u = adapter.unembed_bias()
    eps = hf.config.rms_norm_eps
    last = adapter.block_hook_name("resid_post", N_LAYERS - 1)  # the state ln_final reads
    for text in texts:  # one text at a time: no padding
        tokens = gemma3_bridge.to_tokens(text)
        logits, h_last = _capture(adapter, tokens, torch.ones_like(tokens), last)
        with torch.no_grad():
            theirs = hf(tokens).logits
        normalized = _rms_normalize(h_last, eps)
        predicted = normalized @ folded + (0 if b_u is None else b_u)
        torch.testing.assert_close(predicted, logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(predicted, theirs, atol=ATOL, rtol=0)
        forgot_offset = normalized @ (stored.unsqueeze(-1) * raw) + (0 if b_u is None else b_u)
        assert float((forgot_offset - logits).abs().max()) > 1000 * ATOL


def test_offset_rmsnorm_after_fold_ln(gemma3_dir: Any) -> None:
    """Processing folds ``1 + w`` into W_U and leaves a stored 0 (effective 1): folded == raw, fold_ln inferred."""
    from geolens.model import boot_bridge

    bridge = warm_up(boot_bridge(gemma3_dir, device="cpu").eval())
    adapter = ModelAdapter(bridge)
    assert not torch.allclose(adapter.unembed_matrix("folded"), adapter.unembed_matrix("raw"))
    bridge.enable_compatibility_mode(disable_warnings=True)
    assert adapter.processing["fold_ln"] is True and "fold_ln" in adapter.processing["inferred"]
    torch.testing.assert_close(adapter.unembed_matrix("folded"), adapter.unembed_matrix("raw"))
    _check_final_readout(adapter)
    tokens = torch.tensor([[0, 3, 4, 5, 6]])
    last = adapter.block_hook_name("resid_post", N_LAYERS - 1)
    logits, h_last = _capture(adapter, tokens, torch.ones_like(tokens), last)
    b_u = adapter.unembed_bias()
    predicted = _rms_normalize(h_last, bridge.cfg.eps) @ adapter.unembed_matrix("folded") + (0 if b_u is None else b_u)
    torch.testing.assert_close(predicted, logits, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------- tokens
def test_tokenize_matches_to_tokens_right_padded(any_model: Any, texts: list[str]) -> None:
    adapter = ModelAdapter(any_model)
    tokens, mask = adapter.tokenize(texts)
    assert tokens.dtype == mask.dtype == torch.long
    assert tokens.shape == mask.shape and tokens.shape[0] == len(texts)
    for i, text in enumerate(texts):
        own = any_model.to_tokens(text)[0]
        n = int(mask[i].sum())
        assert n == own.numel()
        assert torch.equal(tokens[i, :n], own)
        assert torch.all(mask[i, :n] == 1) and torch.all(mask[i, n:] == 0)  # right padding
        assert torch.all(tokens[i, n:] == adapter.pad_token_id)
    # NeoX (Pythia) does not prepend BOS by default; the others do.
    assert bool((tokens[:, 0] == adapter.bos_token_id).all()) is adapter.prepends_bos


def test_tokenize_max_length(native_bridge: Any, texts: list[str]) -> None:
    tokens, mask = ModelAdapter(native_bridge).tokenize(texts, max_length=3)
    assert tokens.shape == (len(texts), 3)
    assert torch.all(mask.sum(-1) == 3)
    with pytest.raises(ValueError):
        ModelAdapter(native_bridge).tokenize(texts, max_length=0)


def test_tokenize_without_tokenizer_raises() -> None:
    adapter = ModelAdapter(make_native_bridge(tokenizer=None))
    assert adapter.tokenizer is None and adapter.bos_token_id is None
    with pytest.raises(ValueError, match="tokenizer"):
        adapter.tokenize(["the cat"])


def test_padding_does_not_change_real_positions(any_model: Any, texts: list[str]) -> None:
    adapter = ModelAdapter(any_model)
    tokens, mask = adapter.tokenize(texts)
    batched = adapter.run_with_hooks(tokens, attention_mask=mask)
    for i in range(len(texts)):
        n = int(mask[i].sum())
        alone = adapter.run_with_hooks(tokens[i : i + 1, :n])
        torch.testing.assert_close(batched[i, :n], alone[0], atol=ATOL, rtol=0)


# --------------------------------------------------------------------------- hooks hygiene
class _Boom(RuntimeError):
    pass


def _raise(tensor: torch.Tensor, hook: Any) -> None:
    raise _Boom("from inside a hook")


def test_hooks_removed_after_run_with_hooks_raises(any_model: Any) -> None:
    adapter = ModelAdapter(any_model)
    before = _hook_counts(any_model)
    tokens = torch.tensor([[0, 3, 4]])
    names = [adapter.block_hook_name("resid_post", 0), adapter.block_hook_name("mlp_out", 1), adapter.final_hook_name]
    with pytest.raises(_Boom):
        adapter.run_with_hooks(tokens, fwd_hooks=[(names[0], lambda t, hook: None), (names[1], _raise)])
    assert _hook_counts(any_model) == before
    adapter.run_with_hooks(tokens, fwd_hooks=[(n, lambda t, hook: None) for n in names])
    assert _hook_counts(any_model) == before


def test_hooks_context_manager_removes_on_exception(any_model: Any) -> None:
    adapter = ModelAdapter(any_model)
    before = _hook_counts(any_model)
    name = adapter.block_hook_name("attn_out", 0)
    with pytest.raises(KeyError):
        with adapter.hooks([(name, lambda t, hook: None)]):
            assert _hook_counts(any_model)[name] == before[name] + 1
            raise KeyError("user error")
    assert _hook_counts(any_model) == before


def test_hook_can_edit_activations(native_bridge: Any) -> None:
    adapter = ModelAdapter(native_bridge)
    tokens = torch.tensor([[0, 3, 4]])
    clean = adapter.run_with_hooks(tokens)
    zeroed = adapter.run_with_hooks(tokens, fwd_hooks=[(adapter.final_hook_name, lambda t, hook: torch.zeros_like(t))])
    b_u = adapter.unembed_bias()
    torch.testing.assert_close(zeroed, torch.zeros_like(zeroed) + b_u, atol=ATOL, rtol=0)
    assert not torch.allclose(clean, zeroed)
    assert not clean.requires_grad
    assert adapter.run_with_hooks(tokens, grad=True).requires_grad


def test_adapter_changes_no_weights(any_model: Any, texts: list[str]) -> None:
    before = {k: v.detach().clone() for k, v in any_model.state_dict().items()}
    adapter = ModelAdapter(any_model)
    tokens, mask = adapter.tokenize(texts)
    adapter.unembed_matrix("raw")
    adapter.unembed_matrix("folded")
    adapter.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[(adapter.final_hook_name, lambda t, hook: None)])
    with pytest.raises(_Boom):
        adapter.run_with_hooks(tokens, fwd_hooks=[(adapter.block_hook_name("resid_pre", 0), _raise)])
    after = any_model.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(value, after[key]), key
