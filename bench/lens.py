"""Benchmark: the fast tuned lens against the reference recipe, training throughput and the cost
of ``geolens.updates``.

On the default model (``geolens.load_default_model()``, ``geolens.default_texts``), all in one run:
  - **fast vs reference**: held-out KL (mean over layers 1..L-1, at 1024 positions
    of the first windows of 200 texts no lens trains on, the same for every lens) against wall
    time, and lens tokens/s, for ``fit_tuned_lens`` at its default budget (``FAST_BUDGET``), the
    same method trained 4 times longer on the same positions (4x steps and seconds) and with
    every budget 4 times larger, positions included (its convergence: within 5 % is the target),
    and the reference recipe (``train_tuned_lens``, SGD Nesterov on the full-vocabulary
    KL) at a third of and at the fast method's wall time; the logit lens for scale;
  - tuned-lens training throughput (lens tokens/s) for a few steps, with the
    vocabulary product in bfloat16 (the default) and in float32, next to the
    model's plain forward throughput on the same windows (the floor: one forward
    per token is the least any recipe needs);
  - ``geolens.updates`` (capture of resid_post + attn_out + mlp_out at n_tokens
    positions, then the metrics) against one plain forward pass over the same tokens.

Run:  python bench/lens.py [--no-compare] [--no-throughput] [--no-every-budget] [--no-reference] [--steps 3] [--tokens-per-step 256] [--n-texts 16]
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
from geolens._validation import UpperBound  # noqa: E402
from geolens.capture import capture  # noqa: E402
from geolens.lens import FAST_BUDGET, TunedLens, fit_tuned_lens, train_tuned_lens  # noqa: E402
from geolens.lens.fit import _held_out_kl  # noqa: E402
from geolens.lens.train import _pad, _windows, fast_matmul_dtype  # noqa: E402
from geolens.model import as_adapter  # noqa: E402
from geolens.sites import RESIDUAL_SITE  # noqa: E402

N_TRAIN_TEXTS, N_EVAL_TEXTS, EVAL_POSITIONS = 1000, 200, 1024


def plain_forward_seconds(adapter, tokens, mask, batch_size=8) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for s in range(0, tokens.shape[0], batch_size):
            adapter.model(tokens[s : s + batch_size], attention_mask=mask[s : s + batch_size])
    return time.perf_counter() - start


def compare_methods(model, *, every_budget: bool = True, with_reference: bool = True) -> None:
    """Fast vs reference vs fast 4x: held-out KL against wall time, tokens/s (see the module docstring)."""
    adapter = as_adapter(model)
    texts = geolens.default_texts(n=N_TRAIN_TEXTS + N_EVAL_TEXTS, seed=3)
    train_texts, eval_texts = texts[:N_TRAIN_TEXTS], texts[N_TRAIN_TEXTS:]
    # The first window of every held-out text, and EVAL_POSITIONS positions sampled across them: the texts
    # vary more than the windows of one text, so the score does not hang on a few texts.
    origins: list[int] = []
    windows = []
    for window in _windows(adapter, eval_texts, 128, None, origins):
        if len(origins) == 1 or origins[-1] != origins[-2]:
            windows.append(window)
    tokens, mask = _pad(windows, adapter)
    held = capture(adapter, tokens, attention_mask=mask, sites=(RESIDUAL_SITE,), n_tokens=UpperBound(EVAL_POSITIONS),
                   seed=1, progress=False)[RESIDUAL_SITE]
    n_eval_texts = len(windows)
    w_u, b_u = adapter.unembed_matrix("raw").float(), adapter.unembed_bias()
    default_dtype = fast_matmul_dtype(w_u.device)

    def held_out(lens) -> float:
        return float(_held_out_kl(lens, held, w_u, b_u)[1:].mean())

    logit = held_out(TunedLens(adapter))  # an untrained tuned lens is the logit lens
    print(f"held-out KL, mean over layers 1..{adapter.n_layers - 1}, {held.shape[1]} positions of "
          f"{n_eval_texts} texts no lens trains on; logit lens {logit:.3f} nats")
    rows = []

    def fast(label: str, scale: int, data_scale: int | None = None, **options) -> dict:
        budget = {k: v * scale for k, v in FAST_BUDGET.items()}
        if data_scale is not None:
            budget["n_tokens"] = FAST_BUDGET["n_tokens"] * data_scale
        start = time.perf_counter()
        lens = fit_tuned_lens(model, train_texts, progress=False, **budget, **options)
        seconds = time.perf_counter() - start
        info = lens.training_info
        curve = lens.history.query("split == 'held_out' and layer > 0").groupby("step").agg(
            seconds=("seconds", "first"), kl=("kl", "mean"))
        print(f"{label}: {budget}; products {info['matmul_dtype']}; stopped: {info['stopped']} after "
              f"{info['steps']} steps; capture "
              f"{info['capture_seconds']:.0f} s; KL on its own held-out windows by time: "
              + ", ".join(f"{r.seconds:.0f} s {r.kl:.3f}" for r in curve.itertuples()))
        row = {"method": label, "seconds": seconds, "tokens": info["n_tokens"], "kl": held_out(lens)}
        rows.append(row)
        return row

    default = fast("fast (default budget)", 1)
    if default_dtype is not None:  # the refinement's bf16 products against float32 ones, at the same budget
        fast("fast (float32 products)", 1, matmul_dtype=None)
    trained_longer = fast("fast (4x steps and seconds)", 4, data_scale=1)  # the same captured positions
    longer = fast("fast (every budget 4x)", 4) if every_budget else None
    if with_reference:
        reference_rows(model, train_texts, default["seconds"], rows, held_out)
    print(f"\n{'method':34s} {'wall s':>7s} {'tokens':>7s} {'tokens/s':>9s} {'held-out KL':>12s} {'/ logit':>8s}")
    for r in rows:
        print(f"{r['method']:34s} {r['seconds']:7.1f} {r['tokens']:7d} {r['tokens'] / r['seconds']:9.1f} "
              f"{r['kl']:12.3f} {r['kl'] / logit:8.3f}")
    trained_gap = (default["kl"] - trained_longer["kl"]) / trained_longer["kl"]
    line = (f"\nfast default vs trained 4x longer on the same positions: {100 * trained_gap:+.1f} % held-out KL "
            f"(target <= 5 %: {'met' if trained_gap <= 0.05 else 'NOT met'})")
    if longer is not None:
        gap = (default["kl"] - longer["kl"]) / longer["kl"]
        line += f"; vs every budget 4x, positions included: {100 * gap:+.1f} % ({'met' if gap <= 0.05 else 'NOT met'})"
    line += (f"; default budget {default['seconds']:.0f} s (target <= 300 s: "
             f"{'met' if default['seconds'] <= 300 else 'NOT met'}); vs logit lens {default['kl'] / logit:.2f} "
             f"(target <= 0.5)")
    if with_reference:
        at_equal_time = rows[-1]
        line += (f"; reference at equal wall time {at_equal_time['kl']:.3f} "
                 f"({'fast lower' if default['kl'] <= at_equal_time['kl'] else 'REFERENCE lower'})")
    print(line)


def reference_rows(model, train_texts, fast_seconds: float, rows: list, held_out) -> None:
    """The reference recipe at 1/3 and 1x the fast method's wall time; its rate from a two-step run."""
    probe = train_tuned_lens(model, train_texts, max_steps=2, tokens_per_step=128, progress=False)
    rate = probe.training_info["tokens_seen"] / probe.training_info["seconds"]
    for share in (1 / 3, 1.0):
        steps = max(1, round(share * fast_seconds * rate / 128))
        start = time.perf_counter()
        lens = train_tuned_lens(model, train_texts, max_steps=steps, tokens_per_step=128, progress=False)
        rows.append({"method": f"reference ({steps} x 128 tokens)", "seconds": time.perf_counter() - start,
                     "tokens": lens.training_info["tokens_seen"], "kl": held_out(lens)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokens-per-step", type=int, default=256)
    parser.add_argument("--n-texts", type=int, default=16)
    parser.add_argument("--n-tokens", type=int, default=1024)
    parser.add_argument("--no-compare", action="store_true", help="skip fast vs reference")
    parser.add_argument("--no-throughput", action="store_true", help="skip the throughput and updates sections")
    parser.add_argument("--no-every-budget", action="store_true", help="skip the fit with every budget 4x (~20 min)")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference recipe's rows")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    model = geolens.load_default_model()
    adapter = as_adapter(model)
    print(f"model {adapter.name}: L={adapter.n_layers}, d={adapter.d_model}, V={adapter.d_vocab}; "
          f"torch threads {torch.get_num_threads()}")
    if not args.no_compare:
        compare_methods(model, every_budget=not args.no_every_budget, with_reference=not args.no_reference)
    if args.no_throughput:
        return
    texts = geolens.default_texts(n=200, seed=1)

    # ---- training throughput
    budget = args.steps * args.tokens_per_step
    rates = {}
    for label, dtype in (("bf16", torch.bfloat16), ("fp32", None)):
        lens = train_tuned_lens(model, texts, max_steps=args.steps, tokens_per_step=args.tokens_per_step,
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
