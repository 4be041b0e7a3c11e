"""Train a :class:`~geolens.lens.TunedLens` by KL distillation from the model's final distribution.

See docs/methods.md §C.4.

Loss of layer ``l``: ``KL(p_final || p_l)`` at the same position, averaged over
the real tokens of a step (padding and each sequence's first token — BOS, the
attention sink — left out); the step's objective is the sum over layers
``0..L-1``, as in the reference recipe (tuned-lens, Belrose et al. 2023):
SGD with Nesterov momentum 0.9, lr ``1.0 * (1 - 0.9)`` (PyTorch's momentum
scales the step by ``1 / (1 - momentum)``), weight decay ``1e-3``, gradient
norm clipped to 1.0, the lr decayed linearly to 0, no warm-up.

The reference budget (250 steps of 2^18 tokens) is far beyond a CPU; the
defaults here are :data:`DEFAULT_STEPS` steps of :data:`DEFAULT_TOKENS_PER_STEP`
tokens (what they cost on the default model: docs/benchmarks.md). The vocabulary
product dominates the cost (``4 * d * V`` FLOPs per token and layer), so it
runs in bfloat16 where bfloat16 is fast (``matmul_dtype="auto"``: a CUDA device
with bf16 support, or a CPU with AVX512-BF16/AMX); log-softmax and KL stay
float32. On a CPU without native bf16 (e.g. AVX2 only) a bf16 product is
emulated and much *slower* than float32, so "auto" keeps float32 there.

Memory is bounded by one micro-batch: text is tokenised lazily, ``batch_size``
windows of ``seq_len`` tokens at a time; the residual stream of a micro-batch
is captured with hooks under ``no_grad`` and its gradient accumulated, one
layer at a time. The model is frozen: no gradient reaches it (gradients are
taken only with respect to the translators), its weights are never changed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from geolens._renames import renamed_keywords
from geolens._validation import check_float, check_int
from geolens.lens.logit_lens import residual_stream
from geolens.lens.tuned_lens import TunedLens, check_lens_fits
from geolens.model import Model, ModelAdapter, as_adapter

__all__ = ["train_tuned_lens", "fast_matmul_dtype", "DEFAULT_STEPS", "DEFAULT_TOKENS_PER_STEP", "DEFAULT_SEQ_LEN", "kl_rows"]

DEFAULT_STEPS = 50
DEFAULT_TOKENS_PER_STEP = 128  # DEFAULT_STEPS x 128 = 6.4k training tokens: a budget for a CPU
DEFAULT_SEQ_LEN = 128
_ROW_CHUNK = 512  # rows of [N, V] logits alive at once
_KL_ROWS = 8  # rows of [N, V] logits reduced at a time (here, and in lens.evaluate): their passes stay in cache
_WINDOW_GROUP = 8  # windows read at a time when a fit gathers enough positions


def kl_rows(log_p: Tensor, logits_q: Tensor) -> Tensor:
    """``KL(p || q)`` per row from ``log p`` ``[N, V]`` and the logits of ``q`` ``[N, V]`` (nats)."""
    log_q = torch.log_softmax(logits_q.to(torch.float32), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _kl_of_logits(p: Tensor, p_log_p: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
    """``KL(p || softmax(logits))`` per row and ``logsumexp(logits)`` ``[n, 1]``.

    ``KL = sum p log p - <p, z> + logsumexp(z)``: two passes over ``[n, V]`` where
    ``kl_rows`` (log-softmax, exp, difference, product) needs about five.
    """
    kls, lses = [], []
    for start in range(0, logits.shape[0], _KL_ROWS):  # a few rows at a time: their [rows, V] stays in cache
        rows = slice(start, start + _KL_ROWS)
        lse = torch.logsumexp(logits[rows], dim=-1, keepdim=True)
        kls.append(p_log_p[rows] - torch.linalg.vecdot(p[rows], logits[rows]) + lse.squeeze(-1))
        lses.append(lse)
    return torch.cat(kls), torch.cat(lses)


def _windows(adapter: ModelAdapter, data: Any, seq_len: int, attention_mask: Tensor | None,
             origins: list[int] | None = None) -> Iterator[Tensor]:
    """Token windows of at most ``seq_len`` ids, lazily, in the order of ``data``.

    ``data``: ``[B, T]`` token ids (each row's real tokens are one window, cut at ``seq_len``) or
    texts (a str, or an iterable of them), each tokenised and cut by :func:`_cut`. ``origins``
    (if given) receives the index of the text (or row) of each window.
    """
    if isinstance(data, Tensor):
        if data.ndim != 2 or data.dtype.is_floating_point:
            raise ValueError(f"token ids must be an integer [B, T] tensor, got {data.dtype} {tuple(data.shape)}")
        mask = torch.ones_like(data) if attention_mask is None else attention_mask
        rows: Iterable[tuple[int, list[Tensor]]] = (
            (index, [row[row_mask != 0][:seq_len]]) for index, (row, row_mask) in enumerate(zip(data.cpu(), mask.cpu())))
    else:
        rows = ((index, _cut(_text_ids(adapter, text), seq_len, adapter)) for index, text in
                enumerate([data] if isinstance(data, str) else data))
    for index, windows in rows:
        for window in windows:
            if origins is not None:
                origins.append(index)
            yield window


def _text_ids(adapter: ModelAdapter, text: object) -> Tensor:
    """The token ids of one text (CPU, no padding)."""
    if not isinstance(text, str):
        raise TypeError(f"texts must be str, got {type(text).__name__}")
    ids, mask = adapter.tokenize([text])
    return ids[0, : int(mask[0].sum())].cpu()


def _cut(row: Tensor, seq_len: int, adapter: ModelAdapter) -> list[Tensor]:
    """A text's ids as windows of at most ``seq_len``: the whole text if it fits, else consecutive pieces,
    each re-starting with the BOS the model put first; a piece shorter than 3 tokens is dropped."""
    if row.numel() <= seq_len:
        return [row]
    bos = getattr(adapter.tokenizer, "bos_token_id", None)
    head = row[:1] if bos is not None and int(row[0]) == bos else row[:0]
    body = row[head.numel():]
    step = seq_len - head.numel()
    pieces = (torch.cat([head, body[start : start + step]]) for start in range(0, body.numel(), step))
    return [window for window in pieces if window.numel() >= 3]


def _micro_batches(adapter, data, seq_len, batch_size, attention_mask,
                   origins: list[int] | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """Right-padded ``(tokens, mask)`` batches of ``batch_size`` windows, made lazily (``origins``: see
    :func:`_windows`)."""
    buffer: list[Tensor] = []
    for window in _windows(adapter, data, seq_len, attention_mask, origins):
        buffer.append(window)
        if len(buffer) == batch_size:
            yield _pad(buffer, adapter)
            buffer = []
    if buffer:
        yield _pad(buffer, adapter)


def _padded_windows(adapter: ModelAdapter, data: Any, seq_len: int, attention_mask: Tensor | None, *,
                    needed: int, origins: list[int] | None = None) -> tuple[Tensor, Tensor]:
    """Right-padded ``(tokens, mask)`` of the first :func:`_windows` of ``data`` that hold ``needed`` positions
    other than each window's first token (or all of them).

    Windows are taken in groups of ``_WINDOW_GROUP``, so a text gives the same windows (and a seeded
    sample of them the same positions) whatever ``needed`` rounds to within a group.
    """
    rows: list[Tensor] = []
    eligible = 0
    for window in _windows(adapter, data, seq_len, attention_mask, origins):
        rows.append(window)
        eligible += window.numel() - 1  # the first token of each window is never sampled
        if len(rows) % _WINDOW_GROUP == 0 and eligible >= needed:
            break
    if not rows:
        raise ValueError("the training text holds no token to train on: pass more text")
    return _pad(rows, adapter)


def _pad(rows: list[Tensor], adapter: ModelAdapter) -> tuple[Tensor, Tensor]:
    width = max(r.numel() for r in rows)
    pad_id = int(getattr(adapter, "pad_token_id", 0) or 0)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : row.numel()] = row
        mask[i, : row.numel()] = 1
    return tokens, mask


def _eligible(mask: Tensor) -> Tensor:
    """Real tokens other than each sequence's first one (BOS / attention sink)."""
    keep = mask != 0
    first = keep.int().argmax(dim=1)
    keep = keep.clone()
    keep[torch.arange(keep.shape[0]), first] = False
    return keep


def _restartable(data: Any) -> bool:
    return isinstance(data, (list, tuple, str, Tensor))


def fast_matmul_dtype(device: torch.device | str) -> torch.dtype | None:
    """bfloat16 where ``device`` multiplies bf16 natively, else ``None`` (float32).

    CUDA with bf16 support, or a CPU with AVX512-BF16 or AMX; an AVX2-only CPU
    emulates bf16 products (much slower than float32; docs/benchmarks.md), so
    float32 is the fast choice there.

    Example:
        >>> fast_matmul_dtype("cpu") in (None, torch.bfloat16)
        True
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu":
        native = [getattr(torch.cpu, name, lambda: False)() for name in
                  ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        return torch.bfloat16 if any(native) else None
    return None


def dtype_name(dtype: torch.dtype | None) -> str:
    """``"bfloat16"`` for ``torch.bfloat16``; ``None`` (no cast) is ``"float32"``."""
    return str(dtype or torch.float32).removeprefix("torch.")


def resolve_matmul_dtype(matmul_dtype: object, device: torch.device | str) -> torch.dtype | None:
    """The training's vocabulary-product dtype: ``"auto"`` -> :func:`fast_matmul_dtype`; float32 -> ``None``."""
    if isinstance(matmul_dtype, str):
        if matmul_dtype != "auto":
            raise ValueError(f"matmul_dtype must be a torch dtype, None or 'auto', got {matmul_dtype!r}")
        return fast_matmul_dtype(device)
    if matmul_dtype is None or matmul_dtype == torch.float32:
        return None
    if matmul_dtype in (torch.bfloat16, torch.float16):
        return matmul_dtype
    raise TypeError(f"matmul_dtype must be 'auto', None, torch.float32, torch.bfloat16 or torch.float16, "
                    f"got {matmul_dtype!r}")


@renamed_keywords(texts="tokens", steps="max_steps")
def train_tuned_lens(
    model: Model,
    tokens,
    *,
    lens: TunedLens | None = None,
    max_steps: int = DEFAULT_STEPS,
    tokens_per_step: int = DEFAULT_TOKENS_PER_STEP,
    seq_len: int = DEFAULT_SEQ_LEN,
    lr: float = 1.0,
    momentum: float = 0.9,
    weight_decay: float = 1e-3,
    clip_grad: float = 1.0,
    matmul_dtype: torch.dtype | str | None = "auto",
    batch_size: int = 8,
    attention_mask: Tensor | None = None,
    progress: bool = True,
) -> TunedLens:
    """Fit the translators of a tuned lens to ``model`` on ``tokens`` by KL distillation.

    Deterministic: windows are read in order and the translators start at zero, so it takes no
    ``seed`` (the same text gives the same lens).

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge`` (frozen; never changed).
        tokens: a list (or any iterable, read lazily) of strings, or ``[B, T]`` token ids.
            A list or tensor is re-read from the start if it runs out (with a
            warning); a one-shot iterator ends training early.
        lens: a lens to continue training (default: a fresh, zero-initialised one).
        max_steps: optimiser steps (the learning rate decays to 0 over them); fewer when the text
            runs out (a one-shot iterator), with a warning.
        tokens_per_step: real tokens (BOS and padding excluded) per step.
        seq_len: tokens per window (long texts are cut into several windows).
        lr: learning rate before the ``(1 - momentum)`` scaling (reference: 1.0).
        momentum: SGD Nesterov momentum (reference: 0.9).
        weight_decay: SGD weight decay (reference: 1e-3).
        clip_grad: gradient-norm clip (reference: 1.0).
        matmul_dtype: dtype of the ``[., d] @ [d, V]`` product in the loss (``None`` = float32;
            ``"auto"`` = bfloat16 where the device runs it natively, else float32;
            see :func:`fast_matmul_dtype`).
        batch_size: windows per forward pass (bounds memory).
        attention_mask: for token ids.
        progress: tqdm bar with the running loss (mean KL over layers, nats).

    Returns:
        the trained :class:`TunedLens`; ``lens.training_info`` holds the budget,
        the per-step losses and the wall time.

    Example:
        >>> lens = train_tuned_lens(model, texts * 4, max_steps=3, tokens_per_step=16, seq_len=8, progress=False)
        >>> lens.training_info["steps"], lens.training_info["tokens_seen"], len(lens.training_info["losses"])
        (3, 48, 3)
        >>> losses = lens.training_info["losses"]
        >>> losses[-1] < losses[0]   # mean KL to the model's output, nats
        True
    """
    adapter = as_adapter(model)
    steps = check_int(max_steps, "max_steps", low=1)
    tokens_per_step = check_int(tokens_per_step, "tokens_per_step", low=1)
    seq_len = check_int(seq_len, "seq_len", low=3)
    batch_size = check_int(batch_size, "batch_size", low=1)
    lr, weight_decay, clip_grad = (check_float(value, name, low=0) for value, name in
                                   ((lr, "lr"), (weight_decay, "weight_decay"), (clip_grad, "clip_grad")))
    momentum = check_float(momentum, "momentum", low=0, high=1, high_open=True)
    lens = _trainable_lens(lens, adapter)
    params = list(lens.translators.parameters())
    opt, schedule = _optimiser(params, lr=lr, momentum=momentum, weight_decay=weight_decay, steps=steps)
    w_u, b_u, matmul_dtype = _unembedding(adapter, matmul_dtype)
    text = _TrainingText(adapter, tokens, seq_len, batch_size, attention_mask)
    losses: list[float] = []
    started = time.perf_counter()
    bar = tqdm(range(steps), desc="tuned lens", disable=not progress, leave=False)
    for _ in bar:
        taken, step_kl = _step_gradients(lens, text, tokens_per_step, w_u, b_u, matmul_dtype)
        if taken == 0 and not losses:
            raise ValueError("the training text holds no token to train on (each sequence's first token is skipped): "
                             "pass more text")
        if taken == 0:
            warnings.warn(f"the text ran out after {len(losses)} of {steps} steps; stopping there", stacklevel=2)
            break
        if clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(params, clip_grad)
        opt.step()
        schedule.step()
        losses.append(float(step_kl.mean()))
        bar.set_postfix(kl=f"{losses[-1]:.3f}")
        if taken < tokens_per_step:
            warnings.warn(f"the text ran out after {len(losses)} of {steps} steps; stopping there", stacklevel=2)
            break
    bar.close()
    if text.restarts:
        warnings.warn(f"the training text was read {text.restarts + 1} times (more steps than text)", stacklevel=2)
    for p in params:
        p.grad = None
    lens.eval()
    lens.training_info = {
        "steps": len(losses), "tokens_per_step": tokens_per_step, "seq_len": seq_len, "batch_size": batch_size,
        "lr": lr, "momentum": momentum, "nesterov": momentum > 0, "weight_decay": weight_decay,
        "clip_grad": clip_grad, "schedule": "linear decay to 0, no warm-up",
        "matmul_dtype": dtype_name(matmul_dtype),
        "tokens_seen": text.n_seen, "text_passes": text.restarts + 1, "losses": losses,
        "seconds": time.perf_counter() - started,
    }
    return lens


def _trainable_lens(lens: object, adapter: ModelAdapter) -> TunedLens:
    """``lens`` (a fresh, zero-initialised one when ``None``), checked to fit ``adapter``, in training mode."""
    lens = TunedLens(adapter) if lens is None else lens
    if not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be a TunedLens, got {type(lens).__name__}")
    check_lens_fits(lens, adapter)
    return lens.train()


def _optimiser(params: list[Tensor], *, lr: float, momentum: float, weight_decay: float,
               steps: int) -> tuple[torch.optim.SGD, torch.optim.lr_scheduler.LambdaLR]:
    """SGD (Nesterov when ``momentum > 0``) at ``lr * (1 - momentum)``, with its lr decayed linearly to 0 over ``steps``.

    PyTorch's momentum scales the step by ``1 / (1 - momentum)``; the factor undoes it (the reference recipe).

    Example:
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> opt, schedule = _optimiser([w], lr=1.0, momentum=0.9, weight_decay=0.0, steps=4)
        >>> round(opt.param_groups[0]["lr"], 6), opt.param_groups[0]["nesterov"]
        (0.1, True)
    """
    opt = torch.optim.SGD(params, lr=lr * (1 - momentum), momentum=momentum, nesterov=momentum > 0,
                          weight_decay=weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1.0 - step / steps))


def _unembedding(adapter: ModelAdapter, matmul_dtype: object) -> tuple[Tensor, Tensor | None, torch.dtype | None]:
    """``(W_U in the product's dtype, b_U, the product's dtype)``; ``None`` is float32 (see :func:`resolve_matmul_dtype`)."""
    w_u = adapter.unembed_matrix("raw")
    matmul_dtype = resolve_matmul_dtype(matmul_dtype, w_u.device)
    w_u = w_u.to(matmul_dtype) if matmul_dtype is not None else w_u.to(torch.float32)
    return w_u, adapter.unembed_bias(), matmul_dtype


class _TrainingText:
    """The training text as micro-batches of windows, re-read from the start when a list, string or tensor
    runs out (``restarts`` counts it); a one-shot iterator, or a text with no token to train on, just ends.

    ``n_seen`` counts the tokens trained on (the caller adds them), which tells an empty text from a short one.
    """

    def __init__(self, adapter: ModelAdapter, texts: Any, seq_len: int, batch_size: int,
                 attention_mask: Tensor | None) -> None:
        self.adapter, self.texts, self.seq_len, self.batch_size = adapter, texts, seq_len, batch_size
        self.attention_mask = attention_mask
        self.batches = self._read()
        self.restarts = 0
        self.n_seen = 0

    def _read(self) -> Iterator[tuple[Tensor, Tensor]]:
        return _micro_batches(self.adapter, self.texts, self.seq_len, self.batch_size, self.attention_mask)

    def next_batch(self) -> tuple[Tensor, Tensor] | None:
        """The next ``(tokens, mask)`` micro-batch, or ``None`` once the text is done."""
        while True:
            try:
                return next(self.batches)
            except StopIteration:
                if not _restartable(self.texts) or (self.n_seen == 0 and self.restarts > 0):
                    return None
                self.restarts += 1
                self.batches = self._read()


def _step_gradients(lens: TunedLens, text: _TrainingText, tokens_per_step: int, w_u: Tensor, b_u: Tensor | None,
                    matmul_dtype: torch.dtype | None) -> tuple[int, Tensor]:
    """One step's gradients in the translators' ``.grad`` (zeroed first) and the per-layer KL ``[L]`` (float64),
    both means over the ``taken <= tokens_per_step`` tokens read; returns ``(taken, kl)``.

    The means are over ``tokens_per_step`` tokens; when the text runs dry mid-step they are rescaled to
    the tokens taken.
    """
    adapter = text.adapter
    params = list(lens.translators.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    step_kl = torch.zeros(adapter.n_layers, dtype=torch.float64)
    taken = 0
    while taken < tokens_per_step:
        batch = text.next_batch()
        if batch is None:
            break
        tokens, mask = batch
        resid, final_logits = residual_stream(adapter, tokens, attention_mask=mask)
        keep = _eligible(mask.to(resid.device))
        b_idx, p_idx = keep.nonzero(as_tuple=True)
        b_idx, p_idx = b_idx[: tokens_per_step - taken], p_idx[: tokens_per_step - taken]
        if b_idx.numel() == 0:
            continue
        taken += b_idx.numel()
        text.n_seen += b_idx.numel()
        states = resid[:, b_idx, p_idx].to(torch.float32)  # [L + 1, n, d], upcast from a bf16/fp16 model
        picked = final_logits[b_idx.to(final_logits.device), p_idx.to(final_logits.device)]
        log_p = torch.log_softmax(picked.to(device=w_u.device, dtype=torch.float32), dim=-1)
        _accumulate(lens, states, log_p, step_kl, tokens_per_step, w_u, b_u, matmul_dtype)
    if 0 < taken < tokens_per_step:  # a one-shot iterator ran dry mid-step: rescale to a mean
        for p in params:
            p.grad.mul_(tokens_per_step / taken)
        step_kl *= tokens_per_step / taken
    return taken, step_kl


def _accumulate(lens, states, log_p, step_kl, tokens_per_step, w_u, b_u, matmul_dtype) -> None:
    """Add ``d/dtheta sum_l sum_rows KL / tokens_per_step`` into the translators' ``.grad``, layer by layer.

    ``KL(p || q) = logsumexp(z) - <p, z> + <p, log p>`` for lens logits ``z``: the
    last term does not depend on the lens and is computed once per micro-batch,
    and the gradient in ``z`` is ``softmax(z) - p`` without forming ``log q``.
    ``torch.autograd.grad`` with the translator parameters as the only inputs
    leaves every model parameter's ``.grad`` untouched.
    """
    n = states.shape[1]
    p = log_p.exp()
    p_log_p = torch.linalg.vecdot(p, log_p)
    for layer in range(lens.n_layers):
        layer_params = list(lens.translators[layer].parameters())
        for start in range(0, n, _ROW_CHUNK):
            rows = slice(start, start + _ROW_CHUNK)
            with torch.enable_grad():
                logits = lens(states[layer, rows], layer, w_u=w_u, b_u=b_u, matmul_dtype=matmul_dtype)
                kl = _kl_of_logits(p[rows], p_log_p[rows], logits)[0].sum()
                grads = torch.autograd.grad(kl / tokens_per_step, layer_params)
            for param, g in zip(layer_params, grads):
                param.grad.add_(g)
            step_kl[layer] += float(kl.detach()) / tokens_per_step
