"""Every architecture TransformerLens runs: a tiny random-weight model of each, measured end to end.

TransformerLens 4.x: every text-generating architecture its bridge registers is built
from its ``transformers`` config with tiny sizes (``tests/tiny_architectures.py``), saved
with the test tokenizer, booted with :func:`geolens.model.boot_bridge`, and checked
against the Hugging Face model itself (an independent reference):

* ``capture``'s residual stream equals Hugging Face's ``output_hidden_states``;
* the logit lens at the last layer gives the model's own output distribution (its
  log-probabilities; final soft-caps, logit scales and prediction heads included);
* ``geolens.pga``, ``geolens.spectrum`` and ``geolens.lens.evaluate`` run on it and give
  finite numbers, with the logit lens's KL at the last layer 0;
* (slow) a small tuned-lens fit, ``geolens.ablation_effect`` and ``geolens.patch`` run, and
  patching the embedding of the one differing token restores the clean run.

The architectures TransformerLens registers but geolens does not measure are skipped
with the reason; those that run but whose states geolens cannot read raise a clear
error (tested). TransformerLens 3.9: the same checks on the ``HookedTransformer``
configurations it builds offline, against its own cache and logits.
"""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.lens import LogitLens, evaluate
from geolens.model import as_adapter, boot_bridge, supported_kinds
from tests.tiny_architectures import registered_architectures, save_tiny, why_not_tested

ON_TL3 = "hooked_transformer" in supported_kinds()
TOKENS = torch.tensor([[0, 5, 6, 7, 8, 9, 10, 11, 12], [0, 13, 14, 15, 16, 17, 18, 19, 3]])
# Hugging Face records these architectures' hidden states after each block (not before).
HF_STATES_AFTER_BLOCKS = frozenset({"MambaForCausalLM", "FalconMambaForCausalLM", "RwkvForCausalLM"})
# Architectures TransformerLens boots whose states geolens cannot read: the clear error each raises.
UNREADABLE = {
    "OpenAIGPTLMHeadModel": (RuntimeError, "did not fire"),  # hook_resid_post registered, never run
    "DeepseekV4ForCausalLM": (ValueError, r"\[batch, pos, d_model\]"),  # four parallel residual streams
    "HrmTextForCausalLM": (ValueError, "no hook 'blocks.0.hook_resid_pre'"),  # no blocks.* at all
}
TL_FAILURES = {
    "CodeGenForCausalLM": "TransformerLens 4.3's forward of CodeGen fails on transformers 5.x "
                          "('CodeGenAttention' object has no attribute 'embed_positions')",
}
LOG_PROB_TOL = 1e-4
# Architectures whose later blocks read the word embeddings again beside the residual stream (Zamba2's
# shared attention blocks take them concatenated): patching block 0's input alone does not fully
# restore the clean run.
READS_EMBEDDINGS_AGAIN = frozenset({"Zamba2ForCausalLM"})


def _architectures() -> list[str]:
    if ON_TL3:
        return []
    try:
        return registered_architectures()
    except ImportError:  # a TransformerLens without the bridge's registry
        return []


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models gain nothing from threads, and spinning OpenMP threads slow a shared CPU down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_package_installs(monkeypatch: pytest.MonkeyPatch):
    """No subprocess may run while a model boots (TransformerLens 4.3 pip-installs torchvision for
    multimodal models; boot_bridge must keep it from doing so): any call is refused and fails the test."""
    import subprocess

    calls: list[object] = []

    def refuse(cmd, *args, **kwargs):
        calls.append(cmd)
        raise OSError("tests run no subprocess")

    monkeypatch.setattr(subprocess, "check_call", refuse)
    yield
    assert not calls, f"booting ran {calls}"


def _hf_reference(hf: torch.nn.Module) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Hugging Face's own hidden states and log-probabilities of ``TOKENS``."""
    with torch.no_grad():
        out = hf(TOKENS, output_hidden_states=True, use_cache=False)
    return out.hidden_states, torch.log_softmax(out.logits.float(), dim=-1)


def _check_capture(arch: str, states, hidden: tuple[torch.Tensor, ...], n_layers: int) -> None:
    """Captured residual stream == Hugging Face's hidden states (layers 0..L-1: HF's last one is normed)."""
    resid, rows = states["resid_post"], (states.batch_index, states.position)
    shift = 1 if arch in HF_STATES_AFTER_BLOCKS else 0
    for k in range(n_layers - shift):
        torch.testing.assert_close(resid[k + shift], hidden[k][rows].float(), atol=1e-4, rtol=1e-4,
                                   msg=lambda m: f"{arch} layer {k + shift}: {m}")


@pytest.mark.skipif(ON_TL3, reason="the bridge's architectures are tested under TransformerLens 4.x")
@pytest.mark.parametrize("arch", _architectures())
def test_architecture(arch: str, tmp_path) -> None:
    reason = why_not_tested(arch) or TL_FAILURES.get(arch)
    if reason:
        pytest.skip(reason)
    _, hf = save_tiny(arch, tmp_path)
    model = boot_bridge(tmp_path, device="cpu").eval()
    if arch in UNREADABLE:
        error, match = UNREADABLE[arch]
        with pytest.raises(error, match=match):
            geolens.capture(model, TOKENS, n_tokens=None, progress=False)
        return
    adapter = as_adapter(model)
    hidden, log_p = _hf_reference(hf)
    states = geolens.capture(model, TOKENS, sites=("resid_post", "final"), n_tokens=None, skip_first=False,
                             progress=False)
    _check_capture(arch, states, hidden, adapter.n_layers)
    lens_log_p = torch.log_softmax(LogitLens(model)(states["resid_post"][-1], adapter.n_layers), dim=-1)
    torch.testing.assert_close(lens_log_p, log_p[states.batch_index, states.position], atol=LOG_PROB_TOL, rtol=0)
    _check_analyses(model, states)


def _check_analyses(model, states) -> None:
    """pga, spectrum and the lens evaluation run on the captured states and give finite numbers."""
    pga = geolens.pga(model, states, k=4, n_null=5, progress=False).to_pandas()
    assert pga["z"].notna().all() and len(pga) == states["resid_post"].shape[0] + 1
    spectrum = geolens.spectrum(model, states, progress=False).to_pandas()
    assert len(spectrum) > 0
    lens = evaluate(model, TOKENS, states=states, n_tokens=None, progress=False).to_pandas()
    assert torch.isfinite(torch.tensor(lens[["kl", "ce"]].to_numpy())).all()
    assert lens["kl"].iloc[-1] == pytest.approx(0.0, abs=1e-6)  # the logit lens's last layer is the output


# ---------------------------------------------------------------- TransformerLens 3.9: HookedTransformer
HOOKED_CONFIGS = {
    "standard positions, LayerNorm, GELU MLP": dict(positional_embedding_type="standard", normalization_type="LN",
                                                   act_fn="gelu"),
    "rotary, RMSNorm, gated SiLU MLP, grouped-query attention": dict(
        positional_embedding_type="rotary", normalization_type="RMS", act_fn="silu", gated_mlp=True,
        n_key_value_heads=2, rotary_dim=8),
    "rotary, LayerNorm, parallel attention and MLP": dict(positional_embedding_type="rotary", normalization_type="LN",
                                                         act_fn="gelu", parallel_attn_mlp=True, rotary_dim=4),
    "final logit soft-cap, RMSNorm, gated GELU MLP": dict(normalization_type="RMS", act_fn="gelu_new",
                                                         gated_mlp=True, output_logits_soft_cap=0.5),
}


@pytest.mark.skipif(not ON_TL3, reason="HookedTransformer exists only in TransformerLens <= 3.x")
@pytest.mark.parametrize("name", list(HOOKED_CONFIGS))
def test_hooked_transformer_configuration(name: str) -> None:
    from tests.conftest import make_hooked_model

    model = make_hooked_model(**HOOKED_CONFIGS[name])
    adapter = as_adapter(model)
    tokens = TOKENS % adapter.d_vocab
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    states = geolens.capture(model, tokens, sites=("resid_post", "final"), n_tokens=None, skip_first=False,
                             progress=False)
    rows = (states.batch_index, states.position)
    for layer in range(adapter.n_layers + 1):
        hook = "blocks.0.hook_resid_pre" if layer == 0 else f"blocks.{layer - 1}.hook_resid_post"
        torch.testing.assert_close(states["resid_post"][layer], cache[hook][rows], atol=1e-5, rtol=1e-5)
    lens_log_p = torch.log_softmax(LogitLens(model)(states["resid_post"][-1], adapter.n_layers), dim=-1)
    torch.testing.assert_close(lens_log_p, torch.log_softmax(logits, -1)[rows], atol=LOG_PROB_TOL, rtol=0)
    _check_analyses(model, states)


@pytest.mark.slow
@pytest.mark.skipif(ON_TL3, reason="the bridge's architectures are tested under TransformerLens 4.x")
@pytest.mark.parametrize("arch", _architectures())
def test_architecture_interventions_and_tuned_lens(arch: str, tmp_path) -> None:
    """A small tuned-lens fit, activation patching and a PC ablation run on every architecture geolens reads.

    Patching the embeddings of the one token where two prompts differ restores the clean run
    (normalised effect 1), unless later blocks read the embeddings again.
    """
    reason = why_not_tested(arch) or TL_FAILURES.get(arch) or ("states geolens cannot read" if arch in UNREADABLE
                                                                 else None)
    if reason:
        pytest.skip(reason)
    save_tiny(arch, tmp_path)
    model = boot_bridge(tmp_path, device="cpu").eval()
    lens = geolens.lens.fit_tuned_lens(model, TOKENS.repeat(4, 1), n_tokens=16, seq_len=9, max_steps=2,
                                       eval_every=1, progress=False)
    assert all(torch.isfinite(torch.tensor(lens.training_info["held_out_kl"])))
    clean, corrupted = TOKENS[:1], TOKENS[:1].clone()
    corrupted[0, 3] = 4
    res = geolens.patch(model, clean, corrupted, metric=geolens.logit_diff(5, 6), sites="resid_pre", layers=[1],
                        progress=False)
    restored = float(res.normalized().values("resid_pre")[0, 3])
    assert restored == pytest.approx(1.0, abs=1e-3) or arch in READS_EMBEDDINGS_AGAIN, restored
    effect = geolens.ablation_effect(model, TOKENS, layer=1, n_components=1, k=4, n_null=5, progress=False).to_pandas()
    assert effect.select_dtypes("number").notna().all().all()
