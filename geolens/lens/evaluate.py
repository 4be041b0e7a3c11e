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
    >>> res = evaluate(lens, model, geolens.default_texts(n=16), n_tokens=512)   # doctest: +SKIP
    >>> res.plot()                                                               # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from geolens._validation import check_int
from geolens.capture import capture, prepare_tokens
from geolens.lens.logit_lens import LogitLens
from geolens.lens.train import DEFAULT_SEQ_LEN, kl_rows
from geolens.lens.tuned_lens import TunedLens
from geolens.model import as_adapter
from geolens.results import Result

__all__ = ["LensResult", "evaluate", "hit_at_k", "lens_figure", "lens_report_sections", "REPORT_BUDGET"]

_ROW_CHUNK = 256
REPORT_BUDGET = {"steps": 25, "tokens_per_step": 128, "seq_len": DEFAULT_SEQ_LEN, "n_train_texts": 200, "seed": 0}


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
    kth = logits.topk(k, dim=-1).values[:, -1]
    return (logits.gather(1, target.view(-1, 1)).squeeze(1) >= kth).to(torch.float32)


@dataclass(repr=False)
class LensResult(Result):
    """Lens quality per (lens, layer): ``lens, layer, kl, ce, hit@k...`` and ``hit@5/hit@1``."""

    title: ClassVar[str] = "LensResult"

    def plot(self):
        """Plotly figure: Hit@k by layer (left) and KL to the final distribution (right), both lenses."""
        return lens_figure(self.to_pandas(), title=self._summary())


def evaluate(
    lens: TunedLens | None,
    model: object,
    tokens,
    ks: Sequence[int] = (1, 5),
    n_tokens: int | None = 1024,
    seed: int | None = 0,
    progress: bool = True,
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: Tensor | None = None,
) -> LensResult:
    """KL, cross-entropy and Hit@k of the tuned lens and the logit lens at every layer ``0..L``.

    Args:
        lens: a :class:`TunedLens` for ``model``, or ``None`` for the logit lens only.
        model: ``HookedTransformer`` or ``TransformerBridge``.
        tokens: text, list of texts, or ``[B, T]`` token ids.
        ks: the ``k`` of Hit@k (must include 1 and 5 for the ``hit@5/hit@1`` column).
        n_tokens: positions sampled (seeded, BOS and padding excluded); ``None`` = all.
        seed: seed of the sample.
        progress: show a progress bar.

    Returns:
        :class:`LensResult`, rows ``lens, layer, kl, ce, hit@1, hit@5, hit@5/hit@1``
        (``"tuned"`` rows first when a lens is given).

    Example:
        >>> evaluate(None, model, texts, n_tokens=256).to_pandas()   # doctest: +SKIP
    """
    adapter = as_adapter(model)
    ks = sorted({check_int(k, "k", low=1, high=adapter.d_vocab) for k in ks})
    if not ks:
        raise ValueError("ks is empty")
    lenses: list[LogitLens] = []
    if lens is not None:
        if not isinstance(lens, TunedLens):
            raise TypeError(f"lens must be a TunedLens or None, got {type(lens).__name__}")
        if (lens.n_layers, lens.d_model, lens.d_vocab) != (adapter.n_layers, adapter.d_model, adapter.d_vocab):
            raise ValueError("the lens was made for another model shape")
        lenses.append(lens)
    lenses.append(LogitLens(adapter))

    batch = prepare_tokens(adapter, tokens, attention_mask, max_length)
    states = capture(adapter, batch.tokens, sites=("resid_post",), n_tokens=n_tokens, seed=seed,
                     batch_size=batch_size, progress=progress, attention_mask=batch.attention_mask)
    resid = states["resid_post"]  # [L + 1, N, d]
    ids, mask = batch.tokens.cpu(), batch.attention_mask.cpu()
    next_pos = states.position.cpu() + 1
    rows_b = states.batch_index.cpu()
    in_range = next_pos < ids.shape[1]
    next_pos = next_pos.clamp(max=ids.shape[1] - 1)
    has_next = in_range & (mask[rows_b, next_pos] != 0)
    next_ids = torch.where(has_next, ids[rows_b, next_pos], torch.zeros_like(next_pos))
    if not bool(has_next.any()):
        raise ValueError("no sampled position has a next token; pass longer sequences")

    w_u, b_u = adapter.unembed_matrix("raw"), adapter.unembed_bias()
    n = resid.shape[1]
    sums = {(lz.kind, l): torch.zeros(2 + len(ks), dtype=torch.float64) for lz in lenses for l in range(adapter.n_layers + 1)}
    bar = tqdm(total=-(-n // _ROW_CHUNK), desc="lens eval", disable=not progress, leave=False)
    with torch.no_grad():
        for start in range(0, n, _ROW_CHUNK):
            rows = slice(start, start + _ROW_CHUNK)
            final_logits = lenses[-1](resid[-1, rows], adapter.n_layers, w_u=w_u, b_u=b_u)
            log_p = torch.log_softmax(final_logits, dim=-1)
            top1 = final_logits.argmax(-1)
            target, valid = next_ids[rows].to(final_logits.device), has_next[rows].to(final_logits.device)
            for lz in lenses:
                for layer in range(adapter.n_layers + 1):
                    logits = lz(resid[layer, rows], layer, w_u=w_u, b_u=b_u)
                    ce = torch.nn.functional.cross_entropy(logits, target, reduction="none")
                    acc = sums[(lz.kind, layer)]
                    acc[0] += float(kl_rows(log_p, logits).sum())
                    acc[1] += float(ce[valid].sum())
                    for j, k in enumerate(ks):
                        acc[2 + j] += float(hit_at_k(logits, top1, k).sum())
            bar.update()
    bar.close()

    n_valid = int(has_next.sum())
    result_rows = []
    for (kind, layer), acc in sums.items():
        row = {"lens": kind, "layer": layer, "kl": float(acc[0]) / n, "ce": float(acc[1]) / n_valid}
        for j, k in enumerate(ks):
            row[f"hit@{k}"] = float(acc[2 + j]) / n
        if 1 in ks and 5 in ks:
            row["hit@5/hit@1"] = row["hit@5"] / row["hit@1"] if row["hit@1"] > 0 else float("nan")
        result_rows.append(row)
    params = {"model": adapter.name, "n_tokens": n, "n_tokens_with_next": n_valid, "seed": seed, "ks": ks,
              "lenses": [lz.kind for lz in lenses], "n_layers": adapter.n_layers}
    if lens is not None:
        params["training"] = {k: v for k, v in lens.training_info.items() if k != "losses"}
    return LensResult(rows=result_rows, params=params)


def lens_figure(table, *, title: str = ""):
    """Hit@k by layer (left) and KL by layer (right), one line per lens (and k)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Hit@k (final top-1 in lens top-k)", "KL(p_final || p_l)"))
    hit_cols = [c for c in table.columns if c.startswith("hit@") and "/" not in c]
    dashes = {"tuned": "solid", "logit": "dot"}
    for kind, part in table.groupby("lens", sort=False):
        part = part.sort_values("layer")
        for col in hit_cols:
            fig.add_trace(go.Scatter(x=part["layer"], y=part[col], mode="lines+markers", name=f"{kind} {col}",
                                     line_dash=dashes.get(kind, "solid")), row=1, col=1)
        fig.add_trace(go.Scatter(x=part["layer"], y=part["kl"], mode="lines+markers", name=f"{kind} KL",
                                 line_dash=dashes.get(kind, "solid")), row=1, col=2)
    fig.update_xaxes(title_text="layer (0 = embeddings)")
    fig.update_yaxes(title_text="fraction", row=1, col=1)
    fig.update_yaxes(title_text="nats", row=1, col=2)
    fig.update_layout(title=f"Logit lens vs tuned lens — {title}" if title else "Logit lens vs tuned lens",
                      template="plotly_white")
    return fig


# ---------------------------------------------------------------------- report
def _default_cache_dir() -> Path:
    from geolens.zoo.default import cache_root

    return cache_root() / "tuned_lens"


def _cache_key(adapter, budget: dict) -> str:
    shape = {"model": adapter.name, "n_layers": adapter.n_layers, "d_model": adapter.d_model,
             "d_vocab": adapter.d_vocab, **budget}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
    base = Path(adapter.name).name or adapter.name  # a local path names the model by its folder
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)
    return f"{safe}-L{adapter.n_layers}-d{adapter.d_model}-V{adapter.d_vocab}-{digest}"


def cached_tuned_lens(
    model: object,
    held_out_texts=None,
    cache_dir: str | Path | None = None,
    *,
    train_texts: Sequence[str] | None = None,
    seed: int = 0,
    progress: bool = True,
    **budget,
) -> TunedLens:
    """A small-budget tuned lens for ``model``: loaded from the cache, else trained once and saved.

    Trained on ``train_texts`` (default: default-corpus articles not in
    ``held_out_texts``, shuffled) with :data:`REPORT_BUDGET` (override with
    ``steps=``, ``tokens_per_step=``, ``seq_len=``, ``n_train_texts=``), saved under
    ``cache_dir`` (default ``$GEOLENS_CACHE/tuned_lens`` or
    ``~/.cache/geolens/tuned_lens``) in a folder keyed by model name, shape and
    budget; ``lens.cache_dir`` says where.

    Example:
        >>> lens = cached_tuned_lens(model, steps=10)      # doctest: +SKIP
    """
    from geolens.lens.train import train_tuned_lens

    adapter = as_adapter(model)
    unknown = set(budget) - set(REPORT_BUDGET)
    if unknown:
        raise TypeError(f"unknown budget keys {sorted(unknown)}; choose from {sorted(REPORT_BUDGET)}")
    plan = {**REPORT_BUDGET, **budget, "seed": seed}
    if train_texts is not None:
        train_texts = list(train_texts)
        plan["train_texts_sha"] = hashlib.sha256("\x00".join(train_texts).encode()).hexdigest()[:12]
    folder = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    folder = folder / _cache_key(adapter, plan)
    try:
        lens = TunedLens.load(folder, adapter)
    except FileNotFoundError:
        if train_texts is None:
            from geolens.zoo import default_texts

            held_out = set(held_out_texts) if isinstance(held_out_texts, (list, tuple)) else set()
            pool = [t for t in default_texts(n=None) if t not in held_out]
            random.Random(seed).shuffle(pool)
            train_texts = pool[: plan["n_train_texts"]]
        lens = train_tuned_lens(adapter, train_texts, steps=plan["steps"], tokens_per_step=plan["tokens_per_step"],
                                seq_len=plan["seq_len"], progress=progress)
        lens.save(folder)
    lens.cache_dir = str(folder)
    return lens


def lens_report_sections(
    model: object,
    texts,
    cache_dir: str | Path | None = None,
    *,
    train_texts: Sequence[str] | None = None,
    n_tokens: int | None = 1024,
    seed: int = 0,
    progress: bool = True,
    **budget,
):
    """The updates and lens-quality results for a report, with a small tuned lens trained once and cached.

    The lens comes from :func:`cached_tuned_lens` (trained on default-corpus
    articles not in ``texts`` unless ``train_texts`` is given); a later call
    loads it instead of training.

    Returns:
        ``(updates_result, lens_result)``: an
        :class:`~geolens.analyses.updates.UpdatesResult` and a :class:`LensResult`.

    Example:
        >>> upd, lens_res = lens_report_sections(model, geolens.default_texts(n=32))   # doctest: +SKIP
    """
    from geolens.analyses.updates import updates

    adapter = as_adapter(model)
    lens = cached_tuned_lens(adapter, texts, cache_dir, train_texts=train_texts, seed=seed, progress=progress,
                             **budget)
    upd = updates(adapter, texts, n_tokens=n_tokens, seed=seed, progress=progress)
    quality = evaluate(lens, adapter, texts, n_tokens=n_tokens, seed=seed, progress=progress)
    quality.params["lens_dir"] = lens.cache_dir
    return upd, quality
