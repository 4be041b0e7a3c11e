"""Benchmark: tuned-lens training throughput and the cost of ``geolens.updates`` (issue 4).

On the default model (``geolens.load_default_model()``, ``geolens.default_texts``), all in one run:
  - tuned-lens training throughput (lens tokens/s) for a few steps, with the
    vocabulary product in bfloat16 (the default) and in float32, next to the
    model's plain forward throughput on the same windows (the floor: one forward
    per token is the least any recipe needs);
  - ``geolens.updates`` (capture of resid_post + attn_out + mlp_out at n_tokens
    positions, then the metrics) against one plain forward pass over the same tokens.

Run:  python bench/lens.py [--steps 3] [--tokens-per-step 256] [--n-texts 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import geolens  # noqa: E402
from geolens.analyses.updates import updates  # noqa: E402
from geolens.capture import prepare_tokens  # noqa: E402
from geolens.lens import train_tuned_lens  # noqa: E402
from geolens.model import as_adapter  # noqa: E402


def plain_forward_seconds(adapter, tokens, mask, batch_size=8) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for s in range(0, tokens.shape[0], batch_size):
            adapter.model(tokens[s : s + batch_size], attention_mask=mask[s : s + batch_size])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokens-per-step", type=int, default=256)
    parser.add_argument("--n-texts", type=int, default=16)
    parser.add_argument("--n-tokens", type=int, default=1024)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    model = geolens.load_default_model()
    adapter = as_adapter(model)
    print(f"model {adapter.name}: L={adapter.n_layers}, d={adapter.d_model}, V={adapter.d_vocab}; "
          f"torch threads {torch.get_num_threads()}")
    texts = geolens.default_texts(n=200, seed=1)

    # ---- training throughput
    budget = args.steps * args.tokens_per_step
    rates = {}
    for label, dtype in (("bf16", torch.bfloat16), ("fp32", None)):
        lens = train_tuned_lens(model, texts, steps=args.steps, tokens_per_step=args.tokens_per_step,
                                matmul_dtype=dtype, progress=False)
        info = lens.training_info
        rates[label] = info["tokens_seen"] / info["seconds"]
        print(f"train [{label}] {info['steps']} steps x {args.tokens_per_step} tokens: {info['seconds']:.1f} s, "
              f"{rates[label]:.1f} lens tokens/s, losses {[round(x, 3) for x in info['losses']]}")
    # the same windows through the model alone (BOS included, so a few more tokens than the lens sees)
    from geolens.lens.train import _micro_batches

    batches, n_real = [], 0
    for tokens, mask in _micro_batches(adapter, texts, 128, 8, None):
        batches.append((tokens, mask))
        n_real += int(mask.sum()) - tokens.shape[0]
        if n_real >= budget:
            break
    start = time.perf_counter()
    with torch.no_grad():
        for tokens, mask in batches:
            model(tokens, attention_mask=mask)
    fwd_rate = n_real / (time.perf_counter() - start)
    print(f"plain forward on the same windows: {fwd_rate:.1f} tokens/s")
    print(f"ratio  train(bf16) / forward = {rates['bf16'] / fwd_rate:.3f};  bf16 / fp32 speed-up = "
          f"{rates['bf16'] / rates['fp32']:.2f}x")

    # ---- updates vs one forward
    eval_texts = geolens.default_texts(n=args.n_texts, seed=0)
    batch = prepare_tokens(adapter, eval_texts, max_length=128)
    plain_forward_seconds(adapter, batch.tokens[:2], batch.attention_mask[:2])  # warm-up
    fwd = plain_forward_seconds(adapter, batch.tokens, batch.attention_mask)
    start = time.perf_counter()
    res = updates(model, batch.tokens, attention_mask=batch.attention_mask, n_tokens=args.n_tokens, progress=False)
    upd = time.perf_counter() - start
    print(f"updates (n_tokens={res.params['n_tokens']}, {batch.tokens.shape[0]} x {batch.tokens.shape[1]} tokens): "
          f"{upd:.2f} s; one plain forward over the same tokens: {fwd:.2f} s; ratio {upd / fwd:.2f}")


if __name__ == "__main__":
    main()
