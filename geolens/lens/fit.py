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
   step; its vocabulary products run in bf16 where the device has it natively
   (``matmul_dtype="auto"``), its held-out KL always in float32. The held-out KL per layer is recorded every ``eval_every`` steps
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

import time
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from geolens._validation import UpperBound, check_float, check_int
from geolens.capture import capture
from geolens.lens.logit_lens import unembed
from geolens.lens.train import DEFAULT_SEQ_LEN, _kl_of_logits, _padded_windows, dtype_name, resolve_matmul_dtype
from geolens.lens.tuned_lens import TunedLens, check_lens_fits
from geolens.model import ModelAdapter, as_adapter
from geolens.sites import RESIDUAL_SITE

__all__ = ["FAST_BUDGET", "fit_tuned_lens"]

# The default fast budget, measured on the default model (2 cores) in bench/lens.py: the capture of
# 32768 + 8192 positions takes 60-110 s (by machine), the closed form ~35 s, a refinement step ~1.2 s
# with bf16 products (2.8 s in float32) plus a held-out evaluation of 6 s every 20 steps.
FAST_BUDGET: dict[str, Any] = {"n_tokens": 32768, "max_steps": 200, "max_seconds": 170.0}
# Relative ridge of the closed form; part of the lens cache key, so a change refits cached lenses.
DEFAULT_RIDGE = 0.01
_HELD_OUT_EVERY = 5  # every fifth window is held out
_EVAL_ROWS = 256  # held-out rows scored at each evaluation
_ROW_CHUNK = 256
_CLOSED_FORM_CHUNK = 2048  # rows of every layer in float64 at once (~0.3 GB for 30 layers, d = 576)


def _normal_equations(train: Tensor) -> tuple[Tensor, Tensor]:
    """``(gram [L, d + 1, d + 1], cross [L, d + 1, d])`` (float64) of the ridge regression of ``H_L - H_l``
    on ``[H_l, 1]`` for every layer ``l < L`` of ``train`` ``[L + 1, N, d]``.

    Accumulated over row chunks, so memory stays at one chunk of all layers whatever the number of
    rows; sums over rows, so the equations of disjoint row sets add up to those of their union.
    """
    n_layers, n, d = train.shape[0] - 1, train.shape[1], train.shape[2]
    gram = torch.zeros(n_layers, d + 1, d + 1, dtype=torch.float64, device=train.device)
    cross = torch.zeros(n_layers, d + 1, d, dtype=torch.float64, device=train.device)
    for start in range(0, n, _CLOSED_FORM_CHUNK):
        h = train[:-1, start:start + _CLOSED_FORM_CHUNK].double()  # [L, n_chunk, d]
        target = train[-1, start:start + _CLOSED_FORM_CHUNK].double().unsqueeze(0) - h
        x = torch.cat([h, h.new_ones(h.shape[0], h.shape[1], 1)], dim=-1)  # [L, n_chunk, d + 1]
        gram += x.transpose(1, 2) @ x
        cross += x.transpose(1, 2) @ target
    return gram, cross


def _solve_ridge(lens: TunedLens, gram: Tensor, cross: Tensor, ridge: float) -> None:
    """The ridge solution of the normal equations ``(gram, cross)``, written into the translators."""
    d = gram.shape[-1] - 1
    scale = torch.diagonal(gram[:, :d, :d], dim1=1, dim2=2).mean(dim=1)  # ridge relative to each layer's scale
    penalty = torch.zeros_like(gram)
    penalty[:, range(d), range(d)] = (ridge * scale).unsqueeze(1)
    w = torch.linalg.solve(gram + penalty, cross)  # [L, d + 1, d]
    with torch.no_grad():
        for layer, translator in enumerate(lens.translators):
            translator.weight.copy_(w[layer, :d].T.to(translator.weight.dtype))
            if translator.bias is not None:
                translator.bias.copy_(w[layer, d].to(translator.bias.dtype))


def _closed_form(lens: TunedLens, train: Tensor, ridge: float) -> None:
    """Ridge regression of ``H_L - H_l`` on ``[H_l, 1]`` for every layer ``l < L``, written into the translators."""
    _solve_ridge(lens, *_normal_equations(train), ridge)


def _target(adapter: ModelAdapter, last: Tensor, w_u: Tensor, b_u: Tensor | None) -> tuple[Tensor, Tensor]:
    """``p`` ``[n, V]``, the final distribution of the rows ``last``, and ``sum_v p log p`` ``[n]`` (float32, no grad)."""
    with torch.no_grad():
        log_p = torch.log_softmax(unembed(adapter, last, w_u=w_u, b_u=b_u), dim=-1)
        p = log_p.exp()
        return p, torch.linalg.vecdot(p, log_p)


def _held_out_targets(states: Tensor, adapter: ModelAdapter, w_u: Tensor, b_u: Tensor | None) -> list[tuple[Tensor, Tensor]]:
    """:func:`_target` of the last layer's rows of ``states`` ``[L + 1, N, d]``, per row chunk: computed once,
    reused by every held-out evaluation (of every lens fitted on the same capture)."""
    return [_target(adapter, states[-1, start:start + _ROW_CHUNK], w_u, b_u)
            for start in range(0, states.shape[1], _ROW_CHUNK)]


def _held_out_kl(lens: TunedLens, states: Tensor, w_u: Tensor, b_u: Tensor | None,
                 targets: list[tuple[Tensor, Tensor]] | None = None) -> Tensor:
    """Mean ``KL(p_final || p_l)`` per layer ``0..L-1`` over the rows of ``states`` ``[L + 1, N, d]`` (float64);
    ``targets``: their :func:`_held_out_targets`, if already computed."""
    n_layers = states.shape[0] - 1
    total = torch.zeros(n_layers, dtype=torch.float64)
    if targets is None:
        targets = _held_out_targets(states, lens.adapter, w_u, b_u)
    with torch.no_grad():
        for chunk, (p, p_log_p) in enumerate(targets):
            rows = slice(chunk * _ROW_CHUNK, (chunk + 1) * _ROW_CHUNK)
            for layer in range(n_layers):
                kl, _ = _kl_of_logits(p, p_log_p, lens(states[layer, rows], layer, w_u=w_u, b_u=b_u))
                total[layer] += float(kl.double().sum())
    return total / states.shape[1]


def _fit_rows(lens: TunedLens, train: Tensor, held_out: Tensor, w_u: Tensor, b_u: Tensor | None, *,
              ridge: float, refine: bool, lr: float, batch_tokens: int, max_steps: int, max_seconds: float,
              eval_every: int, patience: int, tol: float, seed: int, matmul_dtype: torch.dtype | None,
              progress: bool, desc: str, normal: tuple[Tensor, Tensor] | None = None,
              held_out_targets: list[tuple[Tensor, Tensor]] | None = None) -> dict[str, Any]:
    """Closed form on ``train`` ``[L + 1, N, d]`` (from its normal equations ``normal`` if given), then
    the KL refinement; the training record.

    The refinement's vocabulary products run in ``matmul_dtype`` (bf16 where the device multiplies
    it natively: 2.5x faster on an AVX512-BF16 CPU, so more steps fit the budget); its target
    distribution and every held-out evaluation stay float32. The time budget includes the last
    held-out evaluation: the refinement stops while one more step and an evaluation still fit, and
    evaluates the steps taken since the last evaluation, so no step is run and then thrown away.
    """
    adapter = lens.adapter
    w_train = w_u if matmul_dtype is None else w_u.to(matmul_dtype)  # converted once, not at every product
    started = time.perf_counter()
    _solve_ridge(lens, *(normal if normal is not None else _normal_equations(train)), ridge)
    if held_out_targets is None:
        held_out_targets = _held_out_targets(held_out, adapter, w_u, b_u)
    history: list[dict[str, Any]] = []

    def record(step: int, split: str, kl: Tensor) -> None:
        seconds = round(time.perf_counter() - started, 2)
        history.extend({"step": step, "seconds": seconds, "split": split, "layer": layer, "kl": float(value)}
                       for layer, value in enumerate(kl))

    def held_out_kl() -> Tensor:
        nonlocal eval_seconds
        began = time.perf_counter()
        kl = _held_out_kl(lens, held_out, w_u, b_u, held_out_targets)
        eval_seconds = time.perf_counter() - began
        return kl

    eval_seconds = 0.0
    evals = [held_out_kl()]
    record(0, "held_out", evals[-1])
    # The best evaluation so far: its mean, its translators and its per-layer KL (what is returned and reported).
    best = (float(evals[-1].mean()), {k: v.clone() for k, v in lens.translators.state_dict().items()}, evals[-1])
    stopped, step = "closed form only", 0
    if refine and max_steps > 0:
        params = list(lens.translators.parameters())
        opt = torch.optim.Adam(params, lr=lr)
        generator = torch.Generator().manual_seed(seed)
        n_train = train.shape[1]
        bar = tqdm(total=max_steps, desc=desc, disable=not progress, leave=False)
        stopped = "steps"
        # The running train KL stays where the states are: reading it back every layer would make an
        # accelerator wait for each layer's kernels before the next are queued (MPS has no float64).
        kl_dtype = torch.float32 if train.device.type == "mps" else torch.float64
        train_kl, last_eval = torch.zeros(adapter.n_layers, dtype=kl_dtype, device=train.device), 0

        def evaluate_steps(step: int) -> bool:
            """Record the train KL since the last evaluation and the held-out KL now; True on a plateau."""
            nonlocal best, last_eval
            record(step, "train", (train_kl / (step - last_eval)).cpu())  # mean since the last evaluation
            train_kl.zero_()
            last_eval = step
            lens.eval()
            evals.append(held_out_kl())
            lens.train()
            record(step, "held_out", evals[-1])
            mean = float(evals[-1].mean())
            bar.set_postfix(held_out_kl=f"{mean:.3f}")
            if mean < best[0]:
                best = (mean, {k: v.clone() for k, v in lens.translators.state_dict().items()}, evals[-1])
            if len(evals) > patience:
                before = float(evals[-1 - patience].mean())
                return before - min(float(e.mean()) for e in evals[-patience:]) < tol * before
            return False

        lens.train()
        refining = time.perf_counter()
        for step in range(1, max_steps + 1):
            rows = torch.randint(0, n_train, (min(batch_tokens, n_train),), generator=generator).to(train.device)
            p, p_log_p = _target(adapter, train[-1, rows], w_u, b_u)
            opt.zero_grad(set_to_none=True)
            for layer in range(adapter.n_layers):  # one layer's [rows, V] logits alive at a time
                logits = lens(train[layer, rows], layer, w_u=w_train, b_u=b_u, matmul_dtype=matmul_dtype)
                with torch.no_grad():  # d mean KL / d logits = (softmax(logits) - p) / n, formed in place
                    kl, lse = _kl_of_logits(p, p_log_p, logits)
                    grad = logits.sub(lse).exp_().sub_(p).div_(logits.shape[0])
                # Gradients of this layer's translator only: none may reach the model's norm or unembedding.
                logits.backward(grad, inputs=list(lens.translators[layer].parameters()))
                train_kl[layer] += kl.mean()
            opt.step()
            bar.update()
            if (step % eval_every == 0 or step == max_steps) and evaluate_steps(step):
                stopped = "plateau"
                break
            now = time.perf_counter()
            step_seconds = (now - refining - eval_seconds * (len(evals) - 1)) / step  # the steps alone
            if step < max_steps and now - started + step_seconds + eval_seconds > max_seconds:
                # One more step and its evaluation would overrun: stop here, with these steps evaluated.
                stopped = "time"
                if last_eval != step:
                    evaluate_steps(step)
                break
        bar.close()
    lens.translators.load_state_dict(best[1])
    lens.eval()
    window = torch.stack(evals[-1 - patience:]) if len(evals) > patience else None
    converged = ([bool(c) for c in ((window.max(0).values - window.min(0).values)
                                    <= tol * window.max(0).values.clamp_min(1e-12))]
                 if window is not None else [stopped == "closed form only"] * adapter.n_layers)
    return {"n_train": int(train.shape[1]), "steps": step, "stopped": stopped,
            "held_out_kl": [float(v) for v in best[2]], "best_held_out_kl_mean": best[0],
            "converged": converged, "history": history, "seconds": round(time.perf_counter() - started, 2)}


def fit_tuned_lens(
    model: object,
    texts,
    *,
    lens: TunedLens | None = None,
    n_tokens: int = FAST_BUDGET["n_tokens"],
    seq_len: int = DEFAULT_SEQ_LEN,
    ridge: float = DEFAULT_RIDGE,
    refine: bool = True,
    lr: float = 1e-3,
    batch_tokens: int = 64,
    max_steps: int = FAST_BUDGET["max_steps"],
    max_seconds: float = FAST_BUDGET["max_seconds"],
    eval_every: int = 20,
    patience: int = 3,
    tol: float = 0.01,
    matmul_dtype: torch.dtype | None | str = "auto",
    halves: bool = False,
    attention_mask: Tensor | None = None,
    seed: int = 0,
    progress: bool = True,
) -> TunedLens:
    """A tuned lens in minutes on a CPU: closed-form translators from captured states, refined on the exact KL.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge`` (frozen; never changed).
        texts: training texts (a list of str) or ``[B, T]`` token ids (each row counts as one text).
        lens: a lens to refine (its translators are replaced by the closed form first).
        n_tokens: positions captured (an upper bound: with less text, what there is, with a warning);
            a fifth of the windows is held out.
        seq_len: tokens per window.
        ridge: the ridge penalty relative to the mean variance of each layer's states (0.01: on the
            default model the best of 1e-3, 1e-2, 0.1 from 2,048 to 32,768 positions within 1 %,
            see bench/lens.py; 0.1 over-shrinks towards the logit lens once there is data).
        refine: run the KL refinement after the closed form (``False``: closed form only).
        lr, batch_tokens: Adam's learning rate and the training rows per step.
        max_steps, max_seconds: the refinement budget (steps, and seconds from the end of the capture);
            training stops earlier on a plateau.
        eval_every, patience, tol: the held-out KL is measured every ``eval_every`` steps; a relative
            improvement below ``tol`` over ``patience`` evaluations is a plateau.
        matmul_dtype: dtype of the refinement's vocabulary products: ``"auto"`` (bfloat16 where the
            device multiplies it natively, see :func:`geolens.lens.train.fast_matmul_dtype`; else
            float32), ``torch.bfloat16``, or ``None`` / ``torch.float32``. The closed form, the
            target distribution and the held-out KL are always float32 or wider.
        halves: also fit two lenses with the same settings, each on the training windows of one half
            of the texts (even and odd texts; the same capture), as ``lens.halves`` — for
            :func:`geolens.analyses.phases.phase_stability` and for ``training_info["data_gain"]``.
        attention_mask: for token ids.
        seed: seed of the position sample and of the minibatches.
        progress: tqdm bar with the held-out KL.

    Returns:
        the :class:`TunedLens`; ``lens.history`` (a DataFrame of ``step, seconds, split, layer, kl``),
        ``lens.training_info["converged"]`` (per layer), ``["stopped"]`` (``plateau``, ``steps``, ``time``,
        ``closed form only``), ``["held_out_kl"]`` (per layer, of the returned translators: the best
        held-out evaluation, which may be the closed form's). With ``halves=True``, ``["data_gain"]``: per layer, the relative drop in
        held-out KL from a half-text lens (mean of the two) to this lens, which sees twice the data —
        near 0 where more text would not change the lens; ``["halves_held_out_kl"]``: the halves' KL.
    """
    adapter = as_adapter(model)
    n_tokens = check_int(n_tokens, "n_tokens", low=16)
    seq_len = check_int(seq_len, "seq_len", low=3)
    ridge = check_float(ridge, "ridge", low=0)
    lr = check_float(lr, "lr", low=0, low_open=True)
    batch_tokens = check_int(batch_tokens, "batch_tokens", low=1)
    max_steps = check_int(max_steps, "max_steps", low=0)
    max_seconds = check_float(max_seconds, "max_seconds", low=0)
    eval_every = check_int(eval_every, "eval_every", low=1)
    patience = check_int(patience, "patience", low=1)
    tol = check_float(tol, "tol", low=0)
    if not isinstance(halves, bool):
        raise TypeError(f"halves must be a bool, got {halves!r}")
    matmul_dtype = resolve_matmul_dtype(matmul_dtype, adapter.unembed_matrix("raw").device)
    lens = TunedLens(adapter) if lens is None else lens
    if not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be a TunedLens, got {type(lens).__name__}")
    check_lens_fits(lens, adapter)
    started = time.perf_counter()

    origins: list[int] = []
    tokens, mask = _padded_windows(adapter, texts, seq_len, attention_mask,
                                   needed=n_tokens + n_tokens // (_HELD_OUT_EVERY - 1), origins=origins)
    states = capture(adapter, tokens, attention_mask=mask, sites=(RESIDUAL_SITE,), n_tokens=UpperBound(n_tokens),
                     seed=seed, progress=progress)
    stack = states[RESIDUAL_SITE]  # [L + 1, N, d] float32
    held = (states.batch_index % _HELD_OUT_EVERY) == 0
    if int(held.sum()) < 2 or int((~held).sum()) < 8:
        raise ValueError(f"{states.n_tokens} positions are too few to hold some out: pass more text")
    train, held_out = stack[:, ~held.to(stack.device)], stack[:, held.to(stack.device)][:, :_EVAL_ROWS]
    w_u = adapter.unembed_matrix("raw").to(torch.float32)
    b_u = adapter.unembed_bias()
    settings = dict(ridge=ridge, refine=refine, lr=lr, batch_tokens=batch_tokens, max_steps=max_steps,
                    max_seconds=max_seconds, eval_every=eval_every, patience=patience, tol=tol, seed=seed,
                    matmul_dtype=matmul_dtype)
    recorded = {**settings, "matmul_dtype": dtype_name(matmul_dtype)}  # training_info is saved as JSON
    capture_seconds = round(time.perf_counter() - started, 2)
    # Computed once for every lens fitted on this capture: the held-out targets, and the normal
    # equations of the closed form (a half's are a sum over its rows, the whole's the sum of the halves').
    targets = _held_out_targets(held_out, adapter, w_u, b_u)
    half_lenses, half_normals = None, []
    if halves:
        # The half of a training row is its text's parity: disjoint texts, not disjoint windows of one text.
        text_of_row = torch.tensor(origins, dtype=torch.long)[states.batch_index[~held].cpu()]
        half_lenses = (TunedLens(adapter), TunedLens(adapter))
        for part, half_lens in enumerate(half_lenses):
            rows = (text_of_row % 2 == part).to(train.device)
            if int(rows.sum()) < 8:
                raise ValueError(f"halves=True: the training windows of {'even' if part == 0 else 'odd'} texts hold "
                                 f"{int(rows.sum())} positions; pass at least two texts (or rows of ids) with text")
            half_train = train[:, rows]
            half_normals.append(_normal_equations(half_train))
            info = _fit_rows(half_lens, half_train, held_out, w_u, b_u, desc=f"tuned lens (half {part})",
                             progress=progress, normal=half_normals[-1], held_out_targets=targets, **settings)
            del half_train
            half_lens.training_info = {"method": "fast", "half": part, "seq_len": seq_len, **recorded, **info}
    normal = tuple(a + b for a, b in zip(*half_normals)) if half_normals else None
    del half_normals
    info = _fit_rows(lens, train, held_out, w_u, b_u, desc="tuned lens (fast)", progress=progress, normal=normal,
                     held_out_targets=targets, **settings)
    lens.training_info = {
        "method": "fast", "n_tokens": states.n_tokens, "n_held_out": int(held_out.shape[1]), "seq_len": seq_len,
        **recorded, **info, "capture_seconds": capture_seconds,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if half_lenses is not None:
        lens.training_info["halves_held_out_kl"] = [h.training_info["held_out_kl"] for h in half_lenses]
        halves_kl = torch.tensor(lens.training_info["halves_held_out_kl"], dtype=torch.float64).mean(0)
        full_kl = torch.tensor(info["held_out_kl"], dtype=torch.float64)
        lens.training_info["data_gain"] = ((halves_kl - full_kl) / halves_kl.clamp_min(1e-12)).tolist()
    lens.halves = half_lenses
    return lens
