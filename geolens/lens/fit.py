"""Fit a tuned lens fast: capture the states once, solve the translators in closed form, refine on KL.

See docs/methods.md §C.4.

The reference recipe (:func:`geolens.lens.train_tuned_lens` with
``method="reference"``) runs the model and ``L`` full-vocabulary unembeddings,
forward and backward, for every training token: about 12 lens tokens/s for the
135M default model on 2 CPU cores. This module separates the two costs:

1. **Capture once.** The residual stream of every layer is captured at up to
   ``n_tokens`` sampled positions of the training text (windows of ``seq_len``
   tokens; BOS and padding never sampled) — one forward pass over the text.
   Whole sequences are held out (every fifth window) to measure the lens on
   text it was not fitted on.
2. **Closed form.** The translator of layer ``l`` (``T_l(h) = h + A_l h + b_l``)
   is first solved by ridge regression of the last layer's state on layer
   ``l``'s: ``min ||[H_l, 1] W - (H_L - H_l)||^2 + lambda ||A_l||^2`` — a linear
   shortcut to the final state (Din et al. 2023), one ``(d+1) x (d+1)`` solve per
   layer, all layers batched. For an unconstrained affine map this minimiser
   does not depend on the metric the residual is measured in, so it is also the
   least-squares fit in the readout metric ``W_U W_U^T``.
3. **KL refinement.** Adam on the exact full-vocabulary ``KL(p_final || p_l)``
   of the captured training rows (no model in the loop), every layer in one
   step. The held-out KL per layer is recorded every ``eval_every`` steps
   (``lens.history``); training stops on a plateau (the held-out mean improves
   by less than ``tol`` relative over ``patience`` evaluations), or on the step
   or time budget, and keeps the best evaluated translators. A layer counts as
   converged when its own held-out KL moved by less than ``tol`` over the last
   ``patience`` evaluations.

Example:
    >>> lens = fit_tuned_lens(model, texts * 8, n_tokens=64, max_steps=4, eval_every=2, progress=False)
    >>> info = lens.training_info
    >>> info["method"], info["stopped"] in ("plateau", "steps", "time")
    ('fast', True)
    >>> sorted(lens.history.columns)
    ['kl', 'layer', 'seconds', 'split', 'step']
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from geolens._validation import UpperBound, check_int
from geolens.capture import capture
from geolens.lens.logit_lens import unembed
from geolens.lens.train import DEFAULT_SEQ_LEN, _micro_batches, kl_rows
from geolens.lens.tuned_lens import TunedLens
from geolens.model import ModelAdapter, as_adapter
from geolens.sites import RESIDUAL_SITE

__all__ = ["FAST_BUDGET", "fit_tuned_lens"]

# The default fast budget: measured on the default model (2 cores) in bench/lens.py and the closing note.
FAST_BUDGET: dict[str, Any] = {"n_tokens": 4096, "max_steps": 100, "max_seconds": 90.0}
_HELD_OUT_EVERY = 5  # every fifth window is held out
_EVAL_ROWS = 256  # held-out rows scored at each evaluation
_ROW_CHUNK = 256


def _check_float(value: object, name: str, *, low: float = 0.0, open_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    value = float(value)
    if value < low or (open_low and value == low):
        raise ValueError(f"{name} must be {'>' if open_low else '>='} {low}, got {value}")
    return value


def _windows(adapter: ModelAdapter, texts: Any, seq_len: int, needed: int, attention_mask: Tensor | None):
    """``(tokens, mask)`` of enough ``seq_len`` windows of the text for ``needed`` eligible positions."""
    rows, masks, eligible = [], [], 0
    for tokens, mask in _micro_batches(adapter, texts, seq_len, 8, attention_mask):
        rows.append(tokens)
        masks.append(mask)
        eligible += int(mask.sum()) - mask.shape[0]  # the first token of each window is never sampled
        if eligible >= needed:
            break
    if not rows:
        raise ValueError("the training text holds no token to train on: pass more text")
    width = max(t.shape[1] for t in rows)
    pad = adapter.pad_token_id
    tokens = torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad) for t in rows])
    mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1]), value=0) for m in masks])
    return tokens, mask


def _closed_form(lens: TunedLens, train: Tensor, ridge: float) -> None:
    """Ridge regression of ``H_L - H_l`` on ``[H_l, 1]`` for every layer ``l < L``, written into the translators."""
    h = train[:-1].double()  # [L, N, d]
    final = train[-1].double()
    target = final.unsqueeze(0) - h  # [L, N, d]
    n, d = h.shape[1], h.shape[2]
    x = torch.cat([h, h.new_ones(h.shape[0], n, 1)], dim=-1)  # [L, N, d + 1]
    gram = x.transpose(1, 2) @ x  # [L, d + 1, d + 1]
    scale = torch.diagonal(gram[:, :d, :d], dim1=1, dim2=2).mean(dim=1)  # ridge relative to each layer's scale
    penalty = torch.zeros_like(gram)
    penalty[:, range(d), range(d)] = (ridge * scale).unsqueeze(1)
    w = torch.linalg.solve(gram + penalty, x.transpose(1, 2) @ target)  # [L, d + 1, d]
    with torch.no_grad():
        for layer, translator in enumerate(lens.translators):
            translator.weight.copy_(w[layer, :d].T.to(translator.weight.dtype))
            if translator.bias is not None:
                translator.bias.copy_(w[layer, d].to(translator.bias.dtype))


def _held_out_kl(lens: TunedLens, states: Tensor, w_u: Tensor, b_u: Tensor | None) -> Tensor:
    """Mean ``KL(p_final || p_l)`` per layer ``0..L-1`` over the rows of ``states`` ``[L + 1, N, d]`` (float64)."""
    n_layers = states.shape[0] - 1
    total = torch.zeros(n_layers, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, states.shape[1], _ROW_CHUNK):
            rows = slice(start, start + _ROW_CHUNK)
            log_p = torch.log_softmax(unembed(lens.adapter, states[-1, rows], w_u=w_u, b_u=b_u), dim=-1)
            for layer in range(n_layers):
                total[layer] += float(kl_rows(log_p, lens(states[layer, rows], layer, w_u=w_u, b_u=b_u)).sum())
    return total / states.shape[1]


def fit_tuned_lens(
    model: object,
    texts,
    *,
    lens: TunedLens | None = None,
    n_tokens: int = FAST_BUDGET["n_tokens"],
    seq_len: int = DEFAULT_SEQ_LEN,
    ridge: float = 0.1,
    refine: bool = True,
    lr: float = 1e-3,
    batch_tokens: int = 64,
    max_steps: int = FAST_BUDGET["max_steps"],
    max_seconds: float = FAST_BUDGET["max_seconds"],
    eval_every: int = 10,
    patience: int = 3,
    tol: float = 0.01,
    attention_mask: Tensor | None = None,
    seed: int = 0,
    progress: bool = True,
) -> TunedLens:
    """A tuned lens in minutes on a CPU: closed-form translators from captured states, refined on the exact KL.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge`` (frozen; never changed).
        texts: training texts (a list of str) or ``[B, T]`` token ids.
        lens: a lens to refine (its translators are replaced by the closed form first).
        n_tokens: positions captured (an upper bound: with less text, what there is, with a warning);
            a fifth of the windows is held out.
        seq_len: tokens per window.
        ridge: the ridge penalty relative to the mean variance of each layer's states (0.1: measured
            best of 1e-3, 1e-2, 0.1, 1 on the default model; a per-token weighting by ``1 / ||h_L||^2``
            measured no better and was dropped).
        refine: run the KL refinement after the closed form (``False``: closed form only).
        lr, batch_tokens: Adam's learning rate and the training rows per step.
        max_steps, max_seconds: the refinement budget; training stops earlier on a plateau.
        eval_every, patience, tol: the held-out KL is measured every ``eval_every`` steps; a relative
            improvement below ``tol`` over ``patience`` evaluations is a plateau.
        attention_mask: for token ids.
        seed: seed of the position sample and of the minibatches.
        progress: tqdm bar with the held-out KL.

    Returns:
        the :class:`TunedLens`; ``lens.history`` (a DataFrame of ``step, seconds, split, layer, kl``),
        ``lens.training_info["converged"]`` (per layer), ``["stopped"]`` (``plateau``, ``steps``, ``time``).
    """
    adapter = as_adapter(model)
    n_tokens = check_int(n_tokens, "n_tokens", low=16)
    seq_len = check_int(seq_len, "seq_len", low=3)
    ridge = _check_float(ridge, "ridge")
    lr = _check_float(lr, "lr", open_low=True)
    batch_tokens = check_int(batch_tokens, "batch_tokens", low=1)
    max_steps = check_int(max_steps, "max_steps", low=0)
    max_seconds = _check_float(max_seconds, "max_seconds")
    eval_every = check_int(eval_every, "eval_every", low=1)
    patience = check_int(patience, "patience", low=1)
    tol = _check_float(tol, "tol")
    lens = TunedLens(adapter) if lens is None else lens
    if not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be a TunedLens, got {type(lens).__name__}")
    if (lens.n_layers, lens.d_model, lens.d_vocab) != (adapter.n_layers, adapter.d_model, adapter.d_vocab):
        raise ValueError("the lens was made for another model shape")
    started = time.perf_counter()

    tokens, mask = _windows(adapter, texts, seq_len, n_tokens + n_tokens // (_HELD_OUT_EVERY - 1), attention_mask)
    states = capture(adapter, tokens, attention_mask=mask, sites=(RESIDUAL_SITE,), n_tokens=UpperBound(n_tokens),
                     seed=seed, progress=progress)
    stack = states[RESIDUAL_SITE]  # [L + 1, N, d] float32
    held = (states.batch_index % _HELD_OUT_EVERY) == 0
    if int(held.sum()) < 2 or int((~held).sum()) < 8:
        raise ValueError(f"{states.n_tokens} positions are too few to hold some out: pass more text")
    train, held_out = stack[:, ~held.to(stack.device)], stack[:, held.to(stack.device)][:, :_EVAL_ROWS]
    w_u = adapter.unembed_matrix("raw").to(torch.float32)
    b_u = adapter.unembed_bias()

    _closed_form(lens, train, ridge)
    history: list[dict[str, Any]] = []

    def record(step: int, split: str, kl: Tensor) -> None:
        seconds = round(time.perf_counter() - started, 2)
        history.extend({"step": step, "seconds": seconds, "split": split, "layer": layer, "kl": float(value)}
                       for layer, value in enumerate(kl))

    evals = [_held_out_kl(lens, held_out, w_u, b_u)]
    record(0, "held_out", evals[-1])
    best = (float(evals[-1].mean()), {k: v.clone() for k, v in lens.translators.state_dict().items()})
    stopped, step = "closed form only", 0
    if refine and max_steps > 0:
        params = list(lens.translators.parameters())
        opt = torch.optim.Adam(params, lr=lr)
        generator = torch.Generator().manual_seed(seed)
        n_train = train.shape[1]
        bar = tqdm(total=max_steps, desc="tuned lens (fast)", disable=not progress, leave=False)
        stopped = "steps"
        train_kl, last_eval = torch.zeros(adapter.n_layers, dtype=torch.float64), 0
        lens.train()
        for step in range(1, max_steps + 1):
            rows = torch.randint(0, n_train, (min(batch_tokens, n_train),), generator=generator).to(train.device)
            with torch.no_grad():
                log_p = torch.log_softmax(unembed(adapter, train[-1, rows], w_u=w_u, b_u=b_u), dim=-1)
            opt.zero_grad(set_to_none=True)
            for layer in range(adapter.n_layers):  # one layer's [rows, V] logits alive at a time
                kl = kl_rows(log_p, lens(train[layer, rows], layer, w_u=w_u, b_u=b_u)).mean()
                kl.backward()
                train_kl[layer] += float(kl.detach())
            opt.step()
            bar.update()
            if step % eval_every == 0 or step == max_steps:
                record(step, "train", train_kl / (step - last_eval))  # mean over the steps since the last one
                train_kl.zero_()
                last_eval = step
                lens.eval()
                evals.append(_held_out_kl(lens, held_out, w_u, b_u))
                lens.train()
                record(step, "held_out", evals[-1])
                mean = float(evals[-1].mean())
                bar.set_postfix(held_out_kl=f"{mean:.3f}")
                if mean < best[0]:
                    best = (mean, {k: v.clone() for k, v in lens.translators.state_dict().items()})
                if len(evals) > patience:
                    before = float(evals[-1 - patience].mean())
                    if before - min(float(e.mean()) for e in evals[-patience:]) < tol * before:
                        stopped = "plateau"
                        break
            if time.perf_counter() - started > max_seconds:
                stopped = "time"
                break
        bar.close()
    lens.translators.load_state_dict(best[1])
    lens.eval()
    window = torch.stack(evals[-1 - patience:]) if len(evals) > patience else None
    converged = ([bool(c) for c in ((window.max(0).values - window.min(0).values)
                                    <= tol * window.max(0).values.clamp_min(1e-12))]
                 if window is not None else [stopped == "closed form only"] * adapter.n_layers)
    lens.training_info = {
        "method": "fast", "n_tokens": states.n_tokens, "n_train": int(train.shape[1]),
        "n_held_out": int(held_out.shape[1]), "seq_len": seq_len, "ridge": ridge, "refine": refine, "lr": lr,
        "batch_tokens": batch_tokens, "steps": step, "max_steps": max_steps, "max_seconds": max_seconds,
        "eval_every": eval_every, "patience": patience, "tol": tol, "stopped": stopped,
        "held_out_kl": [float(v) for v in evals[-1]], "best_held_out_kl_mean": best[0],
        "converged": converged, "history": history, "seconds": round(time.perf_counter() - started, 2),
    }
    return lens
