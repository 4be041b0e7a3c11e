"""Lens quality per layer: KL to the final distribution, cross-entropy, Hit@k.

At sampled token positions (BOS and padding excluded), for every layer
``l = 0..L`` and each lens (``"tuned"``, ``"logit"``):

* ``kl`` — mean ``KL(p_final || p_l)`` (nats), ``p_final`` the model's output;
* ``ce`` — mean cross-entropy of ``p_l`` on the actual next token (positions whose
  next token is real; the last token of a sequence has none);
* ``hit@k`` — the fraction of positions where the model's final top-1 token is
  among the lens's top-``k`` tokens at layer ``l`` (Lombardo et al. 2026);
  ``hit@5/hit@1`` their ratio (NaN where ``hit@1`` is 0).

Example:
    >>> res = evaluate(model, texts, lens=TunedLens(model), n_tokens=24, progress=False)
    >>> res.to_pandas().groupby("lens").size().to_dict()
    {'logit': 3, 'tuned': 3}
"""

from __future__ import annotations

import numbers

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from geolens._renames import renamed_attributes, renamed_keywords
from geolens._sampling import seeded_subset
from geolens._validation import DEFAULT_N_TOKENS, check_int
from geolens.capture import States, capture, prepare_tokens
from geolens.lens.logit_lens import LogitLens
from geolens.lens.train import _KL_ROWS
from geolens.lens.tuned_lens import TunedLens, check_lens_fits
from geolens.model import Model, as_adapter
from geolens import plotting
from geolens.results import Result
from geolens.sites import RESIDUAL_SITE

__all__ = ["EvaluateResult", "evaluate", "hit_at_k", "report_section"]

_ROW_CHUNK = 256


def _check_states_of(states: object, ids: Tensor, n_layers: int) -> None:
    """Raise unless ``states`` holds every layer's residual stream at positions of the token ids ``ids`` ``[B, T]``."""
    if not isinstance(states, States):
        raise TypeError(f"states must be geolens States (from geolens.capture) or None, got {type(states).__name__}")
    if RESIDUAL_SITE not in states or states[RESIDUAL_SITE].shape[0] != n_layers + 1:
        raise ValueError(f"states must hold {RESIDUAL_SITE!r} at all {n_layers + 1} layers (0..L); captured: "
                         f"{ {site: tuple(states[site].shape) for site in states.sites} }")
    rows, position = states.batch_index.cpu(), states.position.cpu()
    inside = (rows < ids.shape[0]) & (position < ids.shape[1])
    if not bool(inside.all()) or not torch.equal(ids[rows, position], states.token_ids.cpu()):
        raise ValueError("states were not captured from these tokens: their token ids differ at their positions "
                         "(capture them from the same text, max_length and attention_mask)")


def hit_at_k(logits: Float[Tensor, "N V"], target: Int[Tensor, "N"], k: int) -> Float[Tensor, "N"]:
    """1.0 where ``target`` is among the ``k`` largest ``logits`` of its row, else 0.0.

    Ties at the k-th value count as hits (``target``'s logit >= the k-th largest).

    Example:
        >>> hit_at_k(torch.tensor([[0.1, 0.5, 0.4], [0.9, 0.0, 0.1]]), torch.tensor([2, 1]), 2)
        tensor([1., 0.])
    """
    if logits.ndim != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"need logits [N, V] and target [N], got {tuple(logits.shape)} and {tuple(target.shape)}")
    k = check_int(k, "k", low=1, high=logits.shape[-1])
    return _hits(logits, target, (k,))[0]


def _hits(logits: Tensor, target: Tensor, ks: Sequence[int]) -> Tensor:
    """``[len(ks), N]``: :func:`hit_at_k` for every ``k`` from one top-k of the largest."""
    kth = logits.topk(max(ks), dim=-1).values  # the k-th largest logit of each row, for every k
    target_logit = logits.gather(1, target.view(-1, 1))
    return (target_logit >= kth[:, [k - 1 for k in ks]]).T.to(torch.float32)


@dataclass(repr=False)
class EvaluateResult(Result):
    """Lens quality per (lens, layer): ``lens, layer, kl, ce, hit@k...`` and ``hit@5/hit@1``."""

    title: ClassVar[str] = "EvaluateResult"

    def plot(self):
        """Plotly figure: Hit@k by layer (left) and KL to the final distribution (right), both lenses."""
        return plotting.lens_figure(self.to_pandas(), title=self._summary())


@renamed_keywords(ks="top_k")
def evaluate(
    model: Model,
    tokens,
    *,
    lens: TunedLens | None = None,
    top_k: int | Sequence[int] = (1, 5),
    states: States | None = None,
    n_tokens: int | None = DEFAULT_N_TOKENS,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: Tensor | None = None,
    progress: bool = True,
) -> EvaluateResult:
    """KL, cross-entropy and Hit@k of the logit lens (and a tuned lens) at every layer ``0..L``.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge``.
        tokens: text, list of texts, or ``[B, T]`` token ids.
        lens: a :class:`TunedLens` for ``model`` to score next to the logit lens;
            ``None`` scores the logit lens only.
        top_k: the ``k`` of Hit@k, one int or several (1 and 5 give the ``hit@5/hit@1`` column).
        states: states already captured from ``tokens`` (prepared with the same
            ``max_length`` and ``attention_mask``) with the residual stream of every layer,
            e.g. the :class:`~geolens.capture.States` another analysis used: scored without a
            forward pass, all their rows or, if ``n_tokens`` is fewer, a sample of ``n_tokens``
            of them seeded by ``seed``. Their token ids must be those of ``tokens`` at their positions.
        n_tokens: positions sampled (seeded, BOS and padding excluded); an upper
            bound, ``None`` = all.
        seed: seed of the sample.
        batch_size: texts per forward pass.
        max_length: truncation of each text, in tokens (``None``: whole texts).
        attention_mask: mask of a token-id tensor.
        progress: show a progress bar.

    Returns:
        :class:`EvaluateResult`, rows ``lens, layer, kl, ce, hit@1, hit@5, hit@5/hit@1``
        (``"tuned"`` rows first when a lens is given). See docs/methods.md §C.

    Example:
        >>> evaluate(model, texts, n_tokens=16, progress=False).to_pandas().columns.tolist()
        ['lens', 'layer', 'kl', 'ce', 'hit@1', 'hit@5', 'hit@5/hit@1']
    """
    if isinstance(model, LogitLens):
        raise TypeError("evaluate(model, tokens, lens=lens): the model comes first and the lens is a keyword "
                        "(the order evaluate(lens, model, tokens) was removed in geolens 0.2)")
    adapter = as_adapter(model)
    ks = sorted({check_int(k, "top_k", low=1, high=adapter.d_vocab)
                 for k in ([top_k] if isinstance(top_k, numbers.Integral) else top_k)})
    if not ks:
        raise ValueError("top_k is empty")
    lenses = _lenses(adapter, lens)
    batch = prepare_tokens(adapter, tokens, attention_mask, max_length)
    if states is None:
        states = capture(adapter, batch.tokens, sites=(RESIDUAL_SITE,), n_tokens=n_tokens, seed=seed,
                         batch_size=batch_size, progress=progress, attention_mask=batch.attention_mask)
        keep: slice | Tensor = slice(None)
    else:
        _check_states_of(states, batch.tokens.cpu(), adapter.n_layers)
        keep = _subsample(states.n_tokens, n_tokens, seed)
    resid = states[RESIDUAL_SITE]
    resid = resid[:, keep.to(resid.device) if torch.is_tensor(keep) else keep]
    next_ids, has_next = _next_tokens(batch.tokens.cpu(), batch.attention_mask.cpu(), states.batch_index.cpu()[keep],
                                      states.position.cpu()[keep])
    sums = _sums(adapter, lenses, resid, next_ids, has_next, ks, progress=progress)
    n, n_valid = resid.shape[1], int(has_next.sum())
    params = {"model": adapter.name, "n_tokens": n, "n_tokens_with_next": n_valid, "seed": seed, "ks": ks,
              "lenses": [lz.kind for lz in lenses], "n_layers": adapter.n_layers}
    if lens is not None:
        # How the lens was fitted; its loss curve and refinement history stay with the lens (its figure, its folder).
        params["training"] = {k: v for k, v in lens.training_info.items() if k not in ("losses", "history")}
    return EvaluateResult(rows=_rows(sums, n, n_valid, ks), params=params)


def _lenses(adapter, lens: object) -> list[LogitLens]:
    """The lenses to score: ``lens`` (a :class:`TunedLens` of the model's shape), if given, then the logit lens."""
    lenses: list[LogitLens] = []
    if lens is not None:
        if not isinstance(lens, TunedLens):
            raise TypeError(f"lens must be a TunedLens or None, got {type(lens).__name__}")
        check_lens_fits(lens, adapter)
        lenses.append(lens)
    lenses.append(LogitLens(adapter))
    return lenses


def _subsample(available: int, n_tokens: int | None, seed: int) -> slice | Tensor:
    """The rows of given states to score: a seeded sample of ``n_tokens`` of the ``available`` (in their
    order), or all of them."""
    if n_tokens is None or check_int(n_tokens, "n_tokens", low=1) >= available:
        return slice(None)
    return seeded_subset(available, n_tokens, seed)


def _next_tokens(ids: Tensor, mask: Tensor, rows_b: Tensor, position: Tensor) -> tuple[Tensor, Tensor]:
    """``(next token id [N], has_next [N])`` of the positions ``(rows_b, position)`` in the token ids ``ids``
    ``[B, T]`` with ``mask`` (CPU); one whose next position is padding or past the end has none (its id is 0)."""
    next_pos = position + 1
    in_range = next_pos < ids.shape[1]
    next_pos = next_pos.clamp(max=ids.shape[1] - 1)
    has_next = in_range & (mask[rows_b, next_pos] != 0)
    next_ids = torch.where(has_next, ids[rows_b, next_pos], torch.zeros_like(next_pos))
    if not bool(has_next.any()):
        raise ValueError("no sampled position has a next token; pass longer sequences")
    return next_ids, has_next


def _sums(adapter, lenses: list[LogitLens], resid: Tensor, next_ids: Tensor, has_next: Tensor, ks: list[int], *,
          progress: bool) -> dict[tuple[str, int], Tensor]:
    """Per (lens, layer): the sums over the rows of ``resid`` ``[L + 1, N, d]`` of KL, cross-entropy (rows with a
    next token) and each Hit@k, ``[2 + len(ks)]`` float64, accumulated in chunks of rows."""
    w_u, b_u = adapter.unembed_matrix("raw"), adapter.unembed_bias()
    n = resid.shape[1]
    sums = {(lz.kind, l): torch.zeros(2 + len(ks), dtype=torch.float64) for lz in lenses for l in range(adapter.n_layers + 1)}
    bar = tqdm(total=-(-n // _ROW_CHUNK), desc="lens eval", disable=not progress, leave=False)
    with torch.no_grad():
        for start in range(0, n, _ROW_CHUNK):
            rows = slice(start, start + _ROW_CHUNK)
            _add_chunk(sums, lenses, resid[:, rows], next_ids[rows], has_next[rows], ks, w_u, b_u)
            bar.update()
    bar.close()
    return sums


def _add_chunk(sums: dict[tuple[str, int], Tensor], lenses: list[LogitLens], resid: Tensor, next_ids: Tensor,
               has_next: Tensor, ks: list[int], w_u: Tensor, b_u: Tensor | None) -> None:
    """Add one chunk of rows (``resid`` ``[L + 1, n, d]``) to ``sums`` (see :func:`_sums`)."""
    n_layers = resid.shape[0] - 1
    final_logits = lenses[-1](resid[-1], n_layers, w_u=w_u, b_u=b_u)
    log_p = torch.log_softmax(final_logits.to(torch.float32), dim=-1)
    p = log_p.exp()
    neg_entropy = torch.linalg.vecdot(p, log_p)  # sum p log p, once per chunk
    top1 = final_logits.argmax(-1)
    target, valid = next_ids.to(final_logits.device), has_next.to(final_logits.device)
    for lz in lenses:
        for layer in range(n_layers + 1):
            # Every lens reads the last layer as the model does: its logits are the final ones.
            logits = final_logits if layer == n_layers else lz(resid[layer], layer, w_u=w_u, b_u=b_u)
            kl, ce = _kl_and_cross_entropy(p, neg_entropy, logits, target)
            if not bool(torch.isfinite(kl).all()):  # a NaN or infinite logit makes its row's KL so
                raise ValueError(f"the {lz.kind} lens gives NaN or infinite logits at layer {layer}; "
                                 "KL and Hit@k would be meaningless (check the lens's weights)")
            acc = sums[(lz.kind, layer)]
            acc[0] += float(kl.sum())
            acc[1] += float(ce[valid].sum())
            acc[2:] += _hits(logits, top1, ks).sum(dim=1, dtype=torch.float64).cpu()


def _kl_and_cross_entropy(p: Tensor, neg_entropy: Tensor, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Per row, ``KL(p || q) = sum p log p - sum p log q`` and the cross-entropy ``-log q[target]`` of
    ``q = softmax(logits)``: one log-softmax and one dot a row, a few rows at a time (the evaluation is
    memory-bound: each block's passes then stay in cache). From ``log q`` itself, not from
    :func:`~geolens.lens.train._kl_of_logits`'s ``logsumexp - <p, z>``: the cross-entropy reads ``log q``, and
    at the last layer (``q = p``, the same log-softmax as ``neg_entropy``'s) the KL comes out exactly 0."""
    kl = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    ce = torch.empty_like(kl)
    for start in range(0, logits.shape[0], _KL_ROWS):
        rows = slice(start, start + _KL_ROWS)
        log_q = torch.log_softmax(logits[rows].to(torch.float32), dim=-1)
        kl[rows] = neg_entropy[rows] - torch.linalg.vecdot(p[rows], log_q)
        ce[rows] = -log_q.gather(1, target[rows].view(-1, 1)).squeeze(1)
    return kl, ce


def _rows(sums: dict[tuple[str, int], Tensor], n: int, n_valid: int, ks: list[int]) -> list[dict[str, object]]:
    """The result's rows from :func:`_sums`: means over the ``n`` rows (cross-entropy: the ``n_valid`` with a next token)."""
    result_rows = []
    for (kind, layer), acc in sums.items():
        row = {"lens": kind, "layer": layer, "kl": float(acc[0]) / n, "ce": float(acc[1]) / n_valid}
        for j, k in enumerate(ks):
            row[f"hit@{k}"] = float(acc[2 + j]) / n
        if 1 in ks and 5 in ks:
            row["hit@5/hit@1"] = row["hit@5"] / row["hit@1"] if row["hit@1"] > 0 else float("nan")
        result_rows.append(row)
    return result_rows


def report_section(run: Any, needed: Mapping[str, Any]) -> tuple[EvaluateResult, list[Any]]:
    """The report's lens section (its record in geolens.analyses.registry points here): the run's tuned lens,
    evaluated on the run's texts cut to ``max_length`` like every other section, at the positions the other
    sections captured."""
    s = run.settings
    lens = run.lens()
    result = evaluate(run.adapter, run.texts, lens=lens, n_tokens=min(s.lens_n_tokens, s.n_tokens), seed=s.seed,
                      progress=s.progress, max_length=s.max_length, states=run.states())
    # evaluate() records how the lens was fitted, its budget included (params["training"]); the report adds
    # where the lens is and how many texts it was fitted on, and nothing twice.
    result.params.update(lens_dir=lens.cache_dir, n_lens_texts=len(run.lens_texts()))
    return result, [result.plot(), lens.plot_history()]
__getattr__ = renamed_attributes(__name__, {"LensResult": "EvaluateResult"})  # 0.3.0 names answer with the new
