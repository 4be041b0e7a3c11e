"""Tiny random-weight Hugging Face models of every architecture TransformerLens's bridge registers.

:func:`tiny_config` shrinks an architecture's default ``transformers`` config (2 layers,
d_model 64, vocabulary 200, a few experts, small state sizes; a multimodal model's towers
too) and sets any logit soft-cap, scale or multiplier far from the identity; :func:`save_tiny`
builds the model from it, seeded, and saves it with the test tokenizer; :func:`why_not_tested`
says why an architecture is left out. Used by ``tests/test_architectures.py`` and the lens tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 200
D_MODEL = 64
N_LAYERS = 2

# Sizes by config field name: every field the default config has is set.
_SIZES: dict[str, int] = {
    "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB,
    "hidden_size": D_MODEL, "n_embd": D_MODEL, "d_model": D_MODEL, "dim": D_MODEL, "lru_width": D_MODEL,
    "num_hidden_layers": N_LAYERS, "n_layer": N_LAYERS, "n_layers": N_LAYERS, "num_layers": N_LAYERS,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4, "index_n_heads": 4,
    "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "num_key_value_heads": 2, "num_query_groups": 2, "multi_query_group_num": 2,
    "head_dim": 16, "attention_head_dim": 16, "kv_channels": 16, "index_head_dim": 16,
    "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "rotary_dim": 8,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "intermediate_size_mlp": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "shared_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32, "attention_hidden_size": D_MODEL,
    "q_lora_rank": 16, "kv_lora_rank": 16, "o_lora_rank": 16, "o_groups": 2, "adapter_rank": 8,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "index_topk": 8,
    "state_size": 8, "ssm_state_size": 8, "mamba_d_state": 8, "time_step_rank": 8, "mamba_dt_rank": 8,
    "mamba_n_heads": 8, "mamba_num_heads": 8, "n_mamba_heads": 8, "mamba_d_head": 16, "mamba_head_dim": 16,
    "mamba_headdim": 16, "mamba_d_ssm": 128, "n_groups": 1, "mamba_n_groups": 1, "mamba_ngroups": 1,
    "chunk_size": 16, "mamba_chunk_size": 16,
    "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64, "max_seq_len": 64, "context_length": 64,
    "sliding_window": 16, "attention_window_size": 16, "attention_chunk_size": 16,
    "hidden_size_per_layer_input": 8, "num_layers_per_stack": 1,
}

# Fields with no default number (derived from others) that the tiny config still sets.
_UNSET_SIZES = frozenset({"num_experts_per_tok", "n_group", "topk_group", "head_dim", "num_key_value_heads"})
# What the shrinking alone gets wrong, per config class: hybrid layer patterns that must keep one
# attention layer in two, and sizes that must agree with each other.
_FIXES: dict[str, dict[str, Any]] = {
    "JambaConfig": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "BambaConfig": {"attn_layer_indices": [1]},
    "GraniteMoeHybridConfig": {"layer_types": ["mamba", "attention"], "position_embedding_type": "rope"},
    "RecurrentGemmaConfig": {"block_types": ["recurrent", "attention"]},
    "Lfm2MoeConfig": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "Mamba2Config": {"num_heads": 8},
    "Zamba2Config": {"hybrid_layer_ids": [1], "attention_hidden_size": 2 * D_MODEL},
    "GPTNeoConfig": {"attention_types": [[["global", "local"], 1]]},
    "Emu3VQVAEConfig": {"codebook_size": 64, "base_channels": 32, "channel_multiplier": [1, 2], "num_res_blocks": 1,
                        "attn_resolutions": []},
    # Emu3 maps its image tokens into the text vocabulary: a few ids above the test tokenizer's.
    "Emu3Config": {"vocabulary_map": {"<image>": 150, **{f"<|visual token {i:06d}|>": 100 + i for i in range(40)}}},
}

# What a model does to its logits after the unembedding, set far from the identity where the
# architecture has it (the defaults barely change a tiny model's small logits): a logit lens that
# skipped it would miss the model's output distribution by far more than any tolerance.
_OUTPUT_TRANSFORMS: dict[str, float] = {
    "final_logit_softcapping": 1.0, "logits_soft_cap": 1.0, "logit_scale": 0.25, "logits_scaling": 4.0,
    "lm_head_multiplier": 3.0, "output_multiplier": 3.0,
}

# Architectures left out, and why (the reason is the skip message and docs/models.md's).
_ENCODER_DECODER = "encoder-decoder: geolens measures decoder-only language models"
_ENCODER_ONLY = "encoder-only (masked LM): geolens measures causal language models"
_AUDIO = "audio model: geolens measures text"
_VISION = "vision-only model: geolens measures text"
NOT_TESTED: dict[str, str] = {
    **dict.fromkeys([
        "BartForConditionalGeneration", "BlenderbotForConditionalGeneration", "LEDForConditionalGeneration",
        "LongT5ForConditionalGeneration", "M2M100ForConditionalGeneration", "MarianMTModel",
        "MBartForConditionalGeneration", "PegasusForConditionalGeneration", "SwitchTransformersForConditionalGeneration",
        "T5ForConditionalGeneration", "MT5ForConditionalGeneration", "T5GemmaForConditionalGeneration",
        "T5Gemma2ForConditionalGeneration", "Florence2ForConditionalGeneration"], _ENCODER_DECODER),
    **dict.fromkeys(["BertForMaskedLM", "BertLMHeadModel", "RobertaForMaskedLM"], _ENCODER_ONLY),
    **dict.fromkeys(["ASTForAudioClassification", "HubertForCTC", "HubertModel", "Wav2Vec2ForCTC",
                     "Wav2Vec2ForPreTraining", "Wav2Vec2Model"], _AUDIO),
    **dict.fromkeys(["ViTModel", "ViTForImageClassification", "DeiTModel", "DeiTForImageClassification"], _VISION),
    "Gemma3nForConditionalGeneration": "needs timm (its vision tower), which geolens does not install",
    "BloomModel": "a base model without a language-model head (BloomForCausalLM is tested)",
}


def registered_architectures() -> list[str]:
    """Every architecture name the installed TransformerLens's bridge registers."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    return list(SUPPORTED_ARCHITECTURES)


def _missing_libraries(arch: str) -> list[str]:
    """The libraries TransformerLens's adapter of ``arch`` requires that are not installed."""
    import importlib.util

    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    needed = getattr(SUPPORTED_ARCHITECTURES.get(arch), "required_libraries", None) or []
    return [lib for lib in needed if importlib.util.find_spec(lib) is None]


def why_not_tested(arch: str) -> str | None:
    """The reason ``arch`` is left out, or ``None`` when it is built and tested."""
    import transformers

    if arch in NOT_TESTED:
        return NOT_TESTED[arch]
    missing = _missing_libraries(arch)
    if missing:
        return (f"needs {', '.join(missing)}, which geolens does not install (TransformerLens refuses to boot it "
                "without)")
    if not hasattr(transformers, arch):
        return ("no transformers class of this name: the model's code comes from the hub (remote code) or from a "
                "checkpoint format of its own (TransformerLens-native, nanoGPT, minGPT, legacy names), which "
                "these offline tests cannot build")
    return None


def _tiny(config_class: type) -> Any:
    """A ``config_class`` built with every size field its default has set to the tiny value.

    Built from keyword arguments, so per-layer fields the config derives (layer kinds, per-layer
    overrides) follow the tiny layer count; per-layer lists it keeps from its defaults are cut.
    """
    defaults = config_class().to_dict()
    sizes = {key: _SIZES[key] for key, value in defaults.items() if key in _SIZES and (
        (isinstance(value, int) and not isinstance(value, bool)) or (value is None and key in _UNSET_SIZES))}
    n_default = next((defaults[k] for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
                      if isinstance(defaults.get(k), int)), None)
    # Per-layer lists of the default config, cut to the tiny depth keeping each kind of layer it mixes.
    sizes.update({key: _per_layer(value) for key, value in defaults.items()
                  if isinstance(value, list) and n_default and len(value) == n_default != N_LAYERS
                  and key not in ("mlp_only_layers", "full_attn_idxs")})
    if defaults.get("num_key_value_heads") == defaults.get("num_attention_heads"):
        sizes["num_key_value_heads"] = sizes.get("num_attention_heads", 4)  # keep full multi-head attention
    sizes.update({key: value for key, value in _OUTPUT_TRANSFORMS.items() if defaults.get(key) is not None})
    sizes.update(_FIXES.get(config_class.__name__, {}))
    config = config_class(**sizes)
    for name in ("text_config", "vision_config", "audio_config", "vq_config"):
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            setattr(config, name, _tiny(type(sub)))
    return config


def _per_layer(value: list) -> list:
    """A per-layer list cut to ``N_LAYERS`` entries, keeping two different kinds where there are two."""
    kinds = list(dict.fromkeys(value))
    return (kinds + value)[:N_LAYERS] if len(kinds) >= N_LAYERS else value[:N_LAYERS]


def tiny_config(arch: str, **overrides: Any) -> Any:
    """A tiny config of the architecture ``arch`` (a ``transformers`` model class name), with ``overrides`` set."""
    import transformers

    config = _tiny(getattr(transformers, arch).config_class)
    for key, value in overrides.items():
        setattr(config, key, value)
    for part in (config, getattr(config, "text_config", None)):
        if part is not None:
            part.bos_token_id, part.eos_token_id, part.pad_token_id = 0, 0, 2
    config.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    return config


def save_tiny(arch: str, path: Path, seed: int = 0, **overrides: Any) -> tuple[Path, torch.nn.Module]:
    """Build the tiny ``arch`` model (seeded, float32, eval mode; config ``overrides``), save it and the test
    tokenizer into ``path``; return ``path`` and the Hugging Face model."""
    import transformers

    from tests.conftest import build_tokenizer, jitter_norms

    torch.manual_seed(seed)
    model = getattr(transformers, arch)(tiny_config(arch, **overrides)).float().eval()
    jitter_norms(model, seed=seed, scale=0.1)
    model.save_pretrained(str(path))
    build_tokenizer(path)
    return path, model
