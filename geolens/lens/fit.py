"""Fit a tuned lens fast: capture the states once, solve the translators in closed form, refine on KL.

See docs/methods.md §C.4.

The reference recipe (:func:`geolens.lens.train_tuned_lens` with
``method="reference"``) runs the model and ``L`` full-vocabulary unembeddings,
forward and backward, for every training token (its speed on the default model is in
docs/benchmarks.md). This module separates the two costs:

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
   (``matmul_dtype="auto"``), its held-out KL always in float32. Every step's training KL per layer
   (its minibatch, before its update) and the held-out KL every ``eval_every`` steps are recorded
   (``lens.history``, the closed form at step 0); training stops on a plateau (the held-out mean improves
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
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from geolens._renames import renamed_keywords
from geolens._rng import rng
from geolens._validation import UpperBound, check_float, check_int
from geolens.capture import capture
from geolens.lens.logit_lens import unembed
from geolens.lens.train import DEFAULT_SEQ_LEN, _kl_of_logits, _padded_windows, dtype_name, resolve_matmul_dtype
from geolens.lens.tuned_lens import TunedLens, check_lens_fits
from geolens.model import Model, ModelAdapter, as_adapter
from geolens.sites import RESIDUAL_SITE

__all__ = ["FAST_BUDGET", "fit_tuned_lens"]

# The default fast budget: the positions of the capture and closed form, and a refinement bounded by steps
# and by seconds (what each part costs on the default model: bench/lens.py, docs/benchmarks.md).
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
    # The ridge makes each system symmetric positive definite: a Cholesky solve, with a clear error (naming
    # the layer) where a system is not, instead of a pivoted LU that can fail inside LAPACK on such input.
    factor, info = torch.linalg.cholesky_ex(gram + penalty)  # [L, d + 1, d + 1]
    if bool((info != 0).any()):
        layer = int(torch.nonzero(info)[0])
        raise ValueError(f"the closed-form tuned lens of layer {layer} has no unique solution: its normal equations "
                         "are not positive definite (non-finite or constant states at that layer)")
    w = torch.cholesky_solve(cross, factor)  # [L, d + 1, d]
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


@dataclass(frozen=True)
class _Settings:
    """The validated settings of a fit: the closed form's ridge and the refinement's budget."""

    ridge: float
    refine: bool
    lr: float
    batch_tokens: int
    max_steps: int
    max_seconds: float
    eval_every: int
    patience: int
    tol: float
    seed: int
    matmul_dtype: torch.dtype | None

    @classmethod
    def checked(cls, device: torch.device, **values: Any) -> "_Settings":
        """The settings from :func:`fit_tuned_lens`'s arguments, each checked (``device``: where the vocabulary
        products run, for ``matmul_dtype="auto"``)."""
        if not isinstance(values["refine"], bool):
            raise TypeError(f"refine must be a bool, got {values['refine']!r}")
        return cls(
            ridge=check_float(values["ridge"], "ridge", low=0), refine=values["refine"],
            lr=check_float(values["lr"], "lr", low=0, low_open=True),
            batch_tokens=check_int(values["batch_tokens"], "batch_tokens", low=1),
            max_steps=check_int(values["max_steps"], "max_steps", low=0),
            max_seconds=check_float(values["max_seconds"], "max_seconds", low=0),
            eval_every=check_int(values["eval_every"], "eval_every", low=1),
            patience=check_int(values["patience"], "patience", low=1),
            tol=check_float(values["tol"], "tol", low=0), seed=check_int(values["seed"], "seed", low=0),
            matmul_dtype=resolve_matmul_dtype(values["matmul_dtype"], device),
        )

    def recorded(self) -> dict[str, Any]:
        """The settings as ``training_info`` records them (JSON: the dtype by name)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**values, "matmul_dtype": dtype_name(self.matmul_dtype)}


@dataclass
class _Refinement:
    """What the refinement carries from step to step: the held-out evaluations, the best translators, the clock.

    ``started`` is the fit's start (the closed form included: the time budget counts it).
    ``history`` holds one row per layer for every measurement: ``held_out`` at step 0 (the closed form)
    and at every evaluation, ``train`` for every step ``s`` at step ``s - 1`` — the KL of step ``s``'s
    minibatch is measured before its update, on the translators after ``s - 1`` updates (so the
    closed form's training KL is step 0's, and both splits share one x axis).
    """

    lens: TunedLens
    held_out: Tensor
    targets: list[tuple[Tensor, Tensor]]
    w_u: Tensor
    b_u: Tensor | None
    started: float
    history: list[dict[str, Any]] = field(default_factory=list)
    evals: list[Tensor] = field(default_factory=list)
    best: tuple[float, dict[str, Tensor], Tensor] | None = None  # mean held-out KL, translators, KL per layer
    eval_seconds: float = 0.0  # how long the last held-out evaluation took
    last_eval: int = 0
    # Each step's training KL per layer, kept where the states are until the next evaluation reads them
    # back: reading every step back would make an accelerator wait for its kernels before the next step.
    pending: list[tuple[int, float, Tensor]] = field(default_factory=list)

    def record(self, step: int, split: str, kl: Tensor) -> None:
        seconds = round(time.perf_counter() - self.started, 2)
        self.history.extend({"step": step, "seconds": seconds, "split": split, "layer": layer, "kl": float(value)}
                            for layer, value in enumerate(kl))

    def evaluate(self, step: int) -> float:
        """The held-out KL of the translators now: timed, recorded, kept if the best so far; its mean."""
        began = time.perf_counter()
        kl = _held_out_kl(self.lens, self.held_out, self.w_u, self.b_u, self.targets)
        self.eval_seconds = time.perf_counter() - began
        self.evals.append(kl)
        self.record(step, "held_out", kl)
        mean = float(kl.mean())
        if self.best is None or mean < self.best[0]:
            self.best = (mean, {k: v.clone() for k, v in self.lens.translators.state_dict().items()}, kl)
        return mean

    def step_done(self, step: int, kl: Tensor) -> None:
        """Keep step ``step``'s training KL per layer (measured before its update), recorded at the next evaluation."""
        self.pending.append((step, round(time.perf_counter() - self.started, 2), kl.detach()))

    def evaluate_steps(self, step: int) -> float:
        """Record the training KL of each step since the last evaluation, then evaluate (in eval mode)."""
        for taken, seconds, kl in self.pending:
            self.history.extend({"step": taken - 1, "seconds": seconds, "split": "train", "layer": layer,
                                 "kl": float(value)} for layer, value in enumerate(kl.cpu().double()))
        self.pending.clear()
        self.last_eval = step
        self.lens.eval()
        mean = self.evaluate(step)
        self.lens.train()
        return mean

    def out_of_time(self, step: int, refining: float, max_seconds: float) -> bool:
        """Whether one more step and its evaluation would overrun ``max_seconds`` (``refining``: when step 1 began)."""
        now = time.perf_counter()
        step_seconds = (now - refining - self.eval_seconds * (len(self.evals) - 1)) / step  # the steps alone
        return now - self.started + step_seconds + self.eval_seconds > max_seconds


def _plateau(evals: list[Tensor], patience: int, tol: float) -> bool:
    """The mean held-out KL improved by less than ``tol`` (relative) over the last ``patience`` evaluations."""
    if len(evals) <= patience:
        return False
    before = float(evals[-1 - patience].mean())
    return before - min(float(e.mean()) for e in evals[-patience:]) < tol * before


def _converged(evals: list[Tensor], patience: int, tol: float, n_layers: int, closed_form_only: bool) -> list[bool]:
    """Per layer: its held-out KL moved by less than ``tol`` (relative to its largest) over the last ``patience``
    evaluations; without that many evaluations, whether the closed form alone was asked for."""
    if len(evals) <= patience:
        return [closed_form_only] * n_layers
    window = torch.stack(evals[-1 - patience:])
    high, low = window.max(0).values, window.min(0).values
    return [bool(c) for c in (high - low) <= tol * high.clamp_min(1e-12)]


def _refine_step(lens: TunedLens, rows: Tensor, opt: torch.optim.Optimizer, w_u: Tensor, w_train: Tensor,
                 b_u: Tensor | None, matmul_dtype: torch.dtype | None) -> Tensor:
    """One optimiser step of every translator on the exact mean ``KL(p_final || p_l)`` of ``rows`` ``[L + 1, n, d]``;
    the KL per layer before the step (``[L]``, where the rows are).

    ``w_train``: the unembedding in ``matmul_dtype`` for the lens's products; the target ``p`` is float32.
    """
    p, p_log_p = _target(lens.adapter, rows[-1], w_u, b_u)
    opt.zero_grad(set_to_none=True)
    kls = []
    for layer in range(lens.n_layers):  # one layer's [rows, V] logits alive at a time
        logits = lens(rows[layer], layer, w_u=w_train, b_u=b_u, matmul_dtype=matmul_dtype)
        with torch.no_grad():  # d mean KL / d logits = (softmax(logits) - p) / n, formed in place
            kl, lse = _kl_of_logits(p, p_log_p, logits)
            grad = logits.sub(lse).exp_().sub_(p).div_(logits.shape[0])
        # Gradients of this layer's translator only: none may reach the model's norm or unembedding.
        logits.backward(grad, inputs=list(lens.translators[layer].parameters()))
        kls.append(kl.mean())
    opt.step()
    return torch.stack(kls)


def _refine(state: _Refinement, train: Tensor, settings: _Settings, *, progress: bool, desc: str) -> tuple[str, int]:
    """Adam on minibatches of the ``train`` rows until a plateau, the step budget or the time budget;
    ``(why it stopped, steps taken)``. Every step taken is evaluated before it stops."""
    lens = state.lens
    opt = torch.optim.Adam(list(lens.translators.parameters()), lr=settings.lr)
    generator = rng(settings.seed, "lens batches")
    w_train = state.w_u if settings.matmul_dtype is None else state.w_u.to(settings.matmul_dtype)  # converted once
    n_train = train.shape[1]
    bar = tqdm(total=settings.max_steps, desc=desc, disable=not progress, leave=False)
    stopped = "steps"
    lens.train()
    refining = time.perf_counter()
    for step in range(1, settings.max_steps + 1):
        rows = torch.randint(0, n_train, (min(settings.batch_tokens, n_train),), generator=generator).to(train.device)
        state.step_done(step, _refine_step(lens, train[:, rows], opt, state.w_u, w_train, state.b_u,
                                           settings.matmul_dtype))
        bar.update()
        if step % settings.eval_every == 0 or step == settings.max_steps:
            bar.set_postfix(held_out_kl=f"{state.evaluate_steps(step):.3f}")
            if _plateau(state.evals, settings.patience, settings.tol):
                stopped = "plateau"
                break
        if step < settings.max_steps and state.out_of_time(step, refining, settings.max_seconds):
            # One more step and its evaluation would overrun: stop here, with these steps evaluated.
            stopped = "time"
            if state.last_eval != step:
                state.evaluate_steps(step)
            break
    bar.close()
    return stopped, step


def _fit_rows(lens: TunedLens, train: Tensor, held_out: Tensor, w_u: Tensor, b_u: Tensor | None,
              settings: _Settings, *, progress: bool, desc: str, normal: tuple[Tensor, Tensor] | None = None,
              held_out_targets: list[tuple[Tensor, Tensor]] | None = None) -> dict[str, Any]:
    """Closed form on ``train`` ``[L + 1, N, d]`` (from its normal equations ``normal`` if given), then
    the KL refinement (:func:`_refine`); the lens keeps the best evaluated translators. The training record.

    The refinement's vocabulary products run in ``settings.matmul_dtype`` (bf16 where the device
    multiplies it natively, so more steps fit the budget); its target distribution and every held-out
    evaluation stay float32. The time budget includes the last held-out evaluation: the refinement
    stops while one more step and an evaluation still fit, and evaluates the steps taken since the
    last evaluation, so no step is run and then thrown away.
    """
    started = time.perf_counter()
    _solve_ridge(lens, *(normal if normal is not None else _normal_equations(train)), settings.ridge)
    if held_out_targets is None:
        held_out_targets = _held_out_targets(held_out, lens.adapter, w_u, b_u)
    state = _Refinement(lens, held_out, held_out_targets, w_u, b_u, started)
    state.evaluate(0)
    stopped, steps = "closed form only", 0
    if settings.refine and settings.max_steps > 0:
        stopped, steps = _refine(state, train, settings, progress=progress, desc=desc)
    best_mean, best_translators, best_kl = state.best
    lens.translators.load_state_dict(best_translators)
    lens.eval()
    return {"n_train": int(train.shape[1]), "steps": steps, "stopped": stopped,
            "held_out_kl": [float(v) for v in best_kl], "best_held_out_kl_mean": best_mean,
            "closed_form_held_out_kl_mean": float(state.evals[0].mean()),
            "converged": _converged(state.evals, settings.patience, settings.tol, lens.n_layers,
                                    stopped == "closed form only"),
            "history": state.history, "seconds": round(time.perf_counter() - started, 2)}


def _capture_split(adapter: ModelAdapter, texts: Any, *, n_tokens: int, seq_len: int, attention_mask: Tensor | None,
                   seed: int, progress: bool) -> tuple[Tensor, Tensor, Tensor, int]:
    """The residual stream at up to ``n_tokens`` training positions of ``texts``, and held-out ones from
    every fifth window: ``(train [L + 1, N, d], held_out [L + 1, <= 256, d], text of each train row [N], positions)``."""
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
    text_of_row = torch.tensor(origins, dtype=torch.long)[states.batch_index[~held].cpu()]
    return train, held_out, text_of_row, states.n_tokens


def _fit_halves(adapter: ModelAdapter, train: Tensor, held_out: Tensor, text_of_row: Tensor, w_u: Tensor,
                b_u: Tensor | None, settings: _Settings, targets: list[tuple[Tensor, Tensor]], *, seq_len: int,
                progress: bool) -> tuple[tuple[TunedLens, TunedLens], tuple[Tensor, Tensor]]:
    """Two lenses, each fitted on the training rows of one half of the texts (even, odd), and the sum of
    their normal equations (those of all the rows: a half's are a sum over its rows)."""
    lenses, normals = [], []
    for part in (0, 1):
        # The half of a training row is its text's parity: disjoint texts, not disjoint windows of one text.
        rows = (text_of_row % 2 == part).to(train.device)
        if int(rows.sum()) < 8:
            raise ValueError(f"halves=True: the training windows of {'even' if part == 0 else 'odd'} texts hold "
                             f"{int(rows.sum())} positions; pass at least two texts (or rows of ids) with text")
        half_train = train[:, rows]
        normals.append(_normal_equations(half_train))
        half = TunedLens(adapter)
        info = _fit_rows(half, half_train, held_out, w_u, b_u, settings, desc=f"tuned lens (half {part})",
                         progress=progress, normal=normals[-1], held_out_targets=targets)
        del half_train
        half.training_info = {"method": "fast", "half": part, "seq_len": seq_len, **settings.recorded(), **info}
        lenses.append(half)
    whole = tuple(a + b for a, b in zip(*normals))
    return (lenses[0], lenses[1]), whole


def _data_gain(halves_kl: list[list[float]], full_kl: list[float]) -> list[float]:
    """Per layer, the relative drop in held-out KL from the half-text lenses (their mean) to the whole-text one."""
    halves = torch.tensor(halves_kl, dtype=torch.float64).mean(0)
    full = torch.tensor(full_kl, dtype=torch.float64)
    return ((halves - full) / halves.clamp_min(1e-12)).tolist()


@renamed_keywords(texts="tokens")
def fit_tuned_lens(
    model: Model,
    tokens,
    *,
    lens: TunedLens | None = None,
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
    n_tokens: int = FAST_BUDGET["n_tokens"],
    seed: int = 0,
    attention_mask: Tensor | None = None,
    progress: bool = True,
) -> TunedLens:
    """A tuned lens in minutes on a CPU: closed-form translators from captured states, refined on the exact KL.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge`` (frozen; never changed).
        tokens: training texts (a list of str) or ``[B, T]`` token ids (each row counts as one text).
        lens: a lens to refine (its translators are replaced by the closed form first).
        seq_len: tokens per window.
        ridge: the ridge penalty relative to the mean variance of each layer's states (0.01: on the
            default model the best of 1e-3, 1e-2, 0.1 from 2,048 to 32,768 positions in
            bench/lens.py; 0.1 over-shrinks towards the logit lens once there is data).
        refine: run the KL refinement after the closed form (``False``: closed form only).
        lr: Adam's learning rate.
        batch_tokens: training rows per step.
        max_steps: the refinement budget in steps; training stops earlier on a plateau.
        max_seconds: the refinement budget in seconds from the end of the capture.
        eval_every: the held-out KL is measured every ``eval_every`` steps.
        patience: a relative improvement below ``tol`` over ``patience`` evaluations is a plateau.
        tol: the relative improvement under which an evaluation counts towards the plateau.
        matmul_dtype: dtype of the refinement's vocabulary products: ``"auto"`` (bfloat16 where the
            device multiplies it natively, see :func:`geolens.lens.train.fast_matmul_dtype`; else
            float32), ``torch.bfloat16``, or ``None`` / ``torch.float32``. The closed form, the
            target distribution and the held-out KL are always float32 or wider.
        halves: also fit two lenses with the same settings, each on the training windows of one half
            of the texts (even and odd texts; the same capture), as ``lens.halves`` — for
            :func:`geolens.analyses.phases.phase_stability` and for ``training_info["data_gain"]``.
        n_tokens: token positions captured to train on (an upper bound: with less text, what there
            is, with a warning); a fifth of the windows is held out.
        seed: seed of the position sample and of the minibatches.
        attention_mask: for token ids.
        progress: tqdm bar with the held-out KL.

    Returns:
        the :class:`TunedLens`; ``lens.history`` (a DataFrame of ``step, seconds, split, layer, kl``: every
        step's training KL, the held-out KL at step 0 and every evaluation; see :attr:`TunedLens.history`),
        ``lens.training_info["converged"]`` (per layer), ``["stopped"]`` (``plateau``, ``steps``, ``time``,
        ``closed form only``), ``["held_out_kl"]`` (per layer, of the returned translators: the best
        held-out evaluation, which may be the closed form's), ``["best_held_out_kl_mean"]`` and
        ``["closed_form_held_out_kl_mean"]`` (its mean over layers, and the closed form's). With ``halves=True``, ``["data_gain"]``: per layer, the relative drop in
        held-out KL from a half-text lens (mean of the two) to this lens, which sees twice the data —
        near 0 where more text would not change the lens; ``["halves_held_out_kl"]``: the halves' KL.
    """
    adapter = as_adapter(model)
    n_tokens = check_int(n_tokens, "n_tokens", low=16)
    seq_len = check_int(seq_len, "seq_len", low=3)
    settings = _Settings.checked(adapter.unembed_matrix("raw").device, ridge=ridge, refine=refine, lr=lr,
                                 batch_tokens=batch_tokens, max_steps=max_steps, max_seconds=max_seconds,
                                 eval_every=eval_every, patience=patience, tol=tol, seed=seed,
                                 matmul_dtype=matmul_dtype)
    if not isinstance(halves, bool):
        raise TypeError(f"halves must be a bool, got {halves!r}")
    lens = TunedLens(adapter) if lens is None else lens
    if not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be a TunedLens, got {type(lens).__name__}")
    check_lens_fits(lens, adapter)
    started = time.perf_counter()
    train, held_out, text_of_row, n_captured = _capture_split(adapter, tokens, n_tokens=n_tokens, seq_len=seq_len,
                                                              attention_mask=attention_mask, seed=seed,
                                                              progress=progress)
    w_u = adapter.unembed_matrix("raw").to(torch.float32)
    b_u = adapter.unembed_bias()
    capture_seconds = round(time.perf_counter() - started, 2)
    # Computed once for every lens fitted on this capture: the held-out targets, and the normal
    # equations of the closed form (a half's are a sum over its rows, the whole's the sum of the halves').
    targets = _held_out_targets(held_out, adapter, w_u, b_u)
    half_lenses, normal = None, None
    if halves:
        half_lenses, normal = _fit_halves(adapter, train, held_out, text_of_row, w_u, b_u, settings, targets,
                                          seq_len=seq_len, progress=progress)
    info = _fit_rows(lens, train, held_out, w_u, b_u, settings, desc="tuned lens (fast)", progress=progress,
                     normal=normal, held_out_targets=targets)
    lens.training_info = {
        "method": "fast", "n_tokens": n_captured, "n_held_out": int(held_out.shape[1]), "seq_len": seq_len,
        **settings.recorded(), **info, "capture_seconds": capture_seconds,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if half_lenses is not None:
        halves_kl = [h.training_info["held_out_kl"] for h in half_lenses]
        lens.training_info.update(halves_held_out_kl=halves_kl, data_gain=_data_gain(halves_kl, info["held_out_kl"]))
    lens.halves = half_lenses
    return lens
